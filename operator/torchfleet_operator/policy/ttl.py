"""ttlSecondsAfterFinished: how long a finished job stays before it is deleted."""

from __future__ import annotations

from datetime import datetime


def seconds_left(finished: datetime | None, ttl_seconds: int | None, now: datetime) -> float | None:
    """None when the job is kept forever (or is not finished); <= 0 when it is due."""
    if ttl_seconds is None or finished is None:
        return None
    return ttl_seconds - (now - finished).total_seconds()
