"""The node agent on its own, with plain pods: processes really run, report
their exit codes, resolve each other by their headless Service names, get
their volumes, and stop when their pod is deleted."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.e2e import LOCAL_PLACEMENT
from tests.fixtures.e2e import apply_objects as apply
from tests.fixtures.poll import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]


def python_pod(name: str, code: str, **spec: Any) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": "python:3.11",
        "command": ["python", "-c", textwrap.dedent(code)],
    }
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "nodeagent-test"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            **LOCAL_PLACEMENT,
            "containers": [container],
            **spec,
        },
    }


def get_pod(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    return dict(cluster.get_json("pod", name, "-n", namespace))


def wait_phase(
    cluster: Any, namespace: str, name: str, phases: set[str], timeout: float = 90
) -> dict[str, Any]:
    return dict(
        wait_for(
            f"pod {name} in {sorted(phases)}",
            lambda: (
                (pod := get_pod(cluster, namespace, name)).get("status", {}).get("phase") in phases
                and pod
            ),
            timeout,
            0.3,
            explain=lambda: str(get_pod(cluster, namespace, name).get("status")),
        )
    )


def terminated(pod: dict[str, Any]) -> dict[str, Any]:
    return dict(pod["status"]["containerStatuses"][0]["state"]["terminated"])


def test_exit_codes_become_phase_and_container_state(cluster, namespace, node_agent):
    apply(
        cluster,
        namespace,
        python_pod("ok", "print('hello from a pod')"),
        python_pod("fails", "import sys; print('failing', flush=True); sys.exit(3)"),
    )
    ok = wait_phase(cluster, namespace, "ok", {"Succeeded", "Failed"})
    fails = wait_phase(cluster, namespace, "fails", {"Succeeded", "Failed"})

    assert ok["status"]["phase"] == "Succeeded"
    assert terminated(ok)["exitCode"] == 0
    assert terminated(ok)["reason"] == "Completed"
    assert fails["status"]["phase"] == "Failed"
    assert terminated(fails)["exitCode"] == 3
    assert terminated(fails)["reason"] == "Error"
    assert ok["spec"]["nodeName"] in node_agent.nodes
    assert node_agent.logs(namespace, "ok", "main") == ["hello from a pod\n"]
    assert node_agent.logs(namespace, "fails", "main") == ["failing\n"]


def test_env_field_refs_and_var_expansion(cluster, namespace, node_agent):
    code = """
        import os, socket
        for key in ("MY_NAME", "MY_NS", "MY_IP", "MY_NODE", "GREETING", "TEAM"):
            print(f"{key}={os.environ[key]}")
        print(f"HOSTNAME={socket.gethostname()}")
    """
    env = [
        {"name": "MY_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "MY_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "MY_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['team']"}}},
        {"name": "GREETING", "value": "hi $(MY_NAME) on $(MY_NODE)"},
    ]
    pod = python_pod("envpod", code, container={"env": env})
    pod["metadata"]["labels"]["team"] = "ml-platform"
    apply(cluster, namespace, pod)
    done = wait_phase(cluster, namespace, "envpod", {"Succeeded", "Failed"})

    assert done["status"]["phase"] == "Succeeded", node_agent.logs(namespace, "envpod", "main")
    lines = dict(
        line.split("=", 1) for line in node_agent.logs(namespace, "envpod", "main")[0].splitlines()
    )
    node = done["spec"]["nodeName"]
    assert lines == {
        "MY_NAME": "envpod",
        "MY_NS": namespace,
        "MY_IP": done["status"]["podIP"],
        "MY_NODE": node,
        "TEAM": "ml-platform",
        "GREETING": f"hi envpod on {node}",
        "HOSTNAME": "envpod",
    }


def test_headless_service_names_resolve_to_each_pods_own_address(cluster, namespace, node_agent):
    """Two pods of one 'gang' bind the same port (as a trainer's metrics port
    would) and find each other by their per-pod DNS names."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "gang"},
        "spec": {
            "clusterIP": "None",
            "selector": {"app": "nodeagent-test"},
            "publishNotReadyAddresses": True,
        },
    }
    server = """
        import socket
        with socket.create_server(("0.0.0.0", 9400)) as srv:
            conn, (peer, _) = srv.accept()
            print("from", peer, conn.recv(64).decode())
    """
    client = f"""
        import socket, time
        names = ["server.gang.{namespace}.svc.cluster.local", "server.gang.{namespace}.svc",
                 "server.gang", "client.gang"]
        for name in names:
            print(name, socket.gethostbyname(name))
        blocker = socket.create_server(("0.0.0.0", 9400))  # same port, own network
        for _ in range(100):
            try:
                conn = socket.create_connection(("server.gang", 9400), timeout=2)
                break
            except OSError:
                time.sleep(0.2)
        conn.sendall(b"hello")
        conn.close()
    """
    apply(
        cluster,
        namespace,
        service,
        python_pod("server", server, hostname="server", subdomain="gang"),
        python_pod("client", client, hostname="client", subdomain="gang"),
    )
    server_pod = wait_phase(cluster, namespace, "server", {"Succeeded", "Failed"})
    client_pod = wait_phase(cluster, namespace, "client", {"Succeeded", "Failed"})

    client_log = node_agent.logs(namespace, "client", "main")[0]
    assert client_pod["status"]["phase"] == "Succeeded", client_log
    assert server_pod["status"]["phase"] == "Succeeded", node_agent.logs(
        namespace, "server", "main"
    )
    server_ip, client_ip = server_pod["status"]["podIP"], client_pod["status"]["podIP"]
    assert server_ip != client_ip
    resolved = dict(line.split() for line in client_log.splitlines())
    assert resolved == {
        f"server.gang.{namespace}.svc.cluster.local": server_ip,
        f"server.gang.{namespace}.svc": server_ip,
        "server.gang": server_ip,
        "client.gang": client_ip,
    }
    assert node_agent.logs(namespace, "server", "main") == [f"from {client_ip} hello\n"]
    # The machine's own resolver is untouched.
    assert "gang" not in Path("/etc/hosts").read_text()


