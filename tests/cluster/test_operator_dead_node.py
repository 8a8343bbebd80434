"""A node that never comes back: its kubelet is dead, its pods never finish terminating.

The harness kills a KWOK node the way a dead kubelet does (dev/cluster/stages):
the node reports Ready=False and the deletion of its pods is never confirmed.
Without a force delete the next gang waits for ever (kubernetes#72226); the
operator force-deletes them once the node has been lost for its grace.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fixtures.operator import kwok_job_spec as spec
from torchfleet_operator.status.conditions import find

pytestmark = pytest.mark.cluster

FORCE_DELETE_AFTER = 8.0
BACKOFF = 0.5  # FAST_TEST_SETTINGS' restart back-off


class DeadNodes:
    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.killed: list[str] = []

    def kill(self, node: str, namespace: str, pods: list[str]) -> None:
        """Ready=False from now on, and the node's pods never confirm a deletion."""
        self.killed.append(node)
        for pod in pods:
            self.cluster.kubectl(
                "label", "pod", "-n", namespace, pod, "torchfleet.dev/kwok-dead-kubelet=true"
            )
        self.cluster.kubectl("label", "node", node, "torchfleet.dev/kwok-not-ready=true")

    def kill_node_of(self, job_driver: Any, namespace: str, pod: str) -> tuple[dict, str]:
        """Kills the node ``pod`` runs on, with every pod of the namespace there;
        returns the pod as it was and its node's name."""
        victim = job_driver.get_core(namespace, "pods", pod)
        node = victim["spec"]["nodeName"]
        on_node = [
            p["metadata"]["name"]
            for p in job_driver.pods(namespace)
            if p["spec"].get("nodeName") == node
        ]
        self.kill(node, namespace, on_node)
        return victim, node

    def revive_all(self) -> None:
        for node in self.killed:
            self.cluster.kubectl("label", "node", node, "torchfleet.dev/kwok-not-ready-")


@pytest.fixture
def dead_nodes(cluster: Any) -> Iterator[DeadNodes]:
    nodes = DeadNodes(cluster)
    try:
        yield nodes
    finally:
        nodes.revive_all()


def created_condition(job_driver: Any, namespace: str) -> dict[str, Any]:
    status = job_driver.status(namespace, "llm")
    return find(status.get("conditions"), "Created") or {}


def test_a_gang_stalled_by_a_dead_node_is_recreated_after_the_force_delete_grace(
    operator_factory, job_driver, namespace, dead_nodes
):
    # First an operator that (practically) never force-deletes: the stall.
    stalling = operator_factory(
        env={"TORCHFLEET_OPERATOR_NODE_LOSS_FORCE_DELETE_SECONDS": "100000"},
        namespaces=(namespace,),
    )
    job_driver.create(namespace, "llm", spec(workers=3))
    job_driver.wait_running_pods(namespace, "llm", 4)
    job_driver.wait_phase(namespace, "llm", "Running")
    _, node = dead_nodes.kill_node_of(job_driver, namespace, "llm-worker-1")

    # The operator says what the new gang waits for: the pod on the lost node.
    waiting = job_driver.wait_for(
        "the Created condition naming the pod stuck on the lost node",
        lambda: (
            (found := created_condition(job_driver, namespace))
            and f"(node {node})" in found.get("message", "")
            and found
        ),
        timeout=60,
    )
    assert "llm-worker-1" in waiting["message"]
    stuck = job_driver.get_core(namespace, "pods", "llm-worker-1")
    assert stuck is not None and stuck["metadata"].get("deletionTimestamp")
    assert stuck["metadata"]["labels"]["torchfleet.dev/restart"] == "0"
    # More passes (poked through the job; the reconcile counter says they ran): still stalled.
    for poke in range(3):
        passes = stalling.metric("torchfleet_operator_reconcile_duration_seconds_count")
        job_driver.patch(namespace, "llm", {"metadata": {"labels": {"poke": str(poke)}}})
        job_driver.wait_for(
            "a pass of the stalling operator",
            lambda n=passes: (
                stalling.metric("torchfleet_operator_reconcile_duration_seconds_count") > n
            ),
        )
    assert (
        job_driver.get_core(namespace, "pods", "llm-worker-1")["metadata"]["uid"]
        == (stuck["metadata"]["uid"])
    )
    assert not [
        p
        for p in job_driver.pods(namespace, "llm")
        if p["metadata"]["labels"]["torchfleet.dev/restart"] == "1"
    ]
    stalling.stop()

    # Now the default behaviour, with a short grace: force-deleted, gang back.
    started = time.monotonic()
    operator_factory(
        env={"TORCHFLEET_OPERATOR_NODE_LOSS_FORCE_DELETE_SECONDS": str(FORCE_DELETE_AFTER)},
        namespaces=(namespace,),
    )
    new = job_driver.wait_running_pods(
        namespace, "llm", 4, restart=1, timeout=FORCE_DELETE_AFTER + BACKOFF + 30
    )
    recovered = time.monotonic() - started
    assert node not in {p["spec"]["nodeName"] for p in new}
    assert all(
        p["metadata"]["labels"]["torchfleet.dev/restart"] == "1"
        for p in job_driver.pods(namespace, "llm")
    ), "no pod of the old gang may be left"
    print(f"gang recreated {recovered:.1f}s after the force-deleting operator started")


def test_a_lost_node_restarts_a_fixed_gang_without_spending_its_backoff_limit(
    operator_factory, job_driver, namespace, dead_nodes
):
    # backoffLimit 0: a single failure counted against it would fail the job.
    operator_factory(
        env={"TORCHFLEET_OPERATOR_NODE_LOSS_FORCE_DELETE_SECONDS": str(FORCE_DELETE_AFTER)},
        namespaces=(namespace,),
    )
    job_driver.create(namespace, "llm", spec(workers=2, runPolicy={"backoffLimit": 0}))
    job_driver.wait_running_pods(namespace, "llm", 3)
    job_driver.wait_phase(namespace, "llm", "Running")
    lost = time.monotonic()
    victim, node = dead_nodes.kill_node_of(job_driver, namespace, "llm-worker-1")

    restarting = job_driver.wait_for(
        "a gang restart for the lost node",
        lambda: (s := job_driver.status(namespace, "llm")).get("restartCount", 0) >= 1 and s,
        timeout=60,
    )
    assert (find(restarting["conditions"], "Restarting") or {}).get("reason") == "NodeLost", (
        restarting
    )
    # The dead kubelet never confirms the deletion: the operator force-deletes
    # the stuck pod, and not before the node has been lost for the grace.
    job_driver.wait_for(
        "the stuck pod force-deleted",
        lambda: (
            (pod := job_driver.get_core(namespace, "pods", "llm-worker-1")) is None
            or pod["metadata"]["uid"] != victim["metadata"]["uid"]
        ),
        timeout=FORCE_DELETE_AFTER + 60,
    )
    # Less at most the second the node's Ready condition's whole-second
    # lastTransitionTime (the loss's start) drops.
    assert time.monotonic() - lost >= FORCE_DELETE_AFTER - 1
    new = job_driver.wait_running_pods(namespace, "llm", 3, restart=1, timeout=60)
    assert node not in {p["spec"]["nodeName"] for p in new}
    status = job_driver.wait_phase(namespace, "llm", "Running")
    assert status["restartCount"] == 1 and status["disruptions"] == 1, status
    job_driver.succeed_pod(namespace, "llm-master-0")
    done = job_driver.wait_phase(namespace, "llm", "Succeeded")
    assert done["disruptions"] == 1 and done["restartCount"] == 1, done
