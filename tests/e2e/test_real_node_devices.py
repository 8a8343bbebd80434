"""Device health from the real kubelet (KEP-4680): a device plugin's devices
allocated to a container, and their health in the pod's status.

The fake-GPU device plugin (dev/realnode/deviceplugin, built by gotool.sh)
serves fake GPUs (``torchfleet.dev/fake-gpu``) to the real node's kubelet: it
gives a container its devices' IDs in ``FAKE_GPU_IDS`` and reads each
device's health from a file the test writes. When a device allocated to a
running container turns Unhealthy, the kubelet says so in that container's
``allocatedResourcesStatus`` and leaves the device out of the node's
allocatable count: what the operator's node-health policy reads.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_training import get_job
from tests.fixtures.poll import wait_for
from tests.fixtures.realnode import (
    BUSYBOX_IMAGE,
    REAL_NODE_ONLY,
    REAL_NODE_PLACEMENT,
    built,
    busybox_job,
)

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, REAL_NODE_ONLY]

RESOURCE = "torchfleet.dev/fake-gpu"
COUNT = 2


class FakeGpus:
    """The running plugin: its health file and log."""

    def __init__(self, health_file: Path, log: Path) -> None:
        self.health_file, self.log = health_file, log

    def set_health(self, health: dict[str, str]) -> None:
        # Renamed into place: the plugin never reads a half-written file.
        part = self.health_file.with_suffix(".part")
        part.write_text(json.dumps(health))
        os.replace(part, self.health_file)


def _allocatable(cluster: Any, node: str) -> str | None:
    return cluster.get_json("node", node)["status"].get("allocatable", {}).get(RESOURCE)


@pytest.fixture(scope="module")
def fake_gpus(cluster: Any, real_node: Any) -> Iterator[FakeGpus]:
    """The fake-GPU plugin, registered with the real node's kubelet, its
    devices (all Healthy) in the node's allocatable; stopped afterwards."""
    plugin_binary = built("dev/realnode/gotool.sh", "deviceplugin")
    gpus = FakeGpus(
        Path(real_node.root) / "fake-gpu-health.json", real_node.cluster.logs / "deviceplugin.log"
    )
    gpus.set_health({})
    command = [
        str(plugin_binary),
        # The kubelet's plugin watcher's folder, under its --root-dir (its
        # device-plugins/kubelet.sock is /var/lib/kubelet's whatever the root).
        f"--registry-dir={Path(real_node.root) / 'kubelet' / 'plugins_registry'}",
        f"--count={COUNT}",
        f"--health-file={gpus.health_file}",
    ]
    with gpus.log.open("ab") as log:
        plugin = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(
            f"{COUNT} {RESOURCE} allocatable on {real_node.name}",
            lambda: _allocatable(cluster, real_node.name) == str(COUNT),
            60,
            explain=lambda: gpus.log.read_text()[-4000:],
        )
        yield gpus
    finally:
        plugin.terminate()
        try:
            plugin.wait(10)
        except subprocess.TimeoutExpired:
            plugin.kill()
            plugin.wait()


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            **REAL_NODE_PLACEMENT,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            # The image has no user of its own: a plain uid, as restricted asks.
            "securityContext": {"runAsUser": 1000, "runAsNonRoot": True},
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "resources": {"limits": {RESOURCE: "1"}},
                }
            ],
        },
    }


def _health(pod: dict[str, Any]) -> dict[str, str]:
    """The pod's one container's device health, by device ID, as the kubelet
    reports it."""
    statuses = pod["status"].get("containerStatuses", [])
    reported = statuses[0].get("allocatedResourcesStatus", []) if statuses else []
    return {
        r["resourceID"]: r["health"]
        for resource in reported
        if resource["name"] == RESOURCE
        for r in resource.get("resources", [])
    }


