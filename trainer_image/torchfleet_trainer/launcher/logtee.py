"""Keeps a training process's stdout and stderr on the checkpoint volume, capped.

A gang restart deletes the pods and their logs with them, which are the logs
of the failure users most need to read. ``keep_logs`` (called by each training
process before torch is imported) puts a pipe under its file descriptors 1
and 2 and starts ``python -m torchfleet_trainer.launcher.logtee``, a small process of
its own, that copies each pipe to where it went before (the pod's stdout and
stderr: a tee, not a redirect) and both into one file:

    <checkpoint dir>/logs/gen-<G>/round-<R>/rank-<rank>.log

G is the gang generation (TORCHFLEET_RESTART_COUNT), R the in-place round
(torchelastic's TORCHELASTIC_RESTART_COUNT in the workers it starts, else 0),
rank the global rank. A separate process, so a rank killed with SIGKILL still
gets everything it wrote into its file: the copier reads the pipe to its end.
It ignores SIGTERM and SIGINT and runs in a session of its own, so a signal
meant for the rank's process group does not stop it before it has drained.

Each file is capped at TORCHFLEET_LOG_MAX_BYTES and keeps the tail: past the
cap it moves to ``<name>.1`` (replacing the one before) and a new one starts.
Rank 0 removes the generations older than the newest
TORCHFLEET_LOG_KEEP_GENERATIONS when it starts.

This module imports only the standard library: the copier starts in tens of
milliseconds.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import BinaryIO

from torchfleet_contract import pod as contract

_GENERATION = re.compile(r"gen-(\d+)")
# Seconds a process exiting normally waits for its copier to write what it printed last.
DRAIN_SECONDS = 5.0


def log_path(root: Path, generation: int, round_: int, rank: int) -> Path:
    return Path(contract.kept_log_file(str(root), generation, round_, rank))


# A failure's tail, as the kubelet takes one from a container's log.
TAIL_BYTES = 2048
TAIL_LINES = 80


def kept_tail(root: str | None, generation: int, rank: int | None) -> str | None:
    """The last lines rank ``rank`` kept in gang ``generation``'s newest round
    (its failure, for the termination message); None when none were kept."""
    if root is None or rank is None:
        return None
    rounds = Path(root, contract.LOGS_SUBDIR, f"gen-{generation}").glob(f"round-*/rank-{rank}.log")
    newest = max(rounds, key=lambda path: int(path.parent.name.split("-")[1]), default=None)
    if newest is None:
        return None
    try:
        with open(newest, "rb") as kept:
            kept.seek(max(0, kept.seek(0, os.SEEK_END) - TAIL_BYTES))
            data = kept.read()
    except OSError:
        return None
    lines = data.decode(errors="replace").splitlines()[-TAIL_LINES:]
    return "\n".join(lines).strip() or None


def prune_generations(logs: Path, current: int, keep: int) -> list[Path]:
    """Removes gen-<N> folders older than the newest ``keep`` up to ``current``."""
    removed = []
    for folder in logs.glob("gen-*"):
        match = _GENERATION.fullmatch(folder.name)
        if match and int(match.group(1)) <= current - keep:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


class LogCopier:
    """The running copier of this process's output; ``finish`` drains it."""

    def __init__(self, proc: subprocess.Popen[bytes], path: Path) -> None:
        self.proc = proc
        self.path = path

    def finish(self) -> None:
        """Flushes, hands the copier the end of both streams and waits for it,
        so the pod's log and the file both have the last lines."""
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(devnull)
        # On a timeout a child of this process still holds the pipe; the copier
        # ends with it.
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=DRAIN_SECONDS)


_copier: LogCopier | None = None


def keep_logs(
    checkpoint_dir: str | None, rank: int, settings: contract.RecoverySettings
) -> Path | None:
    """Tees this process's fds 1 and 2 into its log file; the file, or None when
    logs are not kept (no checkpoint directory, or keeping 0 generations)."""
    global _copier
    if checkpoint_dir is None or settings.log_keep_generations == 0 or _copier is not None:
        return None
    pod = contract.PodContract.from_env()
    round_ = contract.in_place_round()
    path = log_path(Path(checkpoint_dir), pod.restart_count, round_, rank)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if rank == 0:
            logs = Path(checkpoint_dir) / contract.LOGS_SUBDIR
            prune_generations(logs, pod.restart_count, settings.log_keep_generations)
    except OSError as err:
        # Kept logs are a help, never a reason for training to fail.
        print(f"torchfleet-train: not keeping logs at {path}: {err}", file=sys.stderr)
        return None
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    header = (
        f"=== torchfleet-train rank {rank}, generation {pod.restart_count}, round {round_}, "
        f"node {contract.node_name()}, started {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
    )
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torchfleet_trainer.launcher.logtee",
            str(path),
            str(settings.log_max_bytes),
            str(out_read),
            str(err_read),
            header,
        ],
        stdin=subprocess.DEVNULL,
        pass_fds=(out_read, err_read),
        start_new_session=True,
    )
    os.dup2(out_write, 1)
    os.dup2(err_write, 2)
    for fd in (out_read, out_write, err_read, err_write):
        os.close(fd)
    _copier = LogCopier(proc, path)
    atexit.register(_copier.finish)
    return path


def finish() -> None:
    """Drains the copier now (for a process about to ``os._exit``)."""
    if _copier is not None:
        _copier.finish()


class CappedFile:
    """An append-only file that keeps its last ``cap`` bytes (and up to ``cap`` before
    them in ``<name>.1``). A volume that fails (full, gone) ends the file, not
    the copy to the pod's own log: the rank must never block or die on it."""

    def __init__(self, path: Path, cap: int) -> None:
        self.path = path
        self.cap = cap
        self.file: BinaryIO | None = None
        self.size = 0
        with contextlib.suppress(OSError):
            self.file = open(path, "ab")  # noqa: SIM115 - rotated by hand
            self.size = self.file.tell()

    def write(self, data: bytes) -> None:
        if self.file is None:
            return
        try:
            self._write(data)
        except OSError as err:
            self.file = None
            message = f"torchfleet-train: stopped keeping this log at {self.path}: {err}\n"
            _write_all(2, message.encode())

    def _write(self, data: bytes) -> None:
        assert self.file is not None
        while data:
            room = self.cap - self.size
            if room <= 0:
                self._rotate()
                continue
            self.file.write(data[:room])
            self.size += min(room, len(data))
            data = data[room:]
        self.file.flush()

    def _rotate(self) -> None:
        assert self.file is not None
        self.file.close()
        os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        self.file = open(self.path, "ab")  # noqa: SIM115
        self.size = 0


def _write_all(fd: int, data: bytes) -> bool:
    """Writes to ``fd``; False once it is gone (nobody reads the pod's stdout)."""
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        return False
    return True


def copy(sources: dict[int, int], sink: CappedFile) -> None:
    """Copies each source fd to its destination fd and to ``sink`` until every
    source has ended. The file first: what the pod's log shows is already kept."""
    alive = dict(sources)
    while alive:
        ready, _, _ = select.select(list(alive), [], [])
        for fd in ready:
            data = os.read(fd, 65536)
            if not data:
                del alive[fd]
                continue
            sink.write(data)
            if alive[fd] >= 0 and not _write_all(alive[fd], data):
                alive[fd] = -1


def main(argv: list[str]) -> int:
    path, cap, out_fd, err_fd, header = argv
    # The rank's signals are not this copier's: it ends when the rank's pipes do.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sink = CappedFile(Path(path), int(cap))
    sink.write(header.encode() + b"\n")
    copy({int(out_fd): 1, int(err_fd): 2}, sink)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
