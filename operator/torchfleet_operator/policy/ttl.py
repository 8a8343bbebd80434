"""ttlSecondsAfterFinished: how long a finished job stays before it is deleted."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from torchfleet_operator.planning import Pass


def seconds_left(finished: datetime | None, ttl_seconds: int | None, now: datetime) -> float | None:
    """None when the job is kept forever (or is not finished); <= 0 when it is due."""
    if ttl_seconds is None or finished is None:
        return None
    return ttl_seconds - (now - finished).total_seconds()


def expire(step: Pass, ttl_seconds: int | None) -> None:
    """Deletes the finished job once its TTL is over, else wakes the pass then."""
    left = seconds_left(step.status.completion_time, ttl_seconds, step.now)
    if left is not None and left <= 0:
        step.plan.delete_job = True
    else:
        step.plan.wake_in(left)


def raw_ttl(raw_spec: dict[str, Any]) -> int | None:
    """ttlSecondsAfterFinished read without the models: it must fire whatever else changed."""
    run_policy = raw_spec.get("runPolicy")
    value = run_policy.get("ttlSecondsAfterFinished") if isinstance(run_policy, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None
