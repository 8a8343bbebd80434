"""Which status changes may wait: pod counts alone are written at a pace, not per pass.

A gang forming or finishing changes ``nodesReady`` and ``replicaStatuses`` pod
by pod. Written on every pass, one job of 2,048 pods made over 200 status
writes while it came up, each one a watch event for every client of the job.
Counts alone are shown at most once per interval; anything else in the same
change (a phase, a condition, a restart, progress) goes out at once and takes
the counts with it. The time accounting rides along with any write (status/
goodput.py flushes it on its own only rarely), so it never makes a change urgent.
Pure.
"""

from __future__ import annotations

from typing import Any

from torchfleet_operator.status.goodput import STATUS_KEYS as ACCOUNTING_KEYS

COUNT_KEYS = ("nodesReady", "replicaStatuses")


def counts_only(current: dict[str, Any], status: dict[str, Any]) -> bool:
    """True when ``status`` differs from ``current`` in pod counts (and the time
    accounting that follows any pass) and in nothing else."""
    changed = {key for key in current.keys() | status.keys() if current.get(key) != status.get(key)}
    return bool(changed & set(COUNT_KEYS)) and changed <= {*COUNT_KEYS, *ACCOUNTING_KEYS}


def wait_before_writing(
    current: dict[str, Any],
    status: dict[str, Any],
    since_last_write: float | None,
    interval: float,
) -> float | None:
    """Seconds the write of ``status`` over ``current`` should wait, or None to
    write now: only a counts-only change, within ``interval`` of the last write."""
    if since_last_write is None or since_last_write >= interval:
        return None
    if not counts_only(current, status):
        return None
    return interval - since_last_write
