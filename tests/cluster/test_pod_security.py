"""Pod Security admission (the API server's own, enabled by default) against the
operator's pods: a plain job runs where `restricted` is enforced, an RDMA job
needs `privileged` and says so when a namespace refuses it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fixtures.operator import kwok_job_spec as spec
from torchfleet_operator.status.conditions import find

pytestmark = pytest.mark.cluster

ENFORCE = "pod-security.kubernetes.io/enforce"
RDMA = {"transport": "infiniband", "ibHCAs": ["mlx5_0"], "rdmaResources": {"rdma/ib": 1}}


def enforce(cluster: Any, namespace: str, level: str) -> None:
    cluster.kubectl("label", "namespace", namespace, f"{ENFORCE}={level}", "--overwrite")


def rejection(job_driver: Any, namespace: str, name: str) -> dict[str, Any] | None:
    found = find(job_driver.status(namespace, name).get("conditions"), "ChildrenRejected")
    return found if found is not None and found["status"] == "True" else None


@pytest.mark.parametrize(
    "extra",
    [{}, {"resources": {"gpus": 1}, "network": {"transport": "tcp"}}],
    ids=["cpu", "gpu-tcp"],
)
def test_a_plain_job_runs_where_restricted_is_enforced(
    cluster, shared_operator, job_driver, namespace, extra
):
    enforce(cluster, namespace, "restricted")
    job_driver.create(namespace, "plain", spec(workers=1, **extra))
    pods = job_driver.wait_running_pods(namespace, "plain", 2)
    trainer = pods[0]["spec"]["containers"][0]["securityContext"]
    assert trainer["capabilities"] == {"drop": ["ALL"]} and trainer["runAsNonRoot"] is True
    # The hostfile's writer (the job runs a command of its own) was admitted too.
    assert [c["name"] for c in pods[0]["spec"]["initContainers"]] == ["hostfile"]
    assert rejection(job_driver, namespace, "plain") is None


def test_an_rdma_job_is_refused_by_baseline_naming_ipc_lock_and_runs_in_privileged(
    cluster, shared_operator, job_driver, namespace
):
    enforce(cluster, namespace, "baseline")
    job_driver.create(namespace, "rdma", spec(workers=1, network=RDMA))
    refused = job_driver.wait_for(
        "the Pod Security refusal", lambda: rejection(job_driver, namespace, "rdma")
    )
    assert refused["reason"] == "PodSecurityRejected", refused
    message = refused["message"]
    assert "level 'baseline'" in message and "IPC_LOCK" in message, message
    assert "securityContext.capabilities.add" in message, message  # the field, from the server
    assert job_driver.pods(namespace, "rdma") == []

    # The fix the message names: the privileged level. The refused pods are retried.
    enforce(cluster, namespace, "privileged")
    pods = job_driver.wait_running_pods(namespace, "rdma", 2, timeout=120)
    trainer = pods[0]["spec"]["containers"][0]["securityContext"]
    assert trainer["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    job_driver.wait_for(
        "the refusal to clear", lambda: rejection(job_driver, namespace, "rdma") is None
    )
