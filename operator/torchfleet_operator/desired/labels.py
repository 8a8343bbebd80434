"""Labels, selectors and owner references shared by every child."""

from __future__ import annotations

from typing import Any

from torchfleet_operator.api.constants import API_VERSION, KIND

JOB_NAME_LABEL = "torchfleet.dev/job-name"
ROLE_LABEL = "torchfleet.dev/role"
NODE_RANK_LABEL = "torchfleet.dev/node-rank"
RESTART_LABEL = "torchfleet.dev/restart"
MANAGED_BY = "torchfleet-operator"


def job_selector(job: str) -> dict[str, str]:
    """Selects every child of one job (the Service's and PodGroup's selector)."""
    return {JOB_NAME_LABEL: job}


def common_labels(job: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "torchfleet",
        "app.kubernetes.io/instance": job,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "app.kubernetes.io/part-of": "torchfleet",
        **job_selector(job),
    }


def pod_labels(job: str, role: str, node_rank: int, restart: int) -> dict[str, str]:
    return {
        **common_labels(job),
        "app.kubernetes.io/component": role,
        ROLE_LABEL: role,
        NODE_RANK_LABEL: str(node_rank),
        RESTART_LABEL: str(restart),
    }


def owner_reference(job_name: str, job_uid: str) -> dict[str, Any]:
    """Makes the job own a child: the garbage collector deletes it with the job."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job_name,
        "uid": job_uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
