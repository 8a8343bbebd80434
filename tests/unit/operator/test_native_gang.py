"""Kubernetes' own gang scheduling: the Workload, a PodGroup per gang
generation, the pods' schedulingGroup, and kube-scheduler's verdict read back
into the job's GangScheduled, in both API versions the operator writes:
scheduling.k8s.io/v1beta1 (1.37; condition PodGroupInitiallyScheduled) and
v1alpha2 (1.36; PodGroupScheduled), the one discovery found."""

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
V1BETA1, V1ALPHA2 = "scheduling.k8s.io/v1beta1", "scheduling.k8s.io/v1alpha2"
# Each version's PodGroup condition with kube-scheduler's verdict.
SCHEDULED = {V1BETA1: "PodGroupInitiallyScheduled", V1ALPHA2: "PodGroupScheduled"}
BOTH = pytest.mark.parametrize("api", [V1BETA1, V1ALPHA2])


def spec(workers: int = 3, **fields: Any) -> Any:
    return TrainingJob.model_validate(job(workers=workers, **fields)).spec


@pytest.mark.parametrize(
    ("scheduling", "kinds"),
    [
        ({}, []),
        ({"podGroup": "Coscheduling"}, [("scheduling.x-k8s.io/v1alpha1", "PodGroup")]),
        ({"podGroup": "Volcano"}, [("scheduling.volcano.sh/v1beta1", "PodGroup")]),
        (NATIVE, [(V1BETA1, "PodGroup"), (V1BETA1, "Workload")]),
    ],
)
def test_gang_objects_per_kind(scheduling, kinds):
    made = podgroup.gang_objects("llm", "team", "uid-1", spec(scheduling=scheduling), 0)
    assert [(m["apiVersion"], m["kind"]) for m in made] == kinds
    for manifest in made:
        assert manifest["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        assert manifest["metadata"]["labels"]["torchfleet.dev/job-name"] == "llm"


# How each version's PodGroup names the Workload's template it was made from
# (k8s.io/api scheduling/v1beta1 WorkloadReference, v1alpha2
# PodGroupTemplateReference).
TEMPLATE_REF = {
    V1BETA1: {"workloadRef": {"workloadName": "llm", "templateName": "gang"}},
    V1ALPHA2: {
        "podGroupTemplateRef": {"workload": {"workloadName": "llm", "podGroupTemplateName": "gang"}}
    },
}


@pytest.mark.parametrize(
    ("api", "fields", "min_count"),
    [
        (V1BETA1, {"workers": 3}, 4),  # every pod
        (V1BETA1, {"workers": 3, "elastic": ELASTIC}, 2),  # an elastic job trains on minNodes
        (V1ALPHA2, {"workers": 3}, 4),
        (V1ALPHA2, {"workers": 3, "elastic": ELASTIC}, 2),
    ],
)
def test_workload_and_pod_group_ask_for_the_gang(api, fields, min_count):
    group, workload = podgroup.gang_objects(
        "llm", "team", "uid-1", spec(scheduling=NATIVE, **fields), 2, api
    )
    assert (group["apiVersion"], workload["apiVersion"]) == (api, api)
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
        **TEMPLATE_REF[api],
        "schedulingPolicy": {"gang": {"minCount": min_count}},
    }


def discovered(*plurals: str) -> dict[str, Any]:
    """An APIResourceList as /apis/scheduling.k8s.io/<version> answers it."""
    return {"kind": "APIResourceList", "resources": [{"name": p} for p in plurals]}


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        # 1.37 with the beta API on: v1alpha2 is gone (404).
        ({"v1beta1": discovered("workloads", "podgroups", "podgroups/status")}, V1BETA1),
        # 1.36 with the alpha API on; its v1beta1 is not served.
        ({"v1alpha2": discovered("workloads", "podgroups", "podgroups/status")}, V1ALPHA2),
        # both (a future release serving both): the newest
        (
            {
                "v1beta1": discovered("workloads", "podgroups"),
                "v1alpha2": discovered("workloads", "podgroups"),
            },
            V1BETA1,
        ),
        # the group served without the gang resources (the runtime-config left off)
        ({"v1beta1": discovered()}, None),
        ({"v1beta1": discovered("workloads")}, None),
        ({}, None),
        ({"v1beta1": {"resources": "odd"}}, None),
    ],
)
def test_discovery_picks_the_newest_version_serving_both_objects(answers, expected):
    served = [v for v, found in answers.items() if podgroup.serves_gang(found)]
    assert podgroup.preferred_native_api(served) == expected


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


def native_group(
    restart: int = 0, *conditions: dict[str, Any], api: str = V1BETA1
) -> dict[str, Any]:
    return {
        "apiVersion": api,
        "kind": "PodGroup",
        "metadata": {
            "name": f"llm-gen-{restart}",
            "labels": {"torchfleet.dev/restart": str(restart)},
            "ownerReferences": [{"uid": "uid-1", "controller": True}],
        },
        "status": {"conditions": list(conditions)},
    }


