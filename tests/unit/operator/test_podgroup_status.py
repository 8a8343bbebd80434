"""The GangScheduled condition mirrors the PodGroup and its scheduler's reason."""

from __future__ import annotations

import pytest

from torchfleet_operator.observed import ObservedPod, ObservedPodGroup
from torchfleet_operator.reconcile import plan
from torchfleet_operator.status.conditions import find
from torchfleet_operator.status.podgroup import mirror

from .builders import CONFIG, at, gang, job, observed, pod, stamp

NOW = stamp(0)
VOLCANO_REFUSAL = {
    "type": "Unschedulable",
    "status": "True",
    "reason": "NotEnoughResources",
    "message": "3/3 tasks in gang unschedulable: pod group is not ready, 3 Pending, "
    "3 minAvailable; Pending: 3 Pending",
}


def volcano_group(phase: str | None = "Pending", **status: object) -> dict[str, object]:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {
            "name": "llm",
            "ownerReferences": [{"uid": "uid-1", "controller": True}],
        },
        "spec": {"minMember": 3, "queue": "research"},
        "status": {"phase": phase, **status},
    }


def unplaced(rank: int, message: str | None = None) -> ObservedPod:
    return pod("llm", rank, phase="Pending", node_name=None, unschedulable=message)


def test_volcano_group_is_read_with_its_refusal():
    group = ObservedPodGroup.from_manifest(volcano_group(conditions=[VOLCANO_REFUSAL]))
    assert group == ObservedPodGroup(
        kind="Volcano",
        phase="Pending",
        queue="research",
        unschedulable="NotEnoughResources: " + VOLCANO_REFUSAL["message"],
        owner_uid="uid-1",
    )


@pytest.mark.parametrize(
    "manifest",
    [
        {"apiVersion": "example.com/v1", "kind": "PodGroup"},
        {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue"},
        volcano_group(conditions="not a list"),  # read as no refusal, never a crash
    ],
)
def test_foreign_or_odd_objects_never_crash_the_reader(manifest):
    group = ObservedPodGroup.from_manifest(manifest)
    assert group is None or group.unschedulable is None


def test_a_gang_that_cannot_be_placed_says_why_in_volcanos_words():
    group = ObservedPodGroup.from_manifest(volcano_group(conditions=[VOLCANO_REFUSAL]))
    status = mirror({}, "Volcano", [unplaced(r) for r in range(3)], 3, group, NOW)
    condition = find(status["conditions"], "GangScheduled")
    assert condition["status"] == "False"
    assert condition["reason"] == "PodGroupPending"
    assert "0 of 3 pods placed" in condition["message"]
    assert "not admitted from queue research" in condition["message"]
    assert VOLCANO_REFUSAL["message"] in condition["message"]


def test_coscheduling_reason_comes_from_the_pods_scheduled_condition():
    group = ObservedPodGroup(kind="Coscheduling", phase="Scheduling")
    said = "0/4 nodes are available: 2 Insufficient nvidia.com/gpu"
    pods = [unplaced(0, said), unplaced(1, said), unplaced(2)]
    condition = find(mirror({}, "Coscheduling", pods, 3, group, NOW)["conditions"], "GangScheduled")
    assert (condition["status"], condition["reason"]) == ("False", "PodGroupScheduling")
    assert condition["message"].endswith(said)


def test_a_finished_coscheduling_phase_is_not_mirrored_onto_the_next_gang():
    # scheduler-plugins' controller stops updating a Failed group: after a gang
    # restart the phase describes the old pods.
    group = ObservedPodGroup(kind="Coscheduling", phase="Failed")
    condition = find(
        mirror({}, "Coscheduling", [unplaced(r) for r in range(3)], 3, group, NOW)["conditions"],
        "GangScheduled",
    )
    assert condition["reason"] == "GangWaiting"
    assert "Failed" not in condition["message"]


def test_a_placed_gang_is_scheduled():
    group = ObservedPodGroup(kind="Volcano", phase="Running")
    status = mirror({}, "Volcano", list(gang(nodes=3)), 3, group, NOW)
    condition = find(status["conditions"], "GangScheduled")
    assert (condition["status"], condition["reason"]) == ("True", "GangScheduled")


@pytest.mark.parametrize(
    ("kind", "group"),
    [
        ("None", ObservedPodGroup(kind="Volcano", phase="Pending")),
        ("Volcano", None),  # not seen yet, or its CRD is missing
        ("Volcano", ObservedPodGroup(kind="Coscheduling", phase="Pending")),  # a left-over
    ],
)
def test_no_condition_without_the_jobs_own_pod_group(kind, group):
    status = {"phase": "Pending"}
    assert mirror(status, kind, [unplaced(0)], 3, group, NOW) is status


def test_reconcile_mirrors_the_pod_group_into_the_status():
    body = job(workers=2, scheduling={"podGroup": "Volcano", "queueName": "research"})
    group = ObservedPodGroup.from_manifest(volcano_group(conditions=[VOLCANO_REFUSAL]))
    seen = observed(*(unplaced(r) for r in range(3)), pod_group=group)
    status = plan(body, seen, at(1), CONFIG, status={"phase": "Pending"}).status
    assert status["phase"] == "Pending"
    assert find(status["conditions"], "GangScheduled")["reason"] == "PodGroupPending"


def test_the_pods_scheduled_message_is_observed():
    manifest = {
        "metadata": {
            "name": "llm-master-0",
            "labels": {
                "torchfleet.dev/node-rank": "0",
                "torchfleet.dev/restart": "0",
                "torchfleet.dev/role": "master",
            },
        },
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "pod group is not ready",
                }
            ],
        },
    }
    observed_pod = ObservedPod.from_manifest(manifest)
    assert (
        observed_pod is not None
        and observed_pod.unschedulable == "Unschedulable: pod group is not ready"
    )
