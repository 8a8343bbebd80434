"""Pod counts: status.replicaStatuses, status.nodesReady and the running pods."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torchfleet_operator.desired.names import MASTER_ROLE, WORKER_ROLE
from torchfleet_operator.observed import ObservedPod


def replica_statuses(pods: Iterable[ObservedPod]) -> dict[str, Any]:
    counts = {
        role: {"active": 0, "ready": 0, "succeeded": 0, "failed": 0}
        for role in (MASTER_ROLE, WORKER_ROLE)
    }
    for pod in pods:
        role = counts.get(pod.role)
        if role is None:
            continue
        if pod.phase == "Succeeded":
            role["succeeded"] += 1
        elif pod.phase == "Failed":
            role["failed"] += 1
        elif not pod.deleting:
            role["active"] += 1
            if pod.phase == "Running":
                role["ready"] += 1
    return counts


def nodes_ready(pods: Iterable[ObservedPod], nodes: int) -> str:
    ready = sum(1 for pod in pods if pod.phase == "Running" and not pod.deleting)
    return f"{ready}/{nodes}"


def running(gang: Iterable[ObservedPod]) -> list[ObservedPod]:
    """The gang's pods that run (under AllWorkers a pod that already exited 0
    still counts as part of a running gang)."""
    return [p for p in gang if p.phase in ("Running", "Succeeded") and not p.deleting]