def test_volumes_pvc_emptydir_shm_and_configmap(cluster, namespace, node_agent):
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "ckpt"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "script"},
        "data": {"message.txt": "from a configmap"},
    }
    code = """
        import os
        open("/ckpt/step-1", "w").write("saved")
        open("/scratch/tmp", "w").write("scratch")
        shm = os.statvfs("/dev/shm")
        print("shm_bytes", shm.f_blocks * shm.f_frsize)
        print("config", open("/config/message.txt").read())
    """
    volumes = [
        {"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}},
        {"name": "scratch", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "128Mi"}},
        {"name": "config", "configMap": {"name": "script"}},
    ]
    mounts = [
        {"name": "ckpt", "mountPath": "/ckpt"},
        {"name": "scratch", "mountPath": "/scratch"},
        {"name": "shm", "mountPath": "/dev/shm"},
        {"name": "config", "mountPath": "/config"},
    ]
    pod = python_pod("volumes", code, volumes=volumes, container={"volumeMounts": mounts})
    apply(cluster, namespace, claim, config, pod)
    done = wait_phase(cluster, namespace, "volumes", {"Succeeded", "Failed"})

    log = node_agent.logs(namespace, "volumes", "main")[0]
    assert done["status"]["phase"] == "Succeeded", log
    assert "shm_bytes 134217728" in log
    assert "config from a configmap" in log
    # The claim's data outlives the pod, in the claim's directory here.
    assert (node_agent.claim_dir(namespace, "ckpt") / "step-1").read_text() == "saved"
    # Nothing was written to the machine's own paths.
    assert not Path("/ckpt/step-1").exists()
    assert not Path("/scratch/tmp").exists()


def test_a_pod_waits_for_a_configmap_created_after_it(cluster, namespace, node_agent):
    """As a kubelet does: a pod whose ConfigMap volume does not exist yet waits
    (Pending, its container ContainerCreating, naming the ConfigMap) and runs
    once the ConfigMap is created (torchfleet run creates the job before the
    ConfigMap of its code). Before, the agent failed it at once."""
    volumes = [{"name": "code", "configMap": {"name": "late-code"}}]
    mounts = [{"name": "code", "mountPath": "/code"}]
    code = 'print("code", open("/code/train.py").read())'
    apply(
        cluster,
        namespace,
        python_pod("late", code, volumes=volumes, container={"volumeMounts": mounts}),
    )

    def waiting() -> dict[str, Any] | None:
        status = get_pod(cluster, namespace, "late").get("status") or {}
        states = [c["state"] for c in status.get("containerStatuses") or ()]
        return states[0].get("waiting") if states and status.get("phase") == "Pending" else None

    said = wait_for("the pod waiting for its ConfigMap", waiting, 60)
    assert said["reason"] == "ContainerCreating", said
    assert "configMap 'late-code' not found" in said["message"], said
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "late-code"},
        "data": {"train.py": "print('hello')"},
    }
    apply(cluster, namespace, config)
    done = wait_phase(cluster, namespace, "late", {"Succeeded", "Failed"})
    log = node_agent.logs(namespace, "late", "main")[0]
    assert done["status"]["phase"] == "Succeeded", log
    assert "code print('hello')" in log


def test_deleting_a_pod_stops_its_processes(cluster, namespace, node_agent):
    code = """
        import os, signal, sys, time
        def on_term(signum, frame):
            print("got SIGTERM", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
        print("pid", os.getpid(), flush=True)
        while True:
            time.sleep(0.1)
    """
    stubborn = """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ignoring SIGTERM", flush=True)
        while True:
            time.sleep(0.1)
    """
    apply(cluster, namespace, python_pod("polite", code), python_pod("stubborn", stubborn))
    for name in ("polite", "stubborn"):
        wait_phase(cluster, namespace, name, {"Running"})
    _wait_log(node_agent, namespace, "stubborn", "ignoring SIGTERM")
    _wait_log(node_agent, namespace, "polite", "pid")

    started = time.monotonic()
    cluster.kubectl("delete", "pod", "polite", "stubborn", "-n", namespace, "--wait=true")
    elapsed = time.monotonic() - started

    assert "got SIGTERM" in node_agent.logs(namespace, "polite", "main")[0]
    # SIGKILL came after the 5 s grace period, not before.
    assert 4 <= elapsed < 30
    for name in ("polite", "stubborn"):
        pod_dir = node_agent.pod_dirs(namespace, name)[0]
        plan = json.loads((pod_dir / "launch-main.json").read_text())
        assert not _running_with(plan["argv"][-1]), f"{name} still has processes"


def _wait_log(node_agent, namespace, pod, text, timeout=30):
    wait_for(
        f"{pod} to log {text!r}",
        lambda: (logs := node_agent.logs(namespace, pod, "main")) and text in logs[-1],
        timeout,
        explain=lambda: str(node_agent.logs(namespace, pod, "main")),
    )


def _running_with(marker: str) -> bool:
    """Any process on the machine whose command line contains ``marker``."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                return True
        except OSError:
            continue
    return False
