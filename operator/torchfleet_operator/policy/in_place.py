"""The in-place restart policy: the gang's processes restarted without new pods. Pure.

Under ``runPolicy.inPlaceRestarts: N`` each pod's launcher restarts its own
processes after a retryable failure and the gang meets again in a new
rendezvous round (the trainer's launcher/launch.py); the operator is told through the master's
``/metrics`` (how many this gang has had, and why the last one happened) and
stays the judge: each one counts toward ``backoffLimit`` exactly as a gang
restart for the same failure would (the launchers apply the same exit-code
rule, which the operator gives them), and past it the job fails. When the
launchers' budget is spent, or a pod or node is lost, the pods end and the
failure policy restarts the gang as before.

``status.inPlaceRestarts`` persists what was seen (the total over every gang,
the current gang's count), so an operator restart neither loses nor counts one
twice; ``status.restarts`` adds them to ``restartCount`` for ``kubectl get``
(the accounting is status/restarts.py's).
"""

from __future__ import annotations

from collections.abc import Iterable

from torchfleet_operator.api import constants as c
from torchfleet_operator.api import reasons as r
from torchfleet_operator.api.v1alpha1 import TrainingJobSpec
from torchfleet_operator.observed import ObservedPod
from torchfleet_operator.planning import Pass
from torchfleet_operator.policy import kept_logs, reporting
from torchfleet_operator.status import restarts


def record(
    step: Pass, spec: TrainingJobSpec, gang: Iterable[ObservedPod], may_fail: bool = True
) -> bool:
    """Counts the in-place restarts the current ``gang`` reports; True when they
    passed backoffLimit and ``may_fail`` (the pass then fails the job; a gang
    that succeeded meanwhile is not failed for a count that came late)."""
    restart = restarts.gang(step.status)
    reported, reason = _reported(step, gang)
    added = restarts.count_in_place(step.status, reported or 0, reason, step.stamp_time)
    if not added:
        return False
    counted = restarts.counted(step.status)
    in_gang = restarts.in_place_in_gang(step.status)  # what was reported
    limit = spec.run_policy.backoff_limit
    logs = kept_logs.round_logs(spec, restart, in_gang - 1)
    message = (
        f"the gang's processes restarted in place ({in_gang} of runPolicy.inPlaceRestarts "
        f"{spec.in_place_restarts} in gang {restart}; {counted} counted restarts "
        f"of backoffLimit {limit})"
        + (f": {reason}" if reason else "")
        + (f"; {logs}" if logs else "")
    )
    step.event("Warning", r.EVENT_IN_PLACE_RESTART, message)
    step.plan.in_place_reasons += [reason or "unknown"] * added
    if not restarts.limit_reached(counted, limit) or not may_fail:
        return False
    step.finish(c.PHASE_FAILED, r.REASON_BACKOFF_LIMIT_EXCEEDED, message)
    return True


def _reported(step: Pass, gang: Iterable[ObservedPod]) -> tuple[int | None, str | None]:
    """The current gang's count and last reason: the most that a scrape
    status.progress shows (this gang's) and a finished pod's termination message
    say (the pod's last word, for a round that ended before the next scrape)."""
    said = [pod.in_place_report for pod in gang if pod.finished and pod.in_place_report]
    health = step.observed.health
    if (
        health is not None
        and health.restarts_in_gang is not None
        and step.old_status.phase == c.PHASE_RUNNING
        and reporting.scrape_is_shown(step)
    ):
        said.append((health.restarts_in_gang, health.in_place_reason))
    if not said:
        return None, None
    return max(said, key=lambda summary: summary[0])
