"""The Helm chart installed for real: ``helm install`` with the operator image
built from the repository's Dockerfile (dev/realnode/operator-image.sh),
placed on the real node by the chart's nodeSelector and tolerations.

Two replicas of the chart's Deployment run there under the real kubelet and
containerd, as the chart's ServiceAccount, with its probes and its security
context (non-root, read-only root filesystem); both become Ready, one holds
the chart's Lease, and the leader reconciles a busybox TrainingJob to
Succeeded, its pods created by the chart's ServiceAccount from a pod's
address. ``helm uninstall`` then leaves no operator object behind; the CRD
stays, as the chart documents (Helm never deletes crds/).

The pods reach the API server at the node's address, given as
KUBERNETES_SERVICE_HOST/_PORT (no kube-proxy on this machine: see
``RealNode.api_server``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.test_training import wait_job
from tests.fixtures.cluster import audit_events
from tests.fixtures.helm import Helm, Release
from tests.fixtures.poll import wait_for
from tests.fixtures.realnode import REAL_NODE_ONLY, REAL_NODE_PLACEMENT, busybox_job
from torchfleet_operator.status.conditions import is_true

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, REAL_NODE_ONLY, pytest.mark.timeout(900)]

CRD = "customresourcedefinition/trainingjobs.torchfleet.dev"
# What the chart renders in its namespace (replicas > 1: the PDB; watched
# namespace: the Role and binding; leader election: its Role and binding).
NAMESPACED_KINDS = (
    "deployments,replicasets,pods,services,endpointslices,serviceaccounts,roles,rolebindings,"
    "poddisruptionbudgets,configmaps"
)
CLUSTER_KINDS = "clusterroles,clusterrolebindings"


def chart_values(image: str, namespace: str, api_server: tuple[str, int]) -> dict[str, Any]:
    repository, tag = image.rsplit(":", 1)
    host, port = api_server
    return {
        # Imported into the node's containerd: there is no registry to pull from.
        "operator.image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "operator.replicas": 2,
        "operator.watchNamespaces": [namespace],
        "operator.nodeSelector": REAL_NODE_PLACEMENT["nodeSelector"],
        "operator.tolerations": REAL_NODE_PLACEMENT["tolerations"],
        "operator.extraEnv": [
            {"name": "KUBERNETES_SERVICE_HOST", "value": host},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(port)},
        ],
    }


def operator_pods(cluster: Any, release: Release) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={release.name},app.kubernetes.io/component=operator"
    return list(cluster.get_json("pods", "-n", release.namespace, "-l", selector)["items"])


def ready(pod: dict[str, Any]) -> bool:
    return is_true(pod["status"].get("conditions"), "Ready")


def release_objects(cluster: Any, release: Release) -> list[str]:
    """Every operator object of the release still there: by the chart's
    instance label, and the Lease by its name (the operator writes it)."""
    label = f"app.kubernetes.io/instance={release.name}"
    where = ["-n", release.namespace]
    found = cluster.kubectl("get", NAMESPACED_KINDS, *where, "-l", label, "-o", "name").stdout
    found += cluster.kubectl("get", CLUSTER_KINDS, "-l", label, "-o", "name").stdout
    lease = f"{release.fullname}-operator"
    found += cluster.kubectl(
        "get", "lease", lease, *where, "--ignore-not-found", "-o", "name"
    ).stdout
    return found.split()


def report(cluster: Any, namespace: str) -> str:
    pods = cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide").stdout
    events = cluster.kubectl("get", "events", "-n", namespace).stdout
    logs = cluster.kubectl(
        "logs",
        "-n",
        namespace,
        "-l",
        "app.kubernetes.io/component=operator",
        "--tail=30",
        check=False,
    )
    return f"{pods}\n{events}\n{logs.stdout}{logs.stderr}"


def test_the_chart_runs_the_operator_on_the_real_node_and_uninstalls_clean(
    cluster: Any,
    helm: Helm,
    helm_release: Any,
    namespace: str,
    real_node: Any,
    operator_image: str,
) -> None:
    release = helm_release(
        namespace, chart_values(operator_image, namespace, real_node.api_server())
    )
    pods = wait_for(
        "both operator replicas Ready on the real node",
        lambda: (p := operator_pods(cluster, release)) and len(p) == 2 and all(map(ready, p)) and p,
        240,
        interval=1,
        explain=lambda: report(cluster, namespace),
    )
    deployment = f"{release.fullname}-operator"
    for pod in pods:
        spec = pod["spec"]
        assert spec["nodeName"] == real_node.name
        assert spec["serviceAccountName"] == release.fullname
        (owner,) = pod["metadata"]["ownerReferences"]
        replicaset = cluster.get_json("replicaset", owner["name"], "-n", namespace)
        assert replicaset["metadata"]["ownerReferences"][0]["name"] == deployment
        (container,) = spec["containers"]
        assert container["image"] == operator_image
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
        (status,) = pod["status"]["containerStatuses"]
        assert status["containerID"].startswith("containerd://") and status["ready"]

    # The process is the image's non-root user on a read-only root.
    probe = cluster.kubectl(
        "exec",
        "-n",
        namespace,
        pods[0]["metadata"]["name"],
        "--",
        "python",
        "-c",
        "import os; print(os.getuid(), os.getgid()); open('/probe', 'w')",
        check=False,
    )
    assert probe.stdout.split() == ["65532", "65532"], probe
    assert "Read-only file system" in probe.stderr, probe

    names = {p["metadata"]["name"] for p in pods}

    def leader() -> str | None:
        lease = cluster.get_json("lease", deployment, "-n", namespace)
        holder = lease["spec"].get("holderIdentity") or ""
        return holder.rsplit("_", 1)[0] if holder.rsplit("_", 1)[0] in names else None

    wait_for(
        "one replica to hold the Lease", leader, 60, explain=lambda: report(cluster, namespace)
    )

    job = busybox_job("hello", "echo hello from the real node", "32Mi")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job))
    try:
        done = wait_job(cluster, namespace, "hello", {"Succeeded", "Failed"}, timeout=180)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{report(cluster, namespace)}") from None
    assert done["status"]["phase"] == "Succeeded", done["status"]
    # The job's pods were created by the chart's ServiceAccount, from an
    # operator pod's address: the operator in the pod did it.
    account = f"system:serviceaccount:{namespace}:{release.fullname}"
    creates = [
        e
        for e in audit_events(cluster, account)
        if e["verb"] == "create"
        and e["objectRef"]["resource"] == "pods"
        and e["objectRef"].get("namespace") == namespace
    ]
    pod_ips = {p["status"]["podIP"] for p in pods}
    assert creates and {e["sourceIPs"][0] for e in creates} <= pod_ips, creates

    helm.run(
        "uninstall", release.name, "--namespace", namespace, "--wait", kubeconfig=cluster.kubeconfig
    )
    wait_for(
        "no operator object of the release left",
        lambda: release_objects(cluster, release) == [],
        120,
        interval=0.5,
        explain=lambda: str(release_objects(cluster, release)),
    )
    # Helm never deletes what it installed from crds/: users' jobs survive.
    assert cluster.kubectl("get", CRD, "-o", "name").stdout.strip()
    assert (
        cluster.get_json("trainingjob", "hello", "-n", namespace)["status"]["phase"] == "Succeeded"
    )
