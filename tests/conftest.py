"""Test tiers share fixtures from tests/fixtures/: every module there is a
pytest plugin, so each tier's fixtures live in a file of their own."""

import atexit
import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType

import pytest

pytest_plugins = sorted(
    f"tests.fixtures.{p.stem}"
    for p in (Path(__file__).parent / "fixtures").glob("*.py")
    if p.stem != "__init__"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``after_every_other_test`` go last, in their own order."""
    last = [item for item in items if item.get_closest_marker("after_every_other_test")]
    if last:
        items[:] = [item for item in items if item not in last] + last


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM ends the session as Ctrl-C does, finalizers and all, so a killed
    run (dev/test-tiers.sh passes its interrupt on this way) stops the clusters,
    node agents and operators its fixtures started instead of orphaning them."""
    global _session_pid
    _session_pid = os.getpid()
    signal.signal(signal.SIGTERM, _interrupted)
    atexit.register(_exit_before_teardown)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _exit_status
    _exit_status = int(session.exitstatus)


def _exit_before_teardown() -> None:
    """The session's process ends here, its verdict written, once the exit
    handlers registered after this one have run (atexit runs them in reverse:
    torch's, multiprocessing's, inductor's workers' shutdown), and skips the
    interpreter's teardown of modules and C++ statics. The local tiers' process
    has run torch in-process for a quarter of an hour by then, its native
    threads (OpenMP, gloo, the compile workers' pools) still about, and once
    it died of SIGSEGV there after every test had passed and the summary was
    printed (exit 139, CI red with nothing to read). A crash in a test or in a
    handler still shows: PYTHONFAULTHANDLER (dev/test-tiers.sh) prints it."""
    if os.getpid() != _session_pid or _exit_status is None:
        return  # a forked child, or a session that never finished: Python's own exit
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_exit_status)


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    """Back after every test: code a test runs in this process may take SIGTERM
    for itself (the trainer's preemption flag does), and a SIGTERM sent then is
    lost; dev/test-tiers.sh sends it again until the session ends."""
    if not _stopping and signal.getsignal(signal.SIGTERM) is not _interrupted:
        signal.signal(signal.SIGTERM, _interrupted)


_session_pid = 0
_stopping = False
_exit_status: int | None = None


def _interrupted(signum: int, frame: FrameType | None) -> None:
    if os.getpid() != _session_pid:
        # A forked child (multiprocessing) inherited this handler: it dies of
        # the signal as it would have without it.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    global _stopping
    _stopping = True
    # Once: the teardown that follows runs undisturbed by the repeats.
    signal.signal(signum, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")
