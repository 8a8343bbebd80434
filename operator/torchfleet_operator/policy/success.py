"""When a job has succeeded: the master exited 0, or (AllWorkers) every pod did."""

from __future__ import annotations

from collections.abc import Iterable

from torchfleet_operator.build.names import MASTER_ROLE
from torchfleet_operator.observed import ObservedPod


def succeeded(success_policy: str, pods: Iterable[ObservedPod], nodes: int) -> bool:
    pods = list(pods)
    if success_policy == "AllWorkers":
        done = {pod.node_rank for pod in pods if pod.phase == "Succeeded"}
        return len(done) == nodes
    return any(pod.role == MASTER_ROLE and pod.phase == "Succeeded" for pod in pods)
