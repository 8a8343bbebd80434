"""Drives ``torchfleet-train`` as a real process and reads its JSON lines live."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from queue import Empty, Queue
from typing import Any

from tests.fixtures.poll import wait_for
from tests.fixtures.trainer import trainer_env
from torchfleet_trainer.launcher import procname


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TrainerProcess:
    """``python -m torchfleet_trainer.main`` in its own session, stdout parsed as events."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str] | None = None,
        cpus: set[int] | None = None,
        preexec: Callable[[], None] | None = None,
    ) -> None:
        full_env = trainer_env()
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torchfleet_trainer.main", *args],
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=preexec,  # e.g. joining a cgroup before it runs anything
        )
        if cpus:
            # Before the interpreter has started a thread: every thread it starts
            # (torch's, gloo's) inherits the main thread's cores.
            os.sched_setaffinity(self.proc.pid, cpus)
        self.events: list[dict[str, Any]] = []
        self._queue: Queue[dict[str, Any] | None] = Queue()
        self._stderr_lines: list[str] = []
        threading.Thread(target=self._read_stdout, daemon=True).start()
        self._stderr_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._stderr_reader.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                with_event = json.loads(line)
                self._queue.put(with_event)
        self._queue.put(None)

    def _read_stderr(self) -> None:
        """Line by line, so that a test can wait on what the launcher says."""
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr_lines.append(line)

    @property
    def stderr(self) -> str:
        """What the process has written to stderr so far."""
        return "".join(self._stderr_lines)

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float
    ) -> dict[str, Any]:
        """The first (new) event satisfying ``predicate``."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no matching event in {timeout}s; got {self.events[-5:]}")
            try:
                event = self._queue.get(timeout=remaining)
            except Empty:
                continue
            if event is None:
                raise AssertionError(
                    f"trainer exited ({self.proc.poll()}) first; stderr:\n{self.stderr[-4000:]}"
                )
            self.events.append(event)
            if predicate(event):
                return event

    def drain(self) -> None:
        """Moves the events read so far into ``events``, without waiting."""
        while True:
            try:
                event = self._queue.get_nowait()
            except Empty:
                return
            if event is None:
                self._queue.put(None)  # finish() still waits for the end
                return
            self.events.append(event)

    def kill(self) -> None:
        """SIGKILLs the launcher and everything it started, then reaps it. Its
        forkserver and the workers forked from it have a session of their own
        (forkserver.py): killing the launcher's process group alone left them
        training on, gang and all, for the rest of the test run. The log
        copiers are left to drain: they end once no process writes to them."""
        tree = [pid for pid in descendants(self.proc.pid) if not is_log_copier(pid)]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait()

    def finish(self, timeout: float) -> int:
        """Waits for exit, collecting the remaining events; kills it all on timeout."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"trainer still running after {timeout}s") from None
        while (event := self._queue.get(timeout=10)) is not None:
            self.events.append(event)
        # The whole of stderr: its end comes when the last process holding it
        # (the launcher's forkserver) is gone, a moment after the launcher.
        self._stderr_reader.join(timeout=60)
        return code

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]


def worker_pid(launcher: TrainerProcess) -> int:
    """The training process the launcher's agent started: forked from the
    launcher's forkserver, it named itself after its rank (procname.py)."""
    pid = launcher.proc.pid
    for child in children(pid):
        for grandchild in children(child):
            if procname.rank_of(grandchild) is not None:
                return grandchild
    raise AssertionError(f"launcher {pid} has no worker")


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:  # exited meanwhile
        return []


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, children first."""
    found: list[int] = []
    for child in children(pid):
        found += [child, *descendants(child)]
    return found


def is_log_copier(pid: int) -> bool:
    try:
        return b"launcher.logtee" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def pending_signals(pid: int) -> set[signal.Signals]:
    """The signals sent to ``pid`` that it has not handled yet (it is stopped)."""
    mask = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")):
            mask |= int(line.split()[1], 16)
    return {sig for sig in signal.Signals if mask >> (sig - 1) & 1}


# The system call of time.sleep, in which torch's elastic agent spends the time
# between two looks at its workers (monitor_interval).
_CLOCK_NANOSLEEP = {"x86_64": 230, "aarch64": 115}


def stop_between_looks(agent: int) -> None:
    """SIGSTOPs a launcher while its agent sleeps between two looks at its
    workers, so that the first thing it does when continued is a fresh look
    (its workers' exits first, then the rendezvous). Stopped anywhere else (in
    the middle of a look, having seen its workers healthy and not yet asked the
    rendezvous), it would go on from there; it is then let go and tried again."""
    sleeping = _CLOCK_NANOSLEEP[platform.machine()]

    def stopped_asleep() -> bool:
        os.kill(agent, signal.SIGSTOP)
        wait_for("the agent stopped", lambda: _state(agent) == "T", timeout=30, interval=0.005)
        # The main thread's system call, kept while the signal stop interrupts it.
        call = Path(f"/proc/{agent}/task/{agent}/syscall").read_text().split()[0]
        if call == str(sleeping):
            return True
        os.kill(agent, signal.SIGCONT)
        return False

    wait_for(
        "the agent stopped between two looks at its workers",
        stopped_asleep,
        timeout=60,
        interval=0.013,
    )


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def parent_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/{pid}/status names no parent")


def pipes(pid: int) -> set[str]:
    """The pipes ``pid`` holds an end of (``pipe:[inode]``)."""
    found: set[str] = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed meanwhile
            target = os.readlink(fd)
            if target.startswith("pipe:"):
                found.add(target)
    return found


def shared_pipes(forkserver: int, agent: int) -> set[str]:
    """The pipes between a launcher's forkserver and its agent. Among them, one
    per live worker, on which the forkserver writes that worker's exit code once
    it has reaped it and then closes its end: the agent learns of the exit only
    from that pipe, so a worker's exit has reached its agent once its pipe is
    no longer shared (multiprocessing.forkserver)."""
    return pipes(forkserver) & pipes(agent)
