"""A plain pod on the real node: the kubelet and containerd, not the node agent,
run it, and what they report reaches the API server.

The pod runs the static-busybox image made without a registry
(dev/realnode/build.sh) in two containers. One reads its node's name through
the downward API and writes it to its termination-message file, then exits 0;
the other prints a line and exits 3 with ``FallbackToLogsOnError``. When they
exit, the kubelet reads the file (or the log's tail) and writes it, with the
exit code and reason containerd gave, into the pod's status.

A TrainingJob's gang on the real node: the operator reads what the real
kubelet reports. Its first worker breaches a real memory limit; the kernel
OOM-kills the worker's child, containerd says OOMKilled (with the worker's own
exit code), and the operator counts a gang restart whose message says so; the
second gang succeeds.

Two pods on the real node find each other as a TrainingJob's ranks do: by
their per-pod names under a headless Service
(``<hostname>.<subdomain>.<namespace>.svc``), which the node's CoreDNS serves
from the API (dev/realnode/README.md), and connect over TCP.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.e2e.test_training import wait_job
from tests.fixtures.poll import wait_for
from tests.fixtures.realnode import (
    BUSYBOX_IMAGE,
    REAL_NODE_ONLY,
    REAL_NODE_PLACEMENT,
    busybox_job,
)
from torchfleet_contract import pod as contract

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, REAL_NODE_ONLY]


def _container(name: str, script: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": BUSYBOX_IMAGE,
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


# The gang's script, by node rank and gang generation. Generation 0: the
# worker's child fills a block buffer twice the limit until the kernel
# OOM-kills it, and the worker exits 1 as torchrun does when it loses a worker
# that way (the kubelet still says OOMKilled: the policy judges it a kill, 137);
# the master waits for the gang restart that follows. Generation 1 exits 0.
GANG_SCRIPT = f"""
if [ "${contract.RESTART_COUNT}" = 0 ]; then
  if [ "${contract.PET_NODE_RANK}" = 1 ]; then
    dd if=/dev/zero of=/dev/null bs=96M count=1 || exit 1
  fi
  exec sleep 600
fi
"""


def _pods_report(cluster: Any, namespace: str) -> str:
    """What a failure needs: each pod's env, container states and log, the events."""
    lines = []
    for pod in cluster.get_json("pods", "-n", namespace)["items"]:
        name = pod["metadata"]["name"]
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
        states = [s["state"] for s in pod["status"].get("containerStatuses", [])]
        log = cluster.kubectl("logs", name, "-n", namespace, check=False).stdout
        lines.append(f"{name}: {states}\n  env {env}\n  log {log!r}")
    lines.append(cluster.kubectl("get", "events", "-n", namespace).stdout)
    return "\n".join(lines)


def test_an_oom_kill_on_the_real_kubelet_restarts_the_gang(
    cluster, e2e_namespace, real_node, e2e_operator
):
    namespace = e2e_namespace
    # ExitCode: exit 1 fails the job, a kill (137) restarts the gang.
    policy = {"restartPolicy": "ExitCode", "backoffLimit": 2}
    job = busybox_job("oom", GANG_SCRIPT, "48Mi", runPolicy=policy)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job))
    try:
        done = wait_job(cluster, namespace, "oom", {"Succeeded", "Failed"}, timeout=240)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{_pods_report(cluster, namespace)}") from None
    status = done["status"]
    assert status["phase"] == "Succeeded", status
    # One counted restart, not a failed job: the worker's exit 1 was judged a
    # kill (137) because the real kubelet said OOMKilled, as its event says.
    assert status["restartCount"] == 1 and status["countedRestarts"] == 1, status
    failed = [
        e
        for e in cluster.get_json("events", "-n", namespace)["items"]
        if e["reason"] == "PodFailed" and e["involvedObject"]["kind"] == "TrainingJob"
    ]
    assert failed and "exit code 1: OOMKilled" in failed[0]["message"], failed
    pods = cluster.get_json("pods", "-n", namespace)["items"]
    assert pods and {p["spec"]["nodeName"] for p in pods} == {real_node.name}
    assert all(
        s["containerID"].startswith("containerd://")
        for p in pods
        for s in p["status"]["containerStatuses"]
    )


# Two pods behind a headless Service, named by hostname and subdomain as a
# TrainingJob's pods are (the master's <job>-master-0.<job>.<namespace>.svc).
PEERS_SERVICE = "peers"
PEERS_PORT = 7777


def _peer(name: str, script: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": PEERS_SERVICE}},
        "spec": {
            **REAL_NODE_PLACEMENT,
            "hostname": name,
            "subdomain": PEERS_SERVICE,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [_container("main", script)],
        },
    }


def test_pods_on_the_real_node_reach_each_other_by_name(cluster, namespace, real_node):
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": PEERS_SERVICE},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"app": PEERS_SERVICE},
            "ports": [{"name": "peer", "port": PEERS_PORT, "protocol": "TCP"}],
        },
    }
    # The server answers every connection with its hostname; the client waits.
    serve = f"while true; do busybox nc -l -p {PEERS_PORT} -e echo hello from $(hostname); done"
    objects = [service, _peer("server", serve), _peer("client", "exec sleep 3600")]
    for obj in objects:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(obj))

    def explain() -> str:
        events = cluster.kubectl("get", "events", "-n", namespace, "-o", "wide").stdout
        coredns = (real_node.cluster.logs / "coredns.log").read_text()[-4000:]
        return f"{events}\nCoreDNS's log:\n{coredns}"

    def running(name: str) -> dict[str, Any] | None:
        pod = cluster.get_json("pod", name, "-n", namespace)
        return pod if pod["status"].get("phase") == "Running" else None

    server = wait_for(
        "the server on the real node", lambda: running("server"), 120, explain=explain
    )
    wait_for("the client on the real node", lambda: running("client"), 120, explain=explain)

    def in_client(*command: str) -> subprocess.CompletedProcess[str]:
        return cluster.kubectl("exec", "client", "-n", namespace, "--", *command, check=False)

    # The kubelet gave the pod the node's CoreDNS and the cluster's search list.
    resolv = in_client("cat", "/etc/resolv.conf").stdout.splitlines()
    assert f"nameserver {real_node.gateway}" in resolv, resolv
    assert f"search {namespace}.svc.cluster.local svc.cluster.local cluster.local" in resolv

    # The name a rendezvous uses, through the search list (busybox's ping
    # resolves as the C library does, which torch's rendezvous uses; its
    # nslookup would not search), to the server pod's IP.
    name = f"server.{PEERS_SERVICE}.{namespace}.svc"

    def resolved() -> str | None:
        out = in_client("busybox", "ping", "-c", "1", "-W", "2", name).stdout
        first = out.splitlines()[0] if out else ""
        return first.split("(")[1].split(")")[0] if first.startswith("PING") else None

    address = wait_for(f"{name} to resolve", resolved, 60, explain=explain)
    assert address == server["status"]["podIP"]
    # Any other name is NXDOMAIN at once: the node's CoreDNS has no upstream.
    missing = in_client("busybox", "nslookup", "torchfleet.invalid")
    assert "NXDOMAIN" in missing.stdout, missing

    # And the client reaches the server over TCP by that name.
    def greeted() -> str:
        return in_client("busybox", "nc", "-w", "5", name, str(PEERS_PORT)).stdout

    assert wait_for(f"an answer from {name}", greeted, 60, explain=explain) == "hello from server\n"
