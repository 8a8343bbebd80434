"""A plain pod on the real node: the kubelet and containerd, not the node agent,
run it, and what they report reaches the API server.

The pod runs the static-busybox image made without a registry
(dev/realnode/build.sh) in two containers. One reads its node's name through
the downward API and writes it to its termination-message file, then exits 0;
the other prints a line and exits 3 with ``FallbackToLogsOnError``. When they
exit, the kubelet reads the file (or the log's tail) and writes it, with the
exit code and reason containerd gave, into the pod's status.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.fixtures.poll import wait_for
from tests.fixtures.realnode import REAL_NODE_ONLY, REAL_NODE_PLACEMENT

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, REAL_NODE_ONLY]


def _container(name: str, script: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": "torchfleet.local/busybox:1.35",
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
        **extra,
    }


def _pod(name: str) -> dict[str, Any]:
    downward_node = {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            **REAL_NODE_PLACEMENT,
            "restartPolicy": "Never",
            "containers": [
                _container(
                    "report",
                    'printf "on %s" "$NODE" > /dev/termination-log',
                    env=[downward_node],
                ),
                _container(
                    "fails",
                    "echo last words; exit 3",
                    terminationMessagePolicy="FallbackToLogsOnError",
                ),
            ],
        },
    }


def test_plain_pod_runs_on_the_real_kubelet(cluster, namespace, real_node):
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(_pod("plain")))

    def finished() -> dict[str, Any] | None:
        pod = cluster.get_json("pod", "plain", "-n", namespace)
        # The phase can trail the containers' states by one status write.
        statuses = pod["status"].get("containerStatuses", [])
        exited = len(statuses) == 2 and all("terminated" in s["state"] for s in statuses)
        return pod if exited and pod["status"].get("phase") in ("Succeeded", "Failed") else None

    def events() -> str:
        return cluster.kubectl("get", "events", "-n", namespace, "-o", "wide").stdout

    pod = wait_for("the pod to finish on the real node", finished, 120, explain=events)
    assert pod["spec"]["nodeName"] == real_node.name
    assert pod["status"]["phase"] == "Failed"
    statuses = {s["name"]: s for s in pod["status"]["containerStatuses"]}
    # containerd ran them, not the node agent.
    assert all(s["containerID"].startswith("containerd://") for s in statuses.values())

    report = statuses["report"]["state"]["terminated"]
    assert (report["exitCode"], report["reason"]) == (0, "Completed")
    assert report["message"] == f"on {real_node.name}"

    fails = statuses["fails"]["state"]["terminated"]
    assert (fails["exitCode"], fails["reason"]) == (3, "Error")
    assert fails["message"] == "last words\n"
    # The API server reads the log from the kubelet itself.
    logs = cluster.kubectl("logs", "plain", "-c", "fails", "-n", namespace).stdout
    assert logs == "last words\n"
