"""An elastic job on KWOK nodes: losing a worker's node replaces that worker alone.

A 1 + 3 job (elastic between 2 and 4 nodes) on private nodes that hold one
pod each, the master pinned to the first: when a worker's node goes NotReady
the operator deletes and recreates only that worker (same name, same gang
generation), the job stays Running on 3 nodes with no gang restart, and the
replacement waits for room; when the node is back it schedules there and the
job is on 4 nodes again. With room for only 2 nodes at submission the job
trains on those and grows to 4 when room appears.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fixtures.cluster import node_ready
from tests.fixtures.operator import fake_node
from tests.fixtures.operator import kwok_job_spec as spec
from tests.fixtures.poll import wait_for

pytestmark = pytest.mark.cluster

POOL_LABEL = "torchfleet.dev/elastic-pool"
TAINT_KEY = "torchfleet.dev/private"
NOT_READY_LABEL = "torchfleet.dev/kwok-not-ready"
# Longer than the node-lifecycle controller takes to taint a NotReady node
# (node-monitor-period 5 s): the replacement is created only once the lost
# node is tainted, so it waits for room instead of landing back on that node.
NODE_LOST_GRACE = "10"
REPLACEMENTS = "torchfleet_operator_elastic_replacements_total"


class Pool:
    """KWOK nodes of this test's own, one pod each, tainted for its pods only: one
    for the master, the rest labelled for the workers."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.name = f"tf-elastic-{uuid.uuid4().hex[:6]}"
        self.nodes: list[str] = []
        self.master_node = self._add("master")

    def add_workers(self, count: int) -> None:
        for _ in range(count):
            self._add(f"{self.name}-workers")

    def _add(self, role: str) -> str:
        """A new node, open to pods only once KWOK reports it Ready: a pod bound
        to a node that is not Ready yet would count as lost after the operator's
        short test grace (a real kubelet registers its node with a not-ready taint)."""
        node = f"{self.name}-{len(self.nodes)}"
        taint = {"key": TAINT_KEY, "value": self.name, "effect": "NoSchedule"}
        body = fake_node(node, taint, labels={POOL_LABEL: role}, pods=1)
        body["spec"]["unschedulable"] = True
        self.cluster.kubectl("create", "-f", "-", input=json.dumps(body))
        self.nodes.append(node)
        wait_for(
            f"KWOK node {node} to become Ready",
            lambda: node_ready(self.cluster.get_json("nodes", node)),
        )
        self.cluster.kubectl("uncordon", node)
        return node

    def job(self) -> dict[str, Any]:
        """A 1 + 3 job elastic between 2 and 4 nodes, its master on the master's node."""
        body = spec(
            workers=3,
            template=on({POOL_LABEL: f"{self.name}-workers"}),
            elastic={"minNodes": 2, "maxNodes": 4},
        )
        body["master"] = {"template": on({"kubernetes.io/hostname": self.master_node})}
        return body

    def delete(self) -> None:
        for node in self.nodes:
            self.cluster.kubectl("delete", "node", node, "--wait=false", check=False)


