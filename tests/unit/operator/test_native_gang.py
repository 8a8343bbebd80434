"""Kubernetes' own gang scheduling (scheduling.k8s.io/v1alpha2, 1.36): the
Workload, a PodGroup per gang generation, the pods' schedulingGroup, and the
PodGroupScheduled condition read back into the job's GangScheduled."""

from __future__ import annotations

from typing import Any

import pytest

from torchfleet_operator.api.v1alpha1 import TrainingJob
from torchfleet_operator.desired import podgroup
from torchfleet_operator.desired.pods import build_pod
from torchfleet_operator.observed import ObservedPod, ObservedPodGroup, current_pod_group
from torchfleet_operator.reconcile import plan
from torchfleet_operator.status.conditions import find
from torchfleet_operator.status.podgroup import mirror
from torchfleet_operator.status.rejections import with_rejections

from .builders import CONFIG, at, gang, job, observed, pod, running_status, stamp

NATIVE = {"podGroup": "Kubernetes"}
ELASTIC = {"minNodes": 2, "maxNodes": 4, "maxRestarts": 1}
REFUSAL = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."


def spec(workers: int = 3, **fields: Any) -> Any:
    return TrainingJob.model_validate(job(workers=workers, **fields)).spec


@pytest.mark.parametrize(
    ("scheduling", "kinds"),
    [
        ({}, []),
        ({"podGroup": "Coscheduling"}, [("scheduling.x-k8s.io/v1alpha1", "PodGroup")]),
        ({"podGroup": "Volcano"}, [("scheduling.volcano.sh/v1beta1", "PodGroup")]),
        (
            NATIVE,
            [
                ("scheduling.k8s.io/v1alpha2", "PodGroup"),
                ("scheduling.k8s.io/v1alpha2", "Workload"),
            ],
        ),
    ],
)
def test_gang_objects_per_kind(scheduling, kinds):
    made = podgroup.gang_objects("llm", "team", "uid-1", spec(scheduling=scheduling), 0)
    assert [(m["apiVersion"], m["kind"]) for m in made] == kinds
    for manifest in made:
        assert manifest["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        assert manifest["metadata"]["labels"]["torchfleet.dev/job-name"] == "llm"


@pytest.mark.parametrize(
    ("fields", "min_count"),
    [
        ({"workers": 3}, 4),  # every pod
        ({"workers": 3, "elastic": ELASTIC}, 2),  # an elastic job trains on minNodes
    ],
)
def test_workload_and_pod_group_ask_for_the_gang(fields, min_count):
    group, workload = podgroup.gang_objects(
        "llm", "team", "uid-1", spec(scheduling=NATIVE, **fields), 2
    )
    assert workload["metadata"]["name"] == "llm"
    assert workload["spec"] == {
        "controllerRef": {"apiGroup": "torchfleet.dev", "kind": "TrainingJob", "name": "llm"},
        "podGroupTemplates": [
            {"name": "gang", "schedulingPolicy": {"gang": {"minCount": min_count}}}
        ],
    }
    assert group["metadata"]["name"] == "llm-gen-2"
    assert group["metadata"]["labels"]["torchfleet.dev/restart"] == "2"
    assert group["spec"] == {
        "podGroupTemplateRef": {
            "workload": {"workloadName": "llm", "podGroupTemplateName": "gang"}
        },
        "schedulingPolicy": {"gang": {"minCount": min_count}},
    }


@pytest.mark.parametrize(
    ("scheduling", "restart", "expected"),
    [
        (NATIVE, 0, {"podGroupName": "llm-gen-0"}),
        (NATIVE, 5, {"podGroupName": "llm-gen-5"}),
        ({"podGroup": "Volcano"}, 0, None),
        ({}, 0, None),
    ],
)
def test_every_pod_points_at_its_generations_group(scheduling, restart, expected):
    parsed = spec(scheduling=scheduling)
    for rank in range(4):
        made = build_pod("llm", "team", "uid-1", parsed, rank, restart, "img:1")
        assert made["spec"].get("schedulingGroup") == expected


def test_a_template_cannot_move_a_pod_to_another_group():
    template = {"spec": {"schedulingGroup": {"podGroupName": "other"}}}
    parsed = spec(scheduling=NATIVE, master={"template": template})
    made = build_pod("llm", "team", "uid-1", parsed, 0, 1, "img:1")
    assert made["spec"]["schedulingGroup"] == {"podGroupName": "llm-gen-1"}


def native_group(restart: int = 0, *conditions: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": {
            "name": f"llm-gen-{restart}",
            "labels": {"torchfleet.dev/restart": str(restart)},
            "ownerReferences": [{"uid": "uid-1", "controller": True}],
        },
        "status": {"conditions": list(conditions)},
    }


