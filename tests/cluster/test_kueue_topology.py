"""Topology-aware placement through Kueue (TAS): spec.scheduling.topology asks
Kueue to pack the gang into one rack, against a real Kueue and a Topology of
KWOK's fake 8-GPU nodes in blocks and racks.

The nodes, the Topology, its ResourceFlavor and the ClusterQueue are made once
for the module; each test has its own namespace and LocalQueue, and ends with
its pods gone from the nodes, so the next test finds them all free.

Kueue 0.10 (``make test-kueue-oldest``) is skipped: its Topology is only
v1alpha1, its TopologyAwareScheduling gate alpha and off by default, and it has
no PodSet groups (master and workers could be put in different racks).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.fixtures.cluster import node_ready
from tests.fixtures.gang import BLOCK_LABEL, GPU, POOL_LABEL, gpu_node
from tests.fixtures.kueue import KueueObjects, job_condition, wait_condition, workloads
from tests.fixtures.poll import wait_for

pytestmark = pytest.mark.cluster

RACK_LABEL = "torchfleet.dev/test-rack"
HOST_LABEL = "kubernetes.io/hostname"
# rack-0 holds a 4-node gang; rack-1 and rack-2 hold two nodes each, so a gang
# of five fits in no rack, and only block-0 (rack-0 + rack-1) holds it.
RACKS = {"rack-0": ("block-0", 4), "rack-1": ("block-0", 2), "rack-2": ("block-1", 2)}


@dataclass(frozen=True)
class TasPool:
    cluster_queue: str
    nodes: dict[str, dict[str, str]]  # node -> its labels

    def racks_of(self, pods: list[dict[str, Any]]) -> set[str]:
        return {self.nodes[p["spec"]["nodeName"]][RACK_LABEL] for p in pods}

    def blocks_of(self, pods: list[dict[str, Any]]) -> set[str]:
        return {self.nodes[p["spec"]["nodeName"]][BLOCK_LABEL] for p in pods}


def _topology_served(cluster: Any, api: str) -> bool:
    found = cluster.kubectl("get", "crd", "topologies.kueue.x-k8s.io", "-o", "json", check=False)
    if found.returncode:
        return False
    crd = json.loads(found.stdout)
    version = api.split("/")[1]
    return any(v["name"] == version and v["served"] for v in crd["spec"]["versions"])


@pytest.fixture(scope="module")
def tas_pool(cluster: Any, kueue: str) -> Iterator[TasPool]:
    if not _topology_served(cluster, kueue):
        pytest.skip(
            f"this Kueue serves no Topology in {kueue} (Kueue 0.10: only v1alpha1; its TAS "
            "is alpha, off by default, and has no PodSet groups); TAS is tested on 0.17"
        )
    pool = f"tas-{uuid.uuid4().hex[:6]}"
    nodes: list[dict[str, Any]] = []
    for rack, (block, count) in RACKS.items():
        for i in range(count):
            node = gpu_node(f"{pool}-{rack}-{i}", pool, block)
            node["metadata"]["labels"][RACK_LABEL] = rack
            nodes.append(node)
    cluster.kubectl(
        "create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes})
    )
    wait_for(
        f"the KWOK nodes of {pool} Ready",
        lambda: (
            sum(map(node_ready, cluster.get_json("nodes", "-l", f"{POOL_LABEL}={pool}")["items"]))
            == len(nodes)
        ),
        60,
    )
    objects = KueueObjects(cluster, kueue)
    try:
        topology = objects.topology("racks", [BLOCK_LABEL, RACK_LABEL, HOST_LABEL])
        taint = {"key": POOL_LABEL, "operator": "Equal", "value": pool, "effect": "NoSchedule"}
        flavor = objects.flavor("tas", {POOL_LABEL: pool}, topology, [taint])
        cq = objects.cluster_queue("tas", [(flavor, {GPU: 8 * len(nodes)})])
        yield TasPool(cq, {n["metadata"]["name"]: n["metadata"]["labels"] for n in nodes})
    finally:
        objects.cleanup()
        cluster.kubectl(
            "delete", "nodes", "-l", f"{POOL_LABEL}={pool}", "--wait=false", check=False
        )


@pytest.fixture
def tas_queue(
    tas_pool: TasPool,
    kueue_objects: KueueObjects,
    cluster: Any,
    job_driver: Any,
    namespace: str,
) -> Iterator[str]:
    """The test's LocalQueue; afterwards its jobs and pods are deleted and waited
    out (Workloads too: Kueue releases a Workload's topology usage with it)."""
    yield kueue_objects.local_queue(namespace, "racks", tas_pool.cluster_queue)
    for job in job_driver.raw.request("GET", job_driver.job_path(namespace))["items"]:
        job_driver.delete(namespace, job["metadata"]["name"])
    # Nothing runs on KWOK's nodes: no grace to wait out before the next test;
    # nor the garbage collector's latency for the Workloads.
    cluster.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force")
    cluster.kubectl("delete", "workloads.kueue.x-k8s.io", "--all", "-n", namespace, "--wait=false")
    job_driver.wait_for(
        "the test's pods and Workloads gone",
        lambda: not job_driver.pods(namespace) and not workloads(job_driver, namespace),
        60,
    )


def rack_job(queue: str, mode: str, nodes: int) -> dict[str, Any]:
    return {
        "command": ["python", "train.py"],
        "resources": {"gpus": 8},
        "master": {"template": {"spec": {}}},
        "worker": {"replicas": nodes - 1, "template": {"spec": {}}},
        "scheduling": {"queueName": queue, "topology": {"key": RACK_LABEL, "mode": mode}},
    }


def test_a_required_rack_puts_the_gang_in_the_one_rack_with_room(
    tas_pool, tas_queue, shared_operator, job_driver, namespace
):
    job_driver.create(namespace, "packed", rack_job(tas_queue, "Required", 4))
    pods = job_driver.wait_running_pods(namespace, "packed", 4, timeout=90)
    # 4 of the 8 nodes: only rack-0 holds them all (by chance: 1 in 70).
    assert tas_pool.racks_of(pods) == {"rack-0"}, [p["spec"]["nodeName"] for p in pods]
    assert len({p["spec"]["nodeName"] for p in pods}) == 4
    for pod in pods:
        # Created on the node Kueue assigned, marked as a TAS pod.
        assert pod["spec"]["nodeSelector"][HOST_LABEL] == pod["spec"]["nodeName"]
        assert pod["metadata"]["annotations"]["kueue.x-k8s.io/podset-required-topology"] == (
            RACK_LABEL
        )
    (workload,) = workloads(job_driver, namespace)
    requests = [s["topologyRequest"] for s in workload["spec"]["podSets"]]
    assert requests == [{"required": RACK_LABEL, "podSetGroupName": "gang"}] * 2
    job_driver.wait_phase(namespace, "packed", "Running")


def test_a_gang_no_rack_holds_waits_when_required_and_spreads_when_preferred(
    tas_pool, tas_queue, shared_operator, job_driver, namespace
):
    job_driver.create(namespace, "strict", rack_job(tas_queue, "Required", 5))
    waiting = wait_condition(
        job_driver,
        namespace,
        "strict",
        "QuotaReserved",
        lambda c: c["status"] == "False" and "topology" in c.get("message", ""),
        timeout=60,
    )
    # Kueue's own words, e.g. 'couldn't assign flavors to pod set master: topology
    # "racks-..." allows to fit only 4 out of 5 pod(s)'.
    assert "fit" in waiting["message"], waiting
    assert job_driver.status(namespace, "strict")["phase"] == "Pending"

    job_driver.create(namespace, "loose", rack_job(tas_queue, "Preferred", 5))
    pods = job_driver.wait_running_pods(namespace, "loose", 5, timeout=90)
    # No rack holds five: Kueue goes one level up, to the one block that does.
    assert tas_pool.racks_of(pods) == {"rack-0", "rack-1"}
    assert tas_pool.blocks_of(pods) == {"block-0"}
    # The strict gang still has no pod (Kueue's reason may now be the quota
    # the loose one took).
    assert job_driver.pods(namespace, "strict") == []
    assert job_condition(job_driver, namespace, "strict", "QuotaReserved")["status"] == "False"
