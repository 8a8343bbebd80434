"""When a job has succeeded: the master exited 0, or (AllWorkers) every pod did."""

from __future__ import annotations

from collections.abc import Iterable

from torchfleet_operator.api import constants as c
from torchfleet_operator.api import reasons as r
from torchfleet_operator.api.v1alpha1 import TrainingJobSpec
from torchfleet_operator.desired.names import MASTER_ROLE
from torchfleet_operator.observed import ObservedPod
from torchfleet_operator.planning import Pass
from torchfleet_operator.policy import reporting


def succeeded(success_policy: str, pods: Iterable[ObservedPod], nodes: int) -> bool:
    pods = list(pods)
    if success_policy == "AllWorkers":
        done = {pod.node_rank for pod in pods if pod.phase == "Succeeded"}
        return len(done) == nodes
    return any(pod.role == MASTER_ROLE and pod.phase == "Succeeded" for pod in pods)


def finish_if_succeeded(step: Pass, spec: TrainingJobSpec, gang: list[ObservedPod]) -> bool:
    """Marks the job Succeeded when its gang says so (True)."""
    if not succeeded(spec.run_policy.success_policy, gang, spec.nodes):
        return False
    step.finish(c.PHASE_SUCCEEDED, r.REASON_SUCCEEDED, _message(spec))
    if spec.runs_trainer:
        reporting.final_progress(step, gang)
    return True


def _message(spec: TrainingJobSpec) -> str:
    if spec.run_policy.success_policy == "AllWorkers":
        return "every pod of the gang exited 0"
    return "the master pod exited 0"
