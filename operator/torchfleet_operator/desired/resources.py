"""The trainer container's resources from spec.resources and spec.network:
what the pod asks for (desired/pods.py) and what its PodGroup counts
(desired/podgroup.py)."""

from __future__ import annotations

from typing import Any

from torchfleet_operator.api.v1alpha1 import TrainingJobSpec


def container_resources(spec: TrainingJobSpec) -> dict[str, Any]:
    """GPUs and RDMA as requests = limits (extended resources cannot overcommit)."""
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}
    if spec.resources.gpus:
        limits[spec.resources.gpu_resource_name] = str(spec.resources.gpus)
    for name, count in (spec.network.rdma_resources or {}).items():
        limits[name] = str(count)
    if spec.resources.cpu is not None:
        requests["cpu"] = limits["cpu"] = str(spec.resources.cpu)
    if spec.resources.memory is not None:
        requests["memory"] = limits["memory"] = str(spec.resources.memory)
    requests.update({k: v for k, v in limits.items() if k not in requests})
    return {"limits": limits, "requests": requests} if limits else {}
