"""Test tiers share fixtures from tests/fixtures/: every module there is a
pytest plugin, so each tier's fixtures live in a file of their own.

No test leaves files outside pytest's own folders: each test runs with a
TMPDIR of its own beside its tmp_path (so do the processes it starts), and the
session, whose wider-scoped fixtures start processes with the session's own
TMPDIR, fails at the end naming what is left in that one, and after which test
each entry was first seen.
"""

import atexit
import getpass
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
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
    _take_tmpdir()


def _take_tmpdir() -> None:
    """TMPDIR for the session and everything it starts: a folder of its own
    (the three sessions of `make test` and a demo run side by side), so what is
    left there at the end is this session's. pytest's tmp_path folders stay
    where pytest keeps them, kept for reading after a run; inductor's compile
    cache stays where torch puts it by default, kept from run to run."""
    global _session_tmp
    machine_tmp = tempfile.gettempdir()
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", machine_tmp)
    os.environ.setdefault(
        "TORCHINDUCTOR_CACHE_DIR", os.path.join(machine_tmp, f"torchinductor_{getpass.getuser()}")
    )
    _session_tmp = Path(tempfile.mkdtemp(prefix="torchfleet-tests-"))
    os.environ["TMPDIR"] = str(_session_tmp)
    tempfile.tempdir = None  # gettempdir() keeps its first answer otherwise


@pytest.fixture(autouse=True)
def _test_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Each test's TMPDIR, and that of every process it starts: a folder of
    pytest's own beside the tmp_path folders, kept and pruned with them. What a
    process the test kills leaves there (multiprocessing's pymp-*, torchelastic's
    folders), as a container's /tmp keeps it, is the test's and goes with its
    folders. Fixtures of a wider scope start their processes with the session's
    TMPDIR, which the session checks at its end."""
    folder = tmp_path_factory.mktemp("tmpdir")
    session = os.environ["TMPDIR"]
    os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = None
    try:
        yield
    finally:
        os.environ["TMPDIR"] = session
        tempfile.tempdir = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> object:
    """Which test an entry of the session's TMPDIR was first seen after: what a
    failed leftovers check names (a process a test started may write later,
    so the test named is the first suspect, not a proof)."""
    result = yield
    if _session_tmp is not None:
        for entry in os.listdir(_session_tmp):
            _first_seen.setdefault(entry, item.nodeid)
    return result


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _exit_status
    _left.extend(_leftovers())  # every fixture has stopped what it started by now
    if _left and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    _exit_status = int(session.exitstatus)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The leftovers, just above the summary's last line (which counts tests
    only: this is why a session of passed tests exits 1)."""
    if _left:
        terminalreporter.section("files left behind", red=True, bold=True)
        terminalreporter.write_line(
            "left in the session's TMPDIR, outside every test's tmp_path (removed now):"
        )
        for entry, test in _left:
            terminalreporter.write_line(f"  {entry} (first seen after {test})")


def _leftovers() -> list[tuple[str, str]]:
    """What is left in the session's TMPDIR, each with the test it was first
    seen after; the folder is removed either way."""
    if _session_tmp is None or os.getpid() != _session_pid:
        return []
    left = sorted(os.listdir(_session_tmp))
    shutil.rmtree(_session_tmp, ignore_errors=True)
    return [(entry, _first_seen.get(entry, "the last test")) for entry in left]


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
_session_tmp: Path | None = None
_first_seen: dict[str, str] = {}
_left: list[tuple[str, str]] = []


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
