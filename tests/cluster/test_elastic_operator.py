"""An elastic job on KWOK nodes: losing a worker's node replaces that worker alone.

A 1 + 3 job (elastic between 2 and 4 nodes) on four private nodes that hold one
pod each, the master pinned to the first: when a worker's node goes NotReady
the operator deletes and recreates only that worker (same name, same gang
generation), the job stays Running on 3 nodes with no gang restart, and the
replacement waits for room; when the node is back it schedules there and the
job is on 4 nodes again.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fixtures.operator import fake_node
from tests.fixtures.operator import kwok_job_spec as spec

pytestmark = pytest.mark.cluster

POOL_LABEL = "torchfleet.dev/elastic-pool"
TAINT_KEY = "torchfleet.dev/private"
NOT_READY_LABEL = "torchfleet.dev/kwok-not-ready"
# Longer than the node-lifecycle controller takes to taint a NotReady node
# (node-monitor-period 5 s): the replacement is created only once the lost
# node is tainted, so it waits for room instead of landing back on that node.
NODE_LOST_GRACE = "10"


@pytest.fixture
def pool(cluster: Any) -> Iterator[list[str]]:
    """Four KWOK nodes of this test's own, one pod each, tainted for its pods only:
    the first for the master, the others labelled for the workers."""
    name = f"tf-elastic-{uuid.uuid4().hex[:6]}"
    nodes = [f"{name}-{i}" for i in range(4)]
    for index, node in enumerate(nodes):
        taint = {"key": TAINT_KEY, "value": name, "effect": "NoSchedule"}
        labels = {POOL_LABEL: "master" if index == 0 else f"{name}-workers"}
        body = fake_node(node, taint, labels=labels, pods=1)
        cluster.kubectl("create", "-f", "-", input=json.dumps(body))
    try:
        yield nodes
    finally:
        for node in nodes:
            cluster.kubectl("delete", "node", node, "--wait=false", check=False)


def on(selector: dict[str, str]) -> dict[str, Any]:
    toleration = {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
    return {"spec": {"nodeSelector": selector, "tolerations": [toleration]}}


def survivors(job_driver: Any, namespace: str) -> dict[str, str]:
    """The live pods other than llm-worker-1, name to uid."""
    return {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in job_driver.live_pods(namespace, "llm")
        if p["metadata"]["name"] != "llm-worker-1"
    }


def test_a_lost_workers_node_replaces_that_worker_alone_and_the_job_grows_back(
    operator_factory, job_driver, cluster, namespace, pool
):
    operator_factory(
        env={"TORCHFLEET_OPERATOR_NODE_LOST_GRACE_SECONDS": NODE_LOST_GRACE},
        namespaces=(namespace,),
    )
    master_node = pool[0]
    body = spec(
        workers=3,
        template=on({POOL_LABEL: f"{master_node.rsplit('-', 1)[0]}-workers"}),
        elastic={"minNodes": 2, "maxNodes": 4},
    )
    body["master"] = {"template": on({"kubernetes.io/hostname": master_node})}
    job_driver.create(namespace, "llm", body)
    job_driver.wait_running_pods(namespace, "llm", 4, timeout=90)
    running = job_driver.wait_for(
        "the job Running on 4 of 4 nodes",
        lambda: (
            (s := job_driver.status(namespace, "llm")).get("nodesReady") == "4/4"
            and s.get("phase") == "Running"
            and s
        ),
    )
    assert running["elastic"]["desiredNodes"] == 4
    victim = job_driver.get_core(namespace, "pods", "llm-worker-1")
    lost_node = victim["spec"]["nodeName"]
    assert lost_node != master_node

    cluster.kubectl("label", "node", lost_node, f"{NOT_READY_LABEL}=true")
    try:
        replaced = job_driver.wait_for(
            "llm-worker-1 replaced by a new pod of the same gang, waiting for room",
            lambda: (
                (pod := job_driver.get_core(namespace, "pods", "llm-worker-1"))
                and pod["metadata"]["uid"] != victim["metadata"]["uid"]
                and pod
            ),
            timeout=90,
        )
        assert replaced["metadata"]["labels"]["torchfleet.dev/restart"] == "0"
        degraded = job_driver.wait_for(
            "the job Running on 3 of 4 nodes with one replacement",
            lambda: (
                (s := job_driver.status(namespace, "llm")).get("nodesReady") == "3/4"
                and s.get("elastic", {}).get("replacements") == 1
                and s
            ),
        )
        assert degraded["phase"] == "Running"
        assert degraded.get("restartCount", 0) == 0  # no gang restart
        assert degraded["elastic"]["currentNodes"] == 3
        assert degraded["elastic"]["countedReplacements"] == 0  # a lost node: a disruption
        untouched = survivors(job_driver, namespace)
        assert len(untouched) == 3
        pending = job_driver.get_core(namespace, "pods", "llm-worker-1")
        assert pending["status"].get("phase") == "Pending"
    finally:
        cluster.kubectl("label", "node", lost_node, f"{NOT_READY_LABEL}-")

    # The node is back: the replacement schedules and the job is whole again.
    job_driver.wait_running_pods(namespace, "llm", 4, timeout=90)
    whole = job_driver.wait_for(
        "the job Running on 4 of 4 nodes again",
        lambda: (s := job_driver.status(namespace, "llm")).get("nodesReady") == "4/4" and s,
    )
    assert whole["phase"] == "Running" and whole.get("restartCount", 0) == 0
    assert whole["elastic"]["replacements"] == 1
    # The survivors were never touched.
    assert survivors(job_driver, namespace) == untouched
