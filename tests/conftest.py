"""Test tiers share fixtures from tests/fixtures/: every module there is a
pytest plugin, so each tier's fixtures live in a file of their own."""

import os
import signal
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


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    """Back after every test: code a test runs in this process may take SIGTERM
    for itself (the trainer's preemption flag does), and a SIGTERM sent then is
    lost; dev/test-tiers.sh sends it again until the session ends."""
    if not _stopping and signal.getsignal(signal.SIGTERM) is not _interrupted:
        signal.signal(signal.SIGTERM, _interrupted)


_session_pid = 0
_stopping = False


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
