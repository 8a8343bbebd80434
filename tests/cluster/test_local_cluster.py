"""The test cluster is real: scheduling, garbage collection, admission and
on-demand pod/node behaviour all come from the actual control plane + KWOK."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.cluster import Cluster
from tests.fixtures.poll import wait_for
from torchfleet_operator.status.conditions import find

pytestmark = pytest.mark.cluster
REPO = Path(__file__).parents[2]
FAKE_NODE = json.loads((REPO / "dev/cluster/fake-gpu-node.json").read_text())


def pod_manifest(
    name: str, gpus: int = 0, labels: dict[str, str] | None = None, **meta: Any
) -> str:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}, **meta},
            "spec": {
                "containers": [{"name": "main", "image": "busybox", "resources": resources}],
                # Land only on KWOK's fake nodes, never on a local e2e node.
                "nodeSelector": {"torchfleet.dev/fake-node": "true"},
            },
        }
    )


def pod(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    return cluster.get_json("pod", name, "-n", ns)


def phase_is(
    cluster: Cluster, ns: str, name: str, phase: str
) -> Callable[[], dict[str, Any] | None]:
    def probe() -> dict[str, Any] | None:
        p = pod(cluster, ns, name)
        return p if p["status"].get("phase") == phase else None

    return probe


def test_pod_with_8_gpus_runs_on_a_fake_gpu_node(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=pod_manifest("eight", gpus=8))
    running = wait_for("the 8-GPU pod to run", phase_is(cluster, namespace, "eight", "Running"))
    node = cluster.get_json("node", running["spec"]["nodeName"])
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert running["status"]["containerStatuses"][0]["state"]["running"]


def test_pod_with_9_gpus_is_unschedulable(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=pod_manifest("nine", gpus=9))

    def unschedulable() -> dict[str, Any] | None:
        conditions = pod(cluster, namespace, "nine")["status"].get("conditions", [])
        return next((c for c in conditions if c.get("reason") == "Unschedulable"), None)

    condition = wait_for("the scheduler to mark the 9-GPU pod Unschedulable", unschedulable)
    assert condition["type"] == "PodScheduled" and condition["status"] == "False"
    assert "nvidia.com/gpu" in condition["message"]
    assert pod(cluster, namespace, "nine")["status"]["phase"] == "Pending"


def test_garbage_collector_deletes_owned_pods(cluster: Cluster, namespace: str) -> None:
    owner = json.loads(
        cluster.kubectl("create", "configmap", "owner", "-n", namespace, "-o", "json").stdout
    )
    ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
    }
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=pod_manifest("owned", ownerReferences=[ref])
    )
    wait_for("the owned pod to run", phase_is(cluster, namespace, "owned", "Running"))
    cluster.kubectl("delete", "configmap", "owner", "-n", namespace)

    def gone() -> bool:
        return cluster.kubectl("get", "pod", "owned", "-n", namespace, check=False).returncode != 0

    wait_for("the garbage collector to delete the owned pod", gone)


@pytest.mark.parametrize(("exit_code", "reason"), [(137, "OOMKilled"), (3, "Error")])
def test_on_demand_failure_sets_exit_code(
    cluster: Cluster, namespace: str, exit_code: int, reason: str
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=pod_manifest("victim"))
    wait_for("the pod to run", phase_is(cluster, namespace, "victim", "Running"))
    cluster.kubectl(
        "annotate",
        "pod",
        "victim",
        "-n",
        namespace,
        f"torchfleet.dev/kwok-exit-code={exit_code}",
        f"torchfleet.dev/kwok-reason={reason}",
    )
    cluster.kubectl("label", "pod", "victim", "-n", namespace, "torchfleet.dev/kwok-fail=true")
    failed = wait_for("the pod to fail", phase_is(cluster, namespace, "victim", "Failed"))
    terminated = failed["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == exit_code
    assert terminated["reason"] == reason


def test_on_demand_success(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=pod_manifest("done"))
    wait_for("the pod to run", phase_is(cluster, namespace, "done", "Running"))
    cluster.kubectl("label", "pod", "done", "-n", namespace, "torchfleet.dev/kwok-succeed=true")
    succeeded = wait_for("the pod to succeed", phase_is(cluster, namespace, "done", "Succeeded"))
    assert succeeded["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0


@pytest.fixture
def spare_node(cluster: Cluster) -> Any:
    """A node of its own, so making it NotReady disturbs no other test."""
    name = f"gpu-chaos-{uuid.uuid4().hex[:6]}"
    node = json.loads(json.dumps(FAKE_NODE).replace("NODE_NAME", name))
    cluster.kubectl("apply", "-f", "-", input=json.dumps(node))
    yield name
    cluster.kubectl("delete", "node", name, "--wait=false", check=False)


def node_ready(cluster: Cluster, name: str) -> str | None:
    ready = find(cluster.get_json("node", name).get("status", {}).get("conditions"), "Ready")
    return ready["status"] if ready else None


def test_on_demand_node_not_ready(cluster: Cluster, spare_node: str) -> None:
    wait_for("the new node to become Ready", lambda: node_ready(cluster, spare_node) == "True")
    cluster.kubectl("label", "node", spare_node, "torchfleet.dev/kwok-not-ready=true")
    wait_for("the node to report NotReady", lambda: node_ready(cluster, spare_node) == "False")

    def tainted() -> bool:
        taints = cluster.get_json("node", spare_node)["spec"].get("taints", [])
        return any(t["key"] == "node.kubernetes.io/not-ready" for t in taints)

    # The node-lifecycle controller (a real controller-manager) reacts too.
    wait_for("the node-lifecycle controller to taint the node not-ready", tainted)


def test_apiserver_rejects_invalid_object_naming_the_field(
    cluster: Cluster, namespace: str
) -> None:
    bad = json.loads(pod_manifest("bad"))
    bad["spec"]["containers"][0]["name"] = "Not_A_DNS_Label"
    out = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(bad), check=False)
    assert out.returncode != 0
    assert "spec.containers[0].name" in out.stderr
    assert "Invalid value" in out.stderr


def _fake_kubelet() -> Any:
    """dev/cluster/fake_kubelet.py's deleter for this local cluster (None: not ours)."""
    from tests.fixtures.cluster import _external_kubeconfig, _load_localcluster

    if _external_kubeconfig():
        return None
    local = _load_localcluster().LocalCluster()
    spec = importlib.util.spec_from_file_location(
        "fake_kubelet", REPO / "dev/cluster/fake_kubelet.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FakeKubelet(module.Api(local.root, local.ports.apiserver))


def test_a_deletion_is_confirmed_for_that_pod_and_never_for_a_new_one_of_its_name(
    cluster: Cluster, namespace: str
) -> None:
    """As a kubelet: deletions complete (finalizers too), guarded by the pod's UID.
    KWOK's own delete step went by name and, run late, removed the pod that had
    taken the name since, which made a new gang lose a pod."""
    kubelet = _fake_kubelet()
    if kubelet is None:
        pytest.skip("an external cluster: its kubelets confirm deletions")
    held = pod_manifest("rank-0", finalizers=["torchfleet.dev/test-hold"])
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=held)
    old = wait_for("the pod to run", phase_is(cluster, namespace, "rank-0", "Running"))
    cluster.kubectl("delete", "pod", "rank-0", "-n", namespace, "--wait=false")
    wait_for(
        "the deletion to complete, finalizer and all",
        lambda: not cluster.get_json("pods", "-n", namespace)["items"],
    )
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=held)
    new = wait_for("the new pod to run", phase_is(cluster, namespace, "rank-0", "Running"))

    # The old pod's terminating events, delivered late (still held by its finalizer,
    # then released): nothing happens to the new pod.
    terminating = {**old["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}
    released = {k: v for k, v in terminating.items() if k != "finalizers"}
    for stale in (terminating, released):
        kubelet.handle({**old, "metadata": stale})
        now = pod(cluster, namespace, "rank-0")["metadata"]
        assert (now["uid"], now["finalizers"]) == (
            new["metadata"]["uid"],
            ["torchfleet.dev/test-hold"],
        )
    kubelet.handle(pod(cluster, namespace, "rank-0"))  # not terminating: left alone too
    assert pod(cluster, namespace, "rank-0")["metadata"]["uid"] == new["metadata"]["uid"]


# Every port of every component, and the state directory, of the local cluster
# that localcluster.py would start with this process's environment.
CLUSTER_LAYOUT = """
import json, sys
from dataclasses import asdict
sys.path.insert(0, "dev/cluster")
import kueue, localcluster, schedulers
ports = {
    **asdict(localcluster.Ports()),
    **{f"kueue-{k}": v for k, v in asdict(kueue.KueuePorts()).items()},
    **{f"gang-{k}": v for k, v in asdict(schedulers.SchedulerPorts()).items()},
}
print(json.dumps({"state": str(localcluster.LocalCluster().root), "ports": ports}))
"""


def cluster_layout(**env: str) -> dict[str, Any]:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TORCHFLEET_CLUSTER_DIR", "TORCHFLEET_CLUSTER_PORT_OFFSET")
    }
    out = subprocess.run(
        [sys.executable, "-c", CLUSTER_LAYOUT],
        env={**base, **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout))


def test_the_e2e_tiers_second_cluster_shares_no_port_and_no_state_with_the_first() -> None:
    """dev/test-tiers.sh runs the e2e tier on a second local cluster beside the
    cluster tier's (or a demo's) on the same machine: every port of every
    component moves by its offset, none lands on one of the first's, and the
    state lives elsewhere."""
    first = cluster_layout()
    second = cluster_layout(
        TORCHFLEET_CLUSTER_DIR=".cluster-e2e", TORCHFLEET_CLUSTER_PORT_OFFSET="1000"
    )
    assert first["state"] == str(REPO / ".cluster")
    assert second["state"] == str(REPO / ".cluster-e2e")
    assert second["ports"] == {name: port + 1000 for name, port in first["ports"].items()}
    assert not set(first["ports"].values()) & set(second["ports"].values())
