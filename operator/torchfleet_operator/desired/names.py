"""Deterministic child names.

Pod names double as DNS hostnames (``hostname`` + ``subdomain`` give each pod
the stable record ``<pod>.<service>.<namespace>.svc``), so every name must be
a DNS-1035 label of at most 63 characters. A job whose name would not fit is
rejected rather than truncated: truncation could make two jobs collide on the
same pods.
"""

from __future__ import annotations

import re

MAX_LABEL_LENGTH = 63
MASTER_ROLE = "master"
WORKER_ROLE = "worker"
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def pod_name(job: str, role: str, index: int) -> str:
    return f"{job}-{role}-{index}"


def master_pod_name(job: str) -> str:
    return pod_name(job, MASTER_ROLE, 0)


def worker_pod_name(job: str, index: int) -> str:
    return pod_name(job, WORKER_ROLE, index)


def pod_name_for_rank(job: str, node_rank: int) -> str:
    """Rank 0 is the master; workers are numbered from 0 (rank 1 = worker-0)."""
    if node_rank == 0:
        return master_pod_name(job)
    return worker_pod_name(job, node_rank - 1)


def service_name(job: str) -> str:
    return job


def checkpoint_claim_name(job: str) -> str:
    return f"{job}-checkpoint"


def podgroup_name(job: str) -> str:
    return job


def pod_address(job: str, namespace: str, pod: str) -> str:
    """A pod's stable DNS name through the job's headless service."""
    return f"{pod}.{service_name(job)}.{namespace}.svc"


def master_address(job: str, namespace: str) -> str:
    return pod_address(job, namespace, master_pod_name(job))


def name_problem(job: str, workers: int) -> str | None:
    """Why ``job`` cannot name its children, or None when it can."""
    if not _DNS_1035.match(job):
        return (
            f"metadata.name {job!r} must be a DNS-1035 label (lowercase letters, digits "
            "and '-', starting with a letter) because it names the headless Service"
        )
    longest = worker_pod_name(job, workers - 1) if workers > 0 else master_pod_name(job)
    if len(longest) > MAX_LABEL_LENGTH:
        room = MAX_LABEL_LENGTH - (len(longest) - len(job))
        return (
            f"metadata.name {job!r} is too long: pod {longest!r} would exceed "
            f"{MAX_LABEL_LENGTH} characters; use at most {room} characters for this job"
        )
    return None