def scheduled(status: str, reason: str, message: str = "", api: str = V1BETA1) -> dict[str, Any]:
    return {"type": SCHEDULED[api], "status": status, "reason": reason, "message": message}


def read_cases(api: str) -> list[Any]:
    def group(restart: int, *conditions: dict[str, Any]) -> dict[str, Any]:
        return native_group(restart, *conditions, api=api)

    return [
        (group(0), None, None, 0),  # not looked at yet
        (group(1, scheduled("True", "Scheduled", api=api)), "Scheduled", None, 1),
        (
            group(2, scheduled("False", "Unschedulable", REFUSAL, api=api)),
            "Unschedulable",
            f"Unschedulable: {REFUSAL}",
            2,
        ),
        (
            group(0, scheduled("False", "SchedulerError", "boom", api=api)),
            "SchedulerError",
            "SchedulerError: boom",
            0,
        ),
        ({**group(0), "status": {"conditions": "odd"}}, None, None, 0),
        (
            {**group(0), "metadata": {"labels": {"torchfleet.dev/restart": "x"}}},
            None,
            None,
            0,
        ),
    ]


@pytest.mark.parametrize(
    ("manifest", "phase", "unschedulable", "generation"),
    read_cases(V1BETA1) + read_cases(V1ALPHA2),
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


@BOTH
def test_a_new_gang_posts_its_group_and_workload_before_its_pods(api):
    seen = observed(native_api=api)
    p = plan(job(workers=2, scheduling=NATIVE), seen, at(0), CONFIG, status={})
    assert [m["kind"] for m in p.create] == ["PodGroup", "Workload", "Pod", "Pod", "Pod"]
    assert p.create[0]["metadata"]["name"] == "llm-gen-0"
    # In the version the cluster serves (discovery), whatever it is.
    assert {m["apiVersion"] for m in p.create[:2]} == {api}


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
    assert "scheduling.k8s.io/v1beta1" in condition["message"]
    assert "v1alpha2 on 1.36" in condition["message"]


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


# ---- the job's priority, and a finished generation's group ------------------------


@pytest.mark.parametrize(
    ("api", "scheduling", "priority"),
    [
        # 1.37: the PodGroup names the job's class (the API server's Priority
        # admission turns it into spec.priority), the Workload's template too.
        (V1BETA1, {**NATIVE, "priorityClassName": "high"}, {"priorityClassName": "high"}),
        (V1BETA1, NATIVE, {}),
        # 1.36: the field needs the alpha gate WorkloadAwarePreemption.
        (V1ALPHA2, {**NATIVE, "priorityClassName": "high"}, {}),
    ],
)
def test_the_gang_has_the_jobs_priority_class(api, scheduling, priority):
    group, workload = podgroup.gang_objects(
        "llm", "team", "uid-1", spec(scheduling=scheduling), 0, api
    )
    assert {k: v for k, v in group["spec"].items() if k.startswith("priority")} == priority
    template = workload["spec"]["podGroupTemplates"][0]
    assert {k: v for k, v in template.items() if k.startswith("priority")} == priority


def seen_group(generation: int, deleting: bool = False, api: str = V1BETA1) -> ObservedPodGroup:
    manifest = native_group(generation, api=api)
    manifest["metadata"]["uid"] = f"group-{generation}"
    if deleting:
        manifest["metadata"]["deletionTimestamp"] = stamp(0)
    group = ObservedPodGroup.from_manifest(manifest)
    assert group is not None
    return group


def deleted_groups(p: Any) -> list[tuple[str, str | None, str]]:
    return sorted((r.name, r.uid, r.api_version) for r in p.delete if r.kind == "PodGroup")


@BOTH
def test_a_new_generation_deletes_the_groups_of_the_ones_before(api):
    groups = tuple(seen_group(g, api=api) for g in range(3))
    seen = observed(*gang(restart=2), pod_groups=groups, native_api=api)
    p = plan(job(workers=2, scheduling=NATIVE), seen, at(0), CONFIG, running_status(restart=2))
    assert deleted_groups(p) == [("llm-gen-0", "group-0", api), ("llm-gen-1", "group-1", api)]
    assert not [r for r in p.delete if r.kind == "Pod"]


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_job_deletes_every_group_once(phase):
    groups = (seen_group(0, deleting=True), seen_group(1))
    done = {**running_status(restart=1), "phase": phase}
    seen = observed(*gang(restart=1, phase="Succeeded"), pod_groups=groups)
    p = plan(job(workers=2, scheduling=NATIVE), seen, at(0), CONFIG, done)
    # gen-0 is being deleted already (protection holds it): not asked again
    assert deleted_groups(p) == [("llm-gen-1", "group-1", V1BETA1)]


def test_another_schedulers_group_stays():
    volcano = ObservedPodGroup.from_manifest(
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": "llm"},
        }
    )
    done = {**running_status(), "phase": "Succeeded"}
    seen = observed(*gang(phase="Succeeded"), pod_groups=(volcano,))
    p = plan(job(workers=2, scheduling={"podGroup": "Volcano"}), seen, at(0), CONFIG, done)
    assert deleted_groups(p) == []
