"""suspend (Kueue's contract): a suspended job has no pods and creates none;
its status (restart count, start time, progress) is kept for the resume."""

from __future__ import annotations

from collections.abc import Iterable

from torchfleet_operator.observed import ObservedPod


def pods_to_remove(suspended: bool, pods: Iterable[ObservedPod]) -> list[ObservedPod]:
    return [pod for pod in pods if not pod.deleting] if suspended else []
