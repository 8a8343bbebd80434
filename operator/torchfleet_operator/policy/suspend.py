"""suspend (Kueue's contract): a suspended job has no pods and creates none;
its status (restart count, start time, progress) is kept for the resume."""

from __future__ import annotations

from collections.abc import Iterable

from torchfleet_operator.api import constants as c
from torchfleet_operator.api import reasons as r
from torchfleet_operator.observed import ObservedPod
from torchfleet_operator.planning import Pass, Plan


def pods_to_remove(suspended: bool, pods: Iterable[ObservedPod]) -> list[ObservedPod]:
    return [pod for pod in pods if not pod.deleting] if suspended else []


def suspend(step: Pass, pods: list[ObservedPod]) -> Plan:
    step.delete_pods(pods_to_remove(True, pods))
    step.set_phase(c.PHASE_SUSPENDED)
    step.set_condition(r.CONDITION_SUSPENDED, True, r.REASON_SUSPENDED, "the job is suspended")
    step.clear_condition(r.CONDITION_RUNNING, r.REASON_SUSPENDED, "the job is suspended")
    return step.finalize()


def resumed(step: Pass) -> None:
    step.clear_condition(r.CONDITION_SUSPENDED, r.REASON_RESUMED, "the job was resumed")