def scheduled(status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": "PodGroupScheduled", "status": status, "reason": reason, "message": message}


@pytest.mark.parametrize(
    ("manifest", "phase", "unschedulable", "generation"),
    [
        (native_group(0), None, None, 0),  # not looked at yet
        (native_group(1, scheduled("True", "Scheduled")), "Scheduled", None, 1),
        (
            native_group(2, scheduled("False", "Unschedulable", REFUSAL)),
            "Unschedulable",
            f"Unschedulable: {REFUSAL}",
            2,
        ),
        (
            native_group(0, scheduled("False", "SchedulerError", "boom")),
            "SchedulerError",
            "SchedulerError: boom",
            0,
        ),
        ({**native_group(0), "status": {"conditions": "odd"}}, None, None, 0),
        (
            {**native_group(0), "metadata": {"labels": {"torchfleet.dev/restart": "x"}}},
            None,
            None,
            0,
        ),
    ],
)
def test_native_group_is_read(manifest, phase, unschedulable, generation):
    group = ObservedPodGroup.from_manifest(manifest)
    assert group is not None
    assert (group.kind, group.phase, group.unschedulable, group.generation) == (
        "Kubernetes",
        phase,
        unschedulable,
        generation,
    )


def unplaced(rank: int, message: str | None = None) -> ObservedPod:
    return pod("llm", rank, phase="Pending", node_name=None, unschedulable=message)


@pytest.mark.parametrize(
    ("group", "pods", "status", "reason", "said"),
    [
        (
            native_group(0, scheduled("False", "Unschedulable", REFUSAL)),
            [unplaced(r) for r in range(3)],
            "False",
            "PodGroupUnschedulable",
            REFUSAL,
        ),
        # Not looked at yet: the pods' PodScheduled message speaks.
        (
            native_group(0),
            [unplaced(0, REFUSAL), unplaced(1), unplaced(2)],
            "False",
            "GangWaiting",
            REFUSAL,
        ),
        # The last generation's Scheduled group, seen before this generation's.
        (
            native_group(0, scheduled("True", "Scheduled")),
            [unplaced(r) for r in range(3)],
            "False",
            "GangWaiting",
            None,
        ),
        (
            native_group(0, scheduled("True", "Scheduled")),
            list(gang(nodes=3)),
            "True",
            "GangScheduled",
            None,
        ),
    ],
)
def test_gang_scheduled_mirrors_kube_schedulers_verdict(group, pods, status, reason, said):
    observed_group = ObservedPodGroup.from_manifest(group)
    result = mirror({}, "Kubernetes", pods, 3, observed_group, stamp(0))
    condition = find(result["conditions"], "GangScheduled")
    assert (condition["status"], condition["reason"]) == (status, reason)
    if said:
        assert condition["message"].endswith(said)


def test_a_new_gang_posts_its_group_and_workload_before_its_pods():
    p = plan(job(workers=2, scheduling=NATIVE), observed(), at(0), CONFIG, status={})
    assert [m["kind"] for m in p.create] == ["PodGroup", "Workload", "Pod", "Pod", "Pod"]
    assert p.create[0]["metadata"]["name"] == "llm-gen-0"


def test_a_restarted_gang_gets_a_new_group():
    body = job(workers=2, scheduling=NATIVE)
    failed = pod("llm", 1, phase="Failed", exit_code=137)
    restarting = plan(
        body, observed(*gang(**{failed.name: failed})), at(100), CONFIG, running_status()
    )
    due = plan(body, observed(), at(111), CONFIG, status=restarting.status)
    groups = [m for m in due.create if m["kind"] == "PodGroup"]
    pods = [m for m in due.create if m["kind"] == "Pod"]
    assert [g["metadata"]["name"] for g in groups] == ["llm-gen-1"]
    assert {p["spec"]["schedulingGroup"]["podGroupName"] for p in pods} == {"llm-gen-1"}


def test_an_unserved_api_group_is_named_in_the_jobs_condition():
    gone = "the server could not find the requested resource"
    status = with_rejections(
        {}, [("PodGroup", "llm-gen-0", 404, gone), ("Workload", "llm", 404, gone)], at(0)
    )
    condition = find(status["conditions"], "ChildrenRejected")
    assert condition["reason"] == "PodGroupCRDMissing"
    assert "scheduling.k8s.io/v1alpha2" in condition["message"]


def observed_group(generation: int, owner: str | None = "uid-1") -> ObservedPodGroup:
    return ObservedPodGroup(kind="Kubernetes", generation=generation, owner_uid=owner)


@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        ([], None),
        ([observed_group(0), observed_group(2), observed_group(1)], observed_group(2)),
        # a newer group of another job of the same name is not this job's
        ([observed_group(0), observed_group(3, owner="uid-old")], observed_group(0)),
        ([ObservedPodGroup(kind="Volcano", owner_uid=None)], ObservedPodGroup(kind="Volcano")),
    ],
)
def test_the_newest_generations_group_is_the_jobs(groups, expected):
    assert current_pod_group(groups, "uid-1") == expected
