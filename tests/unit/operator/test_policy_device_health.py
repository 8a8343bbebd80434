"""Device health (KEP-4680): the kubelet's allocatedResourcesStatus read into
ObservedPod, the DeviceUnhealthy condition policy/health.py decides from it,
and the Replace restart away from the device's node. One row per case."""

from __future__ import annotations

from typing import Any

import pytest

from torchfleet_operator.desired.labels import pod_labels
from torchfleet_operator.observed import ObservedPod
from torchfleet_operator.policy import health
from torchfleet_operator.reconcile import plan
from torchfleet_operator.status.conditions import find

from .builders import (
    CONFIG,
    a_pass,
    at,
    gang,
    job,
    observed,
    running_status,
    spec_of,
    status_of,
)

NODES = ("node-a", "node-b", "node-c")
GPU = "nvidia.com/gpu"


def devices(*health_by_id: tuple[str, str], name: str = GPU) -> list[dict[str, Any]]:
    return [{"name": name, "resources": [{"resourceID": i, "health": h} for i, h in health_by_id]}]


def pod_manifest(statuses: Any, kind: str = "containerStatuses") -> dict[str, Any]:
    return {
        "metadata": {
            "name": "llm-worker-0",
            "uid": "u",
            "labels": pod_labels("llm", "worker", 1, 0),
        },
        "spec": {"nodeName": "node-b"},
        "status": {"phase": "Running", kind: statuses},
    }


@pytest.mark.parametrize(
    ("statuses", "kind", "unhealthy"),
    [
        (
            [{"name": "trainer", "allocatedResourcesStatus": devices(("gpu-0", "Healthy"))}],
            None,
            (),
        ),
        (  # Unknown: the plugin has not said
            [{"name": "trainer", "allocatedResourcesStatus": devices(("gpu-0", "Unknown"))}],
            None,
            (),
        ),
        (
            [
                {
                    "name": "trainer",
                    "allocatedResourcesStatus": devices(
                        ("gpu-0", "Healthy"), ("gpu-1", "Unhealthy")
                    ),
                }
            ],
            None,
            (f"{GPU}/gpu-1",),
        ),
        (  # the same device in two containers: named once
            [
                {"name": n, "allocatedResourcesStatus": devices(("gpu-1", "Unhealthy"))}
                for n in ("trainer", "sidecar")
            ],
            None,
            (f"{GPU}/gpu-1",),
        ),
        (  # an init container's (a native sidecar's) device counts too
            [
                {
                    "name": "proxy",
                    "allocatedResourcesStatus": devices(("d", "Unhealthy"), name="x/y"),
                }
            ],
            "initContainerStatuses",
            ("x/y/d",),
        ),
        # Anything else in those lists is skipped, never a crash.
        ([{"name": "trainer", "allocatedResourcesStatus": "Unhealthy"}], None, ()),
        ([{"name": "trainer", "allocatedResourcesStatus": [{"resources": 7}]}], None, ()),
    ],
)
def test_the_kubelets_unhealthy_devices_are_read_from_the_pod(statuses, kind, unhealthy):
    found = ObservedPod.from_manifest(pod_manifest(statuses, kind or "containerStatuses"))
    assert found is not None and found.unhealthy_devices == unhealthy


def pods(*unhealthy: tuple[int, str], phase: str = "Running") -> list[ObservedPod]:
    """The gang, on one node each; ``unhealthy``: (node rank, device) pairs."""
    bad: dict[int, tuple[str, ...]] = {}
    for rank, device in unhealthy:
        bad[rank] = (*bad.get(rank, ()), device)
    return [
        p.__class__(
            **{
                **p.__dict__,
                "node_name": NODES[p.node_rank],
                "unhealthy_devices": bad.get(p.node_rank, ()),
                "phase": phase if p.node_rank in bad else p.phase,
            }
        )
        for p in gang("llm", 3)
    ]


def judged(gang_now: list[ObservedPod], status: dict[str, Any] | None = None, **policy: Any):
    step = a_pass(observed(*gang_now), running_status(**(status or {})), runPolicy=policy)
    return step, health.judge(step, spec_of(runPolicy=policy), gang_now)


@pytest.mark.parametrize(
    ("policy", "replaced"),
    [({}, False), ({"action": "Report"}, False), ({"action": "Replace"}, True)],
)
def test_an_unhealthy_device_is_reported_and_replace_leaves_its_node(policy, replaced):
    step, found = judged(pods((1, f"{GPU}/gpu-3")), stragglers=policy)
    shown = find(status_of(step)["conditions"], "DeviceUnhealthy")
    assert shown and shown["status"] == "True" and shown["reason"] == "UnhealthyDevice"
    assert f"{GPU}/gpu-3 of pod llm-worker-0 on node node-b" in shown["message"]
    assert [e.reason for e in step.plan.events] == ["UnhealthyDevice"]
    assert bool(found) is replaced
    if replaced:
        (restart,) = found
        # The node's fault, not the program's: a disruption, counted toward no limit.
        assert restart.disruption and restart.reason == "UnhealthyDevice"
        assert restart.pod == "llm-worker-0"
        assert status_of(step)["health"]["avoidedNodes"] == ["node-b"]
        assert status_of(step)["health"]["replacements"] == 1
        assert "the gang restarts away from its node" in shown["message"]
    else:
        assert "avoidedNodes" not in (status_of(step).get("health") or {})


def test_a_spent_replace_budget_only_reports_the_device():
    record = {"health": {"gang": 0, "replacements": 1}}
    step, found = judged(
        pods((2, f"{GPU}/gpu-0")), record, stragglers={"action": "Replace", "maxReplacements": 1}
    )
    shown = find(status_of(step)["conditions"], "DeviceUnhealthy")
    assert not found
    assert shown and shown["status"] == "True" and shown["reason"] == "MaxReplacementsReached"


def test_the_condition_is_set_once_and_cleared_when_the_device_recovers():
    step, _ = judged(pods((1, f"{GPU}/gpu-3")))
    bad = status_of(step)
    again, _ = judged(pods((1, f"{GPU}/gpu-3")), {"conditions": bad["conditions"]})
    assert again.plan.events == []  # one event per finding, not per pass
    healed, _ = judged(pods(), {"conditions": bad["conditions"]})
    shown = find(status_of(healed)["conditions"], "DeviceUnhealthy")
    assert shown and shown["status"] == "False" and shown["reason"] == "DevicesHealthy"


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_pods_device_is_no_finding(phase):
    step, found = judged(pods((1, f"{GPU}/gpu-3"), phase=phase), stragglers={"action": "Replace"})
    assert not found and find(status_of(step).get("conditions"), "DeviceUnhealthy") is None


def test_a_job_whose_devices_are_healthy_gets_no_condition():
    step, found = judged(pods())
    assert not found and find(status_of(step).get("conditions"), "DeviceUnhealthy") is None


def test_replace_restarts_the_gang_uncounted_with_pods_off_the_node():
    """Through the whole pass: the gang restarts as a disruption (restartCount
    1, countedRestarts 0) and the next gang's pods are kept off node-b."""
    spec = {"runPolicy": {"stragglers": {"action": "Replace"}}}
    seen = observed(*pods((1, f"{GPU}/gpu-3")))
    decided = plan(job(status=running_status(), **spec), seen, at(10), CONFIG)
    assert decided.status["restartCount"] == 1
    assert decided.status.get("countedRestarts", 0) == 0
    assert decided.status["health"]["avoidedNodes"] == ["node-b"]