def test_the_real_kubelet_reports_an_unhealthy_device(cluster, namespace, real_node, fake_gpus):
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(_pod("gpu")))

    def explain() -> str:
        events = cluster.kubectl("get", "events", "-n", namespace, "-o", "wide").stdout
        return f"{events}\nthe plugin's log:\n{fake_gpus.log.read_text()[-4000:]}"

    def pod() -> dict[str, Any]:
        return cluster.get_json("pod", "gpu", "-n", namespace)

    running = wait_for(
        "the pod running on the real node",
        lambda: (p := pod())["status"].get("phase") == "Running" and p,
        120,
        explain=explain,
    )
    assert running["spec"]["nodeName"] == real_node.name
    # The plugin's Allocate named the container's device in its environment.
    env = cluster.kubectl("exec", "gpu", "-n", namespace, "--", "sh", "-c", 'echo "$FAKE_GPU_IDS"')
    device = env.stdout.strip()
    assert device in {f"fake-gpu-{i}" for i in range(COUNT)}, env.stdout

    # The kubelet reports the allocated device's health with the container.
    wait_for(
        f"{device} Healthy in the pod's allocatedResourcesStatus",
        lambda: _health(pod()) == {device: "Healthy"},
        60,
        explain=lambda: f"{pod()['status']}\n{explain()}",
    )

    fake_gpus.set_health({device: "Unhealthy"})
    status = wait_for(
        f"{device} Unhealthy in the pod's allocatedResourcesStatus",
        lambda: _health(p := pod()) == {device: "Unhealthy"} and p["status"],
        60,
        explain=lambda: f"{pod()['status']}\n{explain()}",
    )
    print(json.dumps(status["containerStatuses"][0]["allocatedResourcesStatus"]))
    # The node's allocatable leaves the unhealthy device out; its capacity keeps it.
    wait_for(
        f"{COUNT - 1} {RESOURCE} allocatable on {real_node.name}",
        lambda: _allocatable(cluster, real_node.name) == str(COUNT - 1),
        60,
        explain=explain,
    )
    node = cluster.get_json("node", real_node.name)
    assert node["status"]["capacity"][RESOURCE] == str(COUNT)


def _devices_of(pod: dict[str, Any]) -> set[str]:
    return set(_health(pod))


def test_a_job_whose_device_turns_unhealthy_leaves_the_node_uncounted(
    cluster, e2e_namespace, real_node, fake_gpus, e2e_operator
):
    """The operator reads what the real kubelet reports: a TrainingJob's
    master and worker each hold a fake GPU; the master's turns Unhealthy; under
    runPolicy.stragglers.action Replace the job says DeviceUnhealthy naming it,
    and restarts its gang as a disruption (uncounted), the next pods kept off
    the node (here the only one with such devices, so they wait)."""
    namespace = e2e_namespace
    fake_gpus.set_health({})  # the module's first test left one Unhealthy
    wait_for(
        f"{COUNT} {RESOURCE} allocatable again",
        lambda: _allocatable(cluster, real_node.name) == str(COUNT),
        60,
    )
    # SIGTERM ends it at once: the gang restart waits for the old pods to go.
    job = busybox_job("devices", "trap 'exit 0' TERM; sleep 3600 & wait", "64Mi")
    job["spec"]["runPolicy"] = {"stragglers": {"action": "Replace"}}
    for role in ("master", "worker"):
        (trainer,) = job["spec"][role]["template"]["spec"]["containers"]
        trainer["resources"] = {"limits": {RESOURCE: "1"}}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job))

    def master() -> dict[str, Any]:
        """The master pod, or an empty one before the operator has made it."""
        pods = cluster.get_json("pods", "-n", namespace, "-l", "torchfleet.dev/restart=0")
        found = [p for p in pods["items"] if p["metadata"]["name"] == "devices-master-0"]
        return found[0] if found else {"status": {}}

    def explain() -> str:
        pods = cluster.kubectl("get", "pods,tj", "-n", namespace, "-o", "wide").stdout
        events = cluster.kubectl("get", "events", "-n", namespace).stdout
        return f"{pods}\n{events}\nthe plugin's log:\n{fake_gpus.log.read_text()[-2000:]}"

    held = wait_for(
        "the master's device Healthy in its status",
        lambda: (p := master())["status"].get("phase") == "Running" and _devices_of(p),
        120,
        explain=explain,
    )
    (device,) = held
    fake_gpus.set_health({device: "Unhealthy"})

    status = wait_for(
        "the gang restarted away from the node",
        lambda: (
            (s := get_job(cluster, namespace, "devices").get("status") or {}).get("restartCount")
            == 1
            and s
        ),
        120,
        explain=explain,
    )
    # A disruption: the node's fault, counted toward no limit.
    assert status.get("countedRestarts", 0) == 0, status
    assert status["health"]["avoidedNodes"] == [real_node.name], status["health"]
    warned = [
        e
        for e in cluster.get_json("events", "-n", namespace)["items"]
        if e["reason"] == "UnhealthyDevice" and e["involvedObject"]["kind"] == "TrainingJob"
    ]
    named = f"{RESOURCE}/{device} of pod devices-master-0 on node {real_node.name}"
    assert warned and named in warned[0]["message"], warned
    # The next gang's pods are kept off the node, and no other node has the devices.
    pending = wait_for(
        "the next gang's pods unschedulable",
        lambda: (
            (pods := cluster.get_json("pods", "-n", namespace, "-l", "torchfleet.dev/restart=1"))
            and len(pods["items"]) == 2
            and all(not p["spec"].get("nodeName") for p in pods["items"])
            and pods["items"]
        ),
        120,
        explain=explain,
    )
    for pod in pending:
        terms = pod["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        avoid = {"key": "metadata.name", "operator": "NotIn", "values": [real_node.name]}
        assert all(avoid in term.get("matchFields", []) for term in terms), terms
