"""The chart's shipped ClusterTrainingRuntimes against a real API server: all
four pass the CRD's schema and CEL rules (server-side), and a job naming one
gives only its command and placement, resolves it (RuntimeResolved True) and
runs with the runtime's image and processes per node."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from tests.fixtures.helm import Helm, find_objects
from tests.fixtures.operator import ON_FAKE_NODES
from tests.fixtures.poll import wait_for
from torchfleet_operator.api.constants import CLUSTER_RUNTIME_KIND
from torchfleet_operator.status import conditions

pytestmark = pytest.mark.cluster


def test_the_shipped_runtimes_are_valid_and_a_job_runs_on_one(
    helm: Helm, cluster: Any, shared_operator: Any, job_driver: Any, namespace: str
) -> None:
    prefix = f"chart-{uuid.uuid4().hex[:6]}-"
    objects = helm.template(set_values={"runtimes.install": True, "runtimes.namePrefix": prefix})
    runtimes = find_objects(objects, CLUSTER_RUNTIME_KIND)
    assert len(runtimes) == 4
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": runtimes})
    cluster.kubectl("apply", "--server-side", "-f", "-", input=manifest)
    try:
        name = f"{prefix}cpu-gloo"
        job_driver.create(
            namespace,
            "on-chart",
            {
                "runtimeRef": {"kind": CLUSTER_RUNTIME_KIND, "name": name},
                "command": ["torchrun", "train.py"],
                "master": {"template": ON_FAKE_NODES},
                "worker": {"replicas": 1, "template": ON_FAKE_NODES},
            },
        )
        pods = job_driver.wait_running_pods(namespace, "on-chart", 2)
        status = job_driver.status(namespace, "on-chart")
        assert conditions.is_true(status.get("conditions"), "RuntimeResolved"), status
        assert status["runtime"]["name"] == name
        shipped = next(r for r in runtimes if r["metadata"]["name"] == name)
        for pod in pods:
            trainer = next(c for c in pod["spec"]["containers"] if c["name"] == "trainer")
            assert trainer["image"] == shipped["spec"]["image"]
    finally:
        names = [r["metadata"]["name"] for r in runtimes]
        cluster.kubectl("delete", "clustertrainingruntimes", *names, "--wait=false", check=False)
    wait_for(
        "the runtimes deleted",
        lambda: (
            not cluster.kubectl(
                "get", "clustertrainingruntimes", "-o", "name", check=False
            ).stdout.count(prefix)
        ),
    )
