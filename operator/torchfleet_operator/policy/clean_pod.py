"""cleanPodPolicy: which pods go when the job finishes.

Running (default) deletes the pods still running (a surviving worker would
otherwise hold its GPUs forever) and keeps finished ones for their logs.
"""

from __future__ import annotations

from collections.abc import Iterable

from torchfleet_operator.observed import ObservedPod


def pods_to_clean(clean_pod_policy: str, pods: Iterable[ObservedPod]) -> list[ObservedPod]:
    live = [pod for pod in pods if not pod.deleting]
    if clean_pod_policy == "All":
        return live
    if clean_pod_policy == "Running":
        return [pod for pod in live if not pod.finished]
    return []
