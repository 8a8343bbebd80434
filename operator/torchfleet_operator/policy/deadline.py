"""activeDeadlineSeconds: measured from the first start, restarts included."""

from __future__ import annotations

from datetime import datetime

from torchfleet_operator.api import constants as c
from torchfleet_operator.api import reasons as r
from torchfleet_operator.api.v1alpha1 import TrainingJobSpec
from torchfleet_operator.planning import Pass


def seconds_left(
    start: datetime | None, deadline_seconds: int | None, now: datetime
) -> float | None:
    """None when no deadline applies; <= 0 when it has passed."""
    if deadline_seconds is None or start is None:
        return None
    return deadline_seconds - (now - start).total_seconds()


def start_clock(step: Pass) -> None:
    """startTime: the first unsuspended pass, and again at each resume (as the Job
    controller and PyTorchJob do), so activeDeadlineSeconds counts time allowed
    to run, including time spent unscheduled, but not time spent suspended."""
    if step.status.start_time is None or step.old_status.phase == c.PHASE_SUSPENDED:
        step.status.start_time = step.stamp_time


def exceeded(step: Pass, spec: TrainingJobSpec) -> bool:
    """Fails the job once it ran past activeDeadlineSeconds (True), else wakes
    the pass when it will have."""
    limit = spec.run_policy.active_deadline_seconds
    left = seconds_left(step.status.start_time, limit, step.now)
    if left is not None and left <= 0:
        step.finish(
            c.PHASE_FAILED,
            r.REASON_DEADLINE_EXCEEDED,
            f"the job ran longer than activeDeadlineSeconds ({limit}s)",
        )
        return True
    step.plan.wake_in(left)
    return False
