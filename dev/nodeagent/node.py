"""The Node objects this agent stands for: registration and heartbeats."""

from __future__ import annotations

import os
import platform
from datetime import UTC, datetime
from typing import Any

LOCAL_NODE_LABEL = "torchfleet.dev/local-node"
# The label's value names the agent's session. The examples select the
# default; a test session or a second agent on the same cluster uses a value
# of its own, so that each job lands only on its own session's nodes (a demo
# left running and `make test` share one cluster).
DEFAULT_SESSION = "true"


def local_node_taint(session: str = DEFAULT_SESSION) -> dict[str, str]:
    """Pods must tolerate this taint to land here, so nothing the scheduler would
    put on a KWOK node ends up running as a real process by accident."""
    return {"key": LOCAL_NODE_LABEL, "value": session, "effect": "NoSchedule"}


# A fault injection: a node annotated `torchfleet.dev/silent-death=true` dies as
# a machine does (agent.py, `Agent._die`): its pods' network goes, then their
# processes, its heartbeats stop and nothing about its pods is reported or
# confirmed again. Removing the annotation boots it again, empty.
SILENT_DEATH_ANNOTATION = "torchfleet.dev/silent-death"


def silent_death_requested(node: dict[str, Any]) -> bool:
    """Whether the node's annotation asks it to be dead; a value other than
    ``true`` is refused (ValueError), so that a typo never kills a node."""
    value = (node["metadata"].get("annotations") or {}).get(SILENT_DEATH_ANNOTATION)
    if value is None:
        return False
    if value != "true":
        raise ValueError(f"{SILENT_DEATH_ANNOTATION}={value!r}: the only value is 'true'")
    return True


AGENT_VERSION = "v0.1.0-torchfleet-nodeagent"


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_manifest(name: str, pod_cidr: str, session: str = DEFAULT_SESSION) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": _arch(),
                LOCAL_NODE_LABEL: session,
            },
        },
        "spec": {
            "podCIDR": pod_cidr,
            "podCIDRs": [pod_cidr],
            "taints": [local_node_taint(session)],
        },
    }


def _arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def node_status(
    name: str, host_ip: str, cpu: str, memory: str, logs_port: int | None = None
) -> dict[str, Any]:
    """Capacity, Ready and the addresses, as a kubelet would report them."""
    now = _now()
    resources = {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "100Gi"}

    def condition(kind: str, status: str, reason: str, message: str) -> dict[str, Any]:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }

    return {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [
            condition("Ready", "True", "KubeletReady", "torchfleet node agent is posting ready"),
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "ok"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "ok"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "ok"),
        ],
        "addresses": [
            {"type": "InternalIP", "address": host_ip},
            {"type": "Hostname", "address": name},
        ],
        # Where the API server fetches container logs (logserver.py).
        **(
            {"daemonEndpoints": {"kubeletEndpoint": {"Port": logs_port}}}
            if logs_port is not None
            else {}
        ),
        "nodeInfo": {
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
            "kernelVersion": os.uname().release,
            "osImage": "local processes (torchfleet dev node agent)",
            "containerRuntimeVersion": "nodeagent://0.1.0",
            "kubeletVersion": AGENT_VERSION,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": _arch(),
        },
    }


def lease_manifest(name: str, node_uid: str, duration_seconds: int) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": "kube-node-lease",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}
            ],
        },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": duration_seconds,
            "renewTime": _now_micro(),
        },
    }


def lease_renewal() -> dict[str, Any]:
    return {"spec": {"renewTime": _now_micro()}}
