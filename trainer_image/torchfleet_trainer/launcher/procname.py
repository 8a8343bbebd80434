"""A training process's name on its machine: ``rank-<global rank>``.

The launcher's workers are forked from its forkserver (worker.py), so their
command line is the forkserver's and ``/proc/<pid>/environ`` holds the
environment the forkserver started with, not the ``RANK`` torch sets after the
fork. Each worker therefore names itself (the kernel's ``comm``, what ``ps``,
``top`` and ``/proc/<pid>/comm`` show) after its global rank for the round it
runs in, and whoever looks into a pod (a person with ``ps``, the tests that
kill a rank) finds the training processes and their ranks by that name.

Standard library only: read without importing torch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
from pathlib import Path

PREFIX = "rank-"
# The kernel keeps 15 bytes of a name: "rank-" and ten digits.
_NAME = re.compile(rf"{PREFIX}(\d+)")
_PR_SET_NAME = 15


def name_this_process(rank: int) -> bool:
    """Names this process ``rank-<rank>`` (prctl PR_SET_NAME); False where the
    platform has no prctl, and the process keeps its name."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    try:
        prctl = ctypes.CDLL(libc_name, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    return int(prctl(_PR_SET_NAME, f"{PREFIX}{rank}".encode(), 0, 0, 0)) == 0


def rank_of(pid: int) -> int | None:
    """The global rank a training process named itself after; None for any other
    process, or one that has exited."""
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    match = _NAME.fullmatch(name)
    return int(match.group(1)) if match else None