@pytest.fixture
def pool(cluster: Any) -> Iterator[Pool]:
    made = Pool(cluster)
    try:
        yield made
    finally:
        made.delete()


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
    operator = operator_factory(
        env={"TORCHFLEET_OPERATOR_NODE_LOST_GRACE_SECONDS": NODE_LOST_GRACE},
        namespaces=(namespace,),
    )
    pool.add_workers(3)
    job_driver.create(namespace, "llm", pool.job())
    job_driver.wait_running_pods(namespace, "llm", 4, timeout=90)
    running = job_driver.wait_running_on(namespace, "llm", "4/4")
    assert running["elastic"]["desiredNodes"] == 4
    victim = job_driver.get_core(namespace, "pods", "llm-worker-1")
    lost_node = victim["spec"]["nodeName"]
    assert lost_node != pool.master_node

    cluster.kubectl("label", "node", lost_node, f"{NOT_READY_LABEL}=true")
    # What the node lifecycle controller's unreachable taint does a few seconds
    # later, at once: under load its taint could come after the operator's
    # replacement and the replacement would land back on the lost node.
    cluster.kubectl("cordon", lost_node)
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
        degraded = job_driver.wait_running_on(namespace, "llm", "3/4")
        assert degraded.get("restartCount", 0) == 0  # no gang restart
        assert degraded["elastic"]["replacements"] == 1, [
            (e["reason"], e["message"]) for e in job_driver.events(namespace, "llm")
        ]
        assert degraded["elastic"]["currentNodes"] == 3
        assert degraded["elastic"]["countedReplacements"] == 0  # a lost node: a disruption
        # Prometheus sees the replacement, and no gang restart.
        job_driver.wait_for(
            "the replacement in the operator's metrics",
            lambda: operator.metric(REPLACEMENTS) >= 1,
            timeout=10,
        )
        assert (
            operator.metric(REPLACEMENTS) == operator.metric(REPLACEMENTS, reason="NodeLost") == 1
        )
        assert operator.metric("torchfleet_operator_gang_restarts_total") == 0
        untouched = survivors(job_driver, namespace)
        assert len(untouched) == 3
        pending = job_driver.get_core(namespace, "pods", "llm-worker-1")
        assert pending["status"].get("phase") == "Pending"
    finally:
        cluster.kubectl("label", "node", lost_node, f"{NOT_READY_LABEL}-")
        cluster.kubectl("uncordon", lost_node)

    # The node is back: the replacement schedules and the job is whole again.
    job_driver.wait_running_pods(namespace, "llm", 4, timeout=90)
    whole = job_driver.wait_running_on(namespace, "llm", "4/4")
    assert whole.get("restartCount", 0) == 0
    assert whole["elastic"]["replacements"] == 1
    # The survivors were never touched.
    assert survivors(job_driver, namespace) == untouched


def test_an_elastic_job_starts_on_min_nodes_and_grows_when_room_appears(
    shared_operator, job_driver, namespace, pool
):
    # Room for the master and one worker: minNodes 2, so it trains on 2 of 4.
    pool.add_workers(1)
    job_driver.create(namespace, "llm", pool.job())
    small = job_driver.wait_running_on(namespace, "llm", "2/4")
    assert small["elastic"] == {
        "currentNodes": 2,
        "desiredNodes": 4,
        "replacements": 0,
        "countedReplacements": 0,
    }
    pending = [
        p["metadata"]["name"]
        for p in job_driver.live_pods(namespace, "llm")
        if (p.get("status") or {}).get("phase") == "Pending"
    ]
    assert len(pending) == 2  # the other workers exist and wait for room
    # Room for the rest: the waiting workers schedule, the same gang grows to 4.
    pool.add_workers(2)
    whole = job_driver.wait_running_on(namespace, "llm", "4/4")
    assert whole.get("restartCount", 0) == 0
    assert whole["elastic"]["replacements"] == 0, [
        (e["reason"], e["message"]) for e in job_driver.events(namespace, "llm")
    ]


def test_resizing_a_running_elastic_job_adds_and_removes_workers_in_the_same_gang(
    shared_operator, job_driver, namespace
):
    job = spec(workers=1, elastic={"minNodes": 2, "maxNodes": 4})
    job_driver.create(namespace, "llm", job)
    first = {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in job_driver.wait_running_pods(namespace, "llm", 2)
    }
    job_driver.wait_running_on(namespace, "llm", "2/2")

    # Up to 4: two more workers join the running gang, nobody is replaced.
    job_driver.patch(namespace, "llm", {"spec": {"worker": {"replicas": 3}}})
    grown = job_driver.wait_running_on(namespace, "llm", "4/4")
    assert grown.get("restartCount", 0) == 0 and grown["elastic"]["replacements"] == 0
    pods = {
        p["metadata"]["name"]: p["metadata"]["uid"] for p in job_driver.live_pods(namespace, "llm")
    }
    assert first.items() <= pods.items()  # the first two kept running
    job_driver.wait_events(namespace, "llm", {"ScaledUp"})

    # Down to 3: the last worker leaves; the others are untouched.
    job_driver.patch(namespace, "llm", {"spec": {"worker": {"replicas": 2}}})
    shrunk = job_driver.wait_running_on(namespace, "llm", "3/3")
    job_driver.wait_for(
        "llm-worker-2 gone",
        lambda: job_driver.get_core(namespace, "pods", "llm-worker-2") is None,
    )
    assert shrunk.get("restartCount", 0) == 0 and shrunk["elastic"]["replacements"] == 0
    left = {
        p["metadata"]["name"]: p["metadata"]["uid"] for p in job_driver.live_pods(namespace, "llm")
    }
    assert left == {name: uid for name, uid in pods.items() if name != "llm-worker-2"}
    job_driver.wait_events(namespace, "llm", {"ScaledDown"})
