"""Kueue: the Workload a queued job asks with, and what each Workload state
makes the planner do (desired/workload.py, policy/admission.py, policy/kueue.py)."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import pytest

from torchfleet_operator.api.parse import parse_training_job
from torchfleet_operator.desired import workload as wl
from torchfleet_operator.observed import Flavor, KueueView, ObservedWorkload
from torchfleet_operator.policy import admission
from torchfleet_operator.reconcile import plan
from torchfleet_operator.status.conditions import find, set_condition

from .builders import CONFIG, at, gang, job, observed, stamp

GPU_JOB = {
    "resources": {"gpus": 8, "cpu": 32, "memory": "256Gi"},
    "network": {"rdmaResources": {"rdma/ib": 4}},
    "scheduling": {"queueName": "team-a", "priorityClassName": "high"},
}


def spec_of(body: dict[str, Any]) -> Any:
    return parse_training_job(body).spec


def workload_manifest(
    conditions: list[dict[str, Any]] | None = None,
    admission_: dict[str, Any] | None = None,
    **status: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "Workload",
        "metadata": {
            "name": "trainingjob-llm-abcde",
            "namespace": "team",
            "uid": "wl-uid",
            "resourceVersion": "42",
            "generation": 1,
            "ownerReferences": [{"uid": "uid-1", "controller": True}],
        },
        "spec": {"queueName": "team-a"},
        "status": {"conditions": conditions or [], **status},
    }
    if admission_ is not None:
        body["status"]["admission"] = admission_
    return body


def cond(type_: str, status: bool = True, reason: str = "R", message: str = "m") -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }


ADMISSION = {
    "clusterQueue": "cq",
    "podSetAssignments": [
        {"name": "master", "flavors": {"nvidia.com/gpu": "h100", "cpu": "h100"}, "count": 1},
        {"name": "worker", "flavors": {"nvidia.com/gpu": "h100", "cpu": "spot"}, "count": 2},
    ],
}
FLAVORS = {
    "h100": Flavor({"pool": "h100", "zone": "a"}, ({"key": "gpu", "effect": "NoSchedule"},)),
    "spot": Flavor({"zone": "b", "spot": "true"}, ({"key": "spot", "operator": "Exists"},)),
}
ADMITTED = workload_manifest(
    [cond("QuotaReserved", reason="QuotaReserved"), cond("Admitted", reason="Admitted")],
    ADMISSION,
)
PENDING = workload_manifest(
    [
        cond(
            "QuotaReserved",
            False,
            "Pending",
            "couldn't assign flavors to pod set master: insufficient quota for nvidia.com/gpu",
        )
    ]
)
EVICTED = workload_manifest(
    [
        cond("QuotaReserved", reason="QuotaReserved"),
        cond("Admitted", reason="Admitted"),
        cond("Evicted", reason="Preempted", message="Preempted to accommodate a workload"),
        cond("Preempted", reason="InClusterQueue", message="Preempted to accommodate a workload"),
    ],
    ADMISSION,
)


# ---- which jobs Kueue manages ----------------------------------------------------------


@pytest.mark.parametrize(
    ("scheduling", "labels", "queue"),
    [
        ({}, {}, None),
        ({"queueName": "team-a"}, {}, "team-a"),
        ({}, {"kueue.x-k8s.io/queue-name": "team-b"}, "team-b"),
        # With Volcano the field names Volcano's queue, not a LocalQueue...
        ({"podGroup": "Volcano", "queueName": "research"}, {}, None),
        # ...unless Kueue's own label says otherwise.
        ({"podGroup": "Volcano"}, {"kueue.x-k8s.io/queue-name": "team-b"}, "team-b"),
    ],
)
def test_which_jobs_are_queued_in_kueue(scheduling, labels, queue):
    assert admission.kueue_queue(spec_of(job(scheduling=scheduling)), labels) == queue


# ---- the Workload --------------------------------------------------------------------


def test_workload_is_named_like_jobframework_and_owned_by_the_job():
    spec = spec_of(job(workers=2, **GPU_JOB))
    body = wl.workload("llm", "team", "uid-1", spec, "team-a", 1000, "img")
    digest = hashlib.sha1(b"TrainingJob\ntorchfleet.dev\nllm\nuid-1").hexdigest()[:5]
    assert body["metadata"]["name"] == f"trainingjob-llm-{digest}"
    assert wl.workload_name("llm", "uid-2") != body["metadata"]["name"]
    owner = body["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("TrainingJob", "uid-1", True)
    assert body["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] == "uid-1"
    assert body["metadata"]["labels"]["torchfleet.dev/job-name"] == "llm"
    assert body["spec"]["queueName"] == "team-a"
    assert body["spec"]["priorityClassName"] == "high"
    assert body["spec"]["priority"] == 1000
    assert body["spec"]["priorityClassSource"] == "scheduling.k8s.io/priorityclass"


@pytest.mark.parametrize(
    ("workers", "expected"),
    [
        (0, [("master", 1)]),
        (1, [("master", 1), ("worker", 1)]),
        (3, [("master", 1), ("worker", 3)]),
    ],
)
def test_one_pod_set_per_role_with_the_pods_real_requests(workers, expected):
    spec = spec_of(job(workers=workers, **GPU_JOB))
    sets = wl.pod_sets("llm", "team", "uid-1", spec, "img")
    assert [(s["name"], s["count"]) for s in sets] == expected
    for s in sets:
        (container,) = s["template"]["spec"]["containers"]
        assert container["resources"]["requests"] == {
            "cpu": "32",
            "memory": "256Gi",
            "nvidia.com/gpu": "8",
            "rdma/ib": "4",
        }
        assert "env" not in container  # only what Kueue reads


def test_v1beta2_names_the_priority_class_by_reference():
    spec = spec_of(job(workers=2, **GPU_JOB))
    v2 = "kueue.x-k8s.io/v1beta2"
    body = wl.workload("llm", "team", "uid-1", spec, "team-a", 1000, "img", v2)
    assert body["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert body["spec"]["priorityClassRef"] == {
        "group": "scheduling.k8s.io",
        "kind": "PriorityClass",
        "name": "high",
    }
    assert "priorityClassName" not in body["spec"]
    assert "priorityClassSource" not in body["spec"]
    assert body["spec"]["priority"] == 1000
    # PodSets keep their v1beta1 shape.
    v1 = wl.workload("llm", "team", "uid-1", spec, "team-a", 1000, "img")
    assert body["spec"]["podSets"] == v1["spec"]["podSets"]


@pytest.mark.parametrize(
    ("served", "expected"),
    [
        (["v1beta1"], "kueue.x-k8s.io/v1beta1"),  # Kueue 0.10
        (["v1beta1", "v1beta2"], "kueue.x-k8s.io/v1beta2"),  # Kueue 0.15+
        (["v1beta2"], "kueue.x-k8s.io/v1beta2"),
        (["v1alpha1", "v1"], None),  # none this operator writes
        ([], None),
    ],
)
def test_the_preferred_workload_version_among_the_served(served, expected):
    assert wl.preferred_api_version(served) == expected


def test_served_versions_skip_the_unserved():
    crd = {
        "spec": {
            "versions": [
                {"name": "v1beta1", "served": False},
                {"name": "v1beta2", "served": True, "storage": True},
            ]
        }
    }
    assert wl.served_versions(crd) == ["v1beta2"]
    assert wl.preferred_api_version(wl.served_versions(crd)) == "kueue.x-k8s.io/v1beta2"


def test_a_queued_job_asks_in_the_discovered_version():
    view = KueueView(api_version="kueue.x-k8s.io/v1beta2")
    p = plan(job(**QUEUED), observed(kueue=view), at(0), CONFIG, status={})
    (created,) = [m for m in p.create if m["kind"] == "Workload"]
    assert created["apiVersion"] == "kueue.x-k8s.io/v1beta2"


def test_no_priority_class_means_priority_zero():
    spec = spec_of(job(scheduling={"queueName": "q"}))
    body = wl.workload("llm", "team", "uid-1", spec, "q", None, "img")
    assert body["spec"]["priority"] == 0 and "priorityClassName" not in body["spec"]


def test_pods_carry_no_queue_label_of_their_own():
    spec = spec_of(job(**GPU_JOB))
    for s in wl.pod_sets("llm", "team", "uid-1", spec, "img"):
        assert "kueue.x-k8s.io/queue-name" not in s["template"]["metadata"]["labels"]


# ---- reading the admission -----------------------------------------------------------


@pytest.mark.parametrize(
    ("manifest", "reserved", "admitted", "evicted"),
    [
        (workload_manifest(), False, False, False),
        (PENDING, False, False, False),
        (
            workload_manifest([cond("QuotaReserved")], ADMISSION),
            True,
            False,
            False,
        ),  # admission checks pending
        (ADMITTED, True, True, False),
        (EVICTED, True, True, True),
    ],
)
def test_workload_states(manifest, reserved, admitted, evicted):
    seen = ObservedWorkload(manifest)
    assert (seen.has_reservation, seen.admitted, seen.evicted) == (reserved, admitted, evicted)


def test_flavors_become_node_selector_and_tolerations_per_pod_set():
    infos = admission.pod_set_infos(ObservedWorkload(ADMITTED), FLAVORS)
    assert infos["master"].node_selector == {"pool": "h100", "zone": "a"}
    assert infos["master"].tolerations == ({"key": "gpu", "effect": "NoSchedule"},)
    # Two flavors: the first one's label wins (Kueue's MergeKeepFirst), tolerations add up.
    assert infos["worker"].node_selector == {"pool": "h100", "zone": "a", "spot": "true"}
    assert len(infos["worker"].tolerations) == 2


def test_admission_check_pod_set_updates_are_merged():
    manifest = workload_manifest(
        ADMITTED["status"]["conditions"],
        ADMISSION,
        admissionChecks=[
            {
                "name": "prov",
                "state": "Ready",
                "podSetUpdates": [
                    {"name": "master", "nodeSelector": {"rack": "7"}, "annotations": {"a": "b"}}
                ],
            }
        ],
    )
    info = admission.pod_set_infos(ObservedWorkload(manifest), FLAVORS)["master"]
    assert info.node_selector == {"rack": "7", "pool": "h100", "zone": "a"}
    assert info.annotations == {"a": "b"}


def test_missing_flavors_are_named():
    assert admission.missing_flavors(ObservedWorkload(ADMITTED), {"h100": Flavor()}) == ["spot"]


def test_a_template_node_selector_that_contradicts_the_flavor_is_a_conflict():
    pod = {"metadata": {"labels": {}}, "spec": {"nodeSelector": {"zone": "c"}}}
    with pytest.raises(admission.ConflictError, match="zone"):
        admission.apply_pod_set_info(pod, admission.PodSetInfo({"zone": "a"}))
    same = admission.apply_pod_set_info(
        {"metadata": {}, "spec": {"nodeSelector": {"zone": "a"}}},
        admission.PodSetInfo({"zone": "a"}),
    )
    assert same["spec"]["nodeSelector"] == {"zone": "a"}


def test_clearing_the_reservation_drops_admission_and_requeues_after_preemption():
    body = admission.clear_reservation(ObservedWorkload(EVICTED), "2026-01-01T00:01:00Z")
    assert body["metadata"]["resourceVersion"] == "42"
    assert "admission" not in body["status"]  # applied as kueue-admission: removes it
    conditions = body["status"]["conditions"]
    assert find(conditions, "QuotaReserved")["status"] == "False"
    assert find(conditions, "QuotaReserved")["reason"] == "Pending"
    assert find(conditions, "Admitted")["status"] == "False"
    assert find(conditions, "Requeued")["status"] == "True"
    assert find(conditions, "Requeued")["reason"] == "Preempted"
    # Conditions Kueue owns under that manager are kept as they are.
    assert find(conditions, "Evicted") == EVICTED["status"]["conditions"][2]
    assert find(conditions, "Preempted")["reason"] == "InClusterQueue"


def test_clearing_the_reservation_keeps_what_kueues_own_apply_keeps():
    """Kueue's eviction counts, its MultiKueue cluster and the rest its own
    admission apply carries over; dropped, Kueue would lose them (the manager's
    dispatch events count evictions: policy/managed.py)."""
    kept = {
        "schedulingStats": {
            "evictions": [{"reason": "Preempted", "underlyingCause": "", "count": 2}]
        },
        "clusterName": "worker-1",
        "accumulatedPastExecutionTimeSeconds": 120,
        "unhealthyNodes": [{"name": "node-a"}],
    }
    manifest = copy.deepcopy(EVICTED)
    manifest["status"].update(kept)
    body = admission.clear_reservation(ObservedWorkload(manifest), "2026-01-01T00:01:00Z")
    assert {k: body["status"].get(k) for k in kept} == kept
    assert "nominatedClusterNames" not in body["status"]  # absent: not written as null


def test_finished_marks_the_workload():
    body = admission.mark_finished(ObservedWorkload(ADMITTED), True, "done", "now")
    (finished,) = body["status"]["conditions"]
    assert (finished["type"], finished["status"], finished["reason"]) == (
        "Finished",
        "True",
        "Succeeded",
    )


# ---- the planner's gate --------------------------------------------------------------

QUEUED = {"scheduling": {"queueName": "team-a"}}


def kueue(manifest: dict[str, Any] | None, **fields: Any) -> KueueView:
    return KueueView(
        workload=ObservedWorkload(manifest) if manifest else None, flavors=FLAVORS, **fields
    )


def pods_of(p: Any) -> list[dict[str, Any]]:
    return [m for m in p.create if m["kind"] == "Pod"]


def test_without_kueue_a_queued_job_waits_with_a_clear_condition():
    p = plan(job(**QUEUED), observed(kueue=KueueView(installed=False)), at(0), CONFIG, status={})
    assert p.create == [] and p.status["phase"] == "Pending"
    admitted = find(p.status["conditions"], "Admitted")
    assert admitted["status"] == "False" and admitted["reason"] == "KueueNotInstalled"
    assert "team-a" in admitted["message"] and "install Kueue" in admitted["message"]


def test_a_job_without_a_queue_ignores_kueue():
    p = plan(job(), observed(kueue=KueueView(installed=False)), at(0), CONFIG, status={})
    assert len(pods_of(p)) == 3


def test_first_pass_creates_the_workload_and_no_pods():
    p = plan(job(**QUEUED), observed(kueue=kueue(None)), at(0), CONFIG, status={})
    assert [m["kind"] for m in p.create] == ["Workload"]
    assert find(p.status["conditions"], "QuotaReserved")["status"] == "False"


def test_not_admitted_mirrors_kueues_reason_and_creates_nothing():
    p = plan(job(**QUEUED), observed(kueue=kueue(PENDING)), at(0), CONFIG, status={})
    assert p.create == [] and p.status["phase"] == "Pending"
    reserved = find(p.status["conditions"], "QuotaReserved")
    assert reserved["reason"] == "Pending" and "insufficient quota" in reserved["message"]


def test_admitted_creates_the_gang_on_the_admitted_flavors():
    p = plan(job(**QUEUED), observed(kueue=kueue(ADMITTED)), at(0), CONFIG, status={})
    pods = pods_of(p)
    assert len(pods) == 3
    master = next(m for m in pods if m["metadata"]["name"] == "llm-master-0")
    assert master["spec"]["nodeSelector"] == {"pool": "h100", "zone": "a"}
    assert {"key": "gpu", "effect": "NoSchedule"} in master["spec"]["tolerations"]
    assert find(p.status["conditions"], "Admitted")["status"] == "True"


def test_admitted_but_a_flavor_not_seen_yet_waits_for_the_informer():
    view = KueueView(workload=ObservedWorkload(ADMITTED), flavors={"h100": FLAVORS["h100"]})
    p = plan(job(**QUEUED), observed(kueue=view), at(0), CONFIG, status={})
    assert pods_of(p) == [] and p.requeue_after == 1.0


def test_eviction_stops_the_gang_gracefully_and_counts_a_disruption_once():
    status = {"phase": "Running", "restartCount": 0, "startTime": "2026-01-01T12:00:00Z"}
    p = plan(job(**QUEUED), observed(*gang(), kueue=kueue(EVICTED)), at(5), CONFIG, status=status)
    assert sorted(r.name for r in p.delete) == ["llm-master-0", "llm-worker-0", "llm-worker-1"]
    assert all(r.grace_period_seconds is None for r in p.delete)  # the pods' own grace: SIGTERM
    assert p.status["disruptions"] == 1 and p.status["restartCount"] == 0
    assert p.status["phase"] == "Pending"
    evicted = find(p.status["conditions"], "Evicted")
    assert evicted["reason"] == "Preempted" and "Preempted to accommodate" in evicted["message"]
    assert p.workload_patches == []  # not before the pods are gone
    # The pods are terminating: nothing more is counted or deleted.
    again = plan(
        job(**QUEUED),
        observed(
            *gang(), kueue=kueue(EVICTED), expected_deleted=frozenset(r.uid for r in p.delete)
        ),
        at(6),
        CONFIG,
        status=p.status,
    )
    assert again.status["disruptions"] == 1 and again.delete == []


def test_evicted_with_no_pods_left_hands_the_quota_back():
    status = {"phase": "Pending", "restartCount": 0, "disruptions": 1}
    p = plan(job(**QUEUED), observed(kueue=kueue(EVICTED)), at(9), CONFIG, status=status)
    (patch,) = p.workload_patches
    assert patch.field_manager == "kueue-admission" and "admission" not in patch.body["status"]
    assert p.create == [] and p.status["disruptions"] == 1


def test_readmitted_after_eviction_runs_the_same_generation_again():
    evicted = set_condition(None, "Evicted", True, "Preempted", "evicted by Kueue: x", stamp(10))
    status = {"phase": "Pending", "restartCount": 2, "disruptions": 1, "conditions": evicted}
    p = plan(job(**QUEUED), observed(kueue=kueue(ADMITTED)), at(20), CONFIG, status=status)
    assert {m["metadata"]["labels"]["torchfleet.dev/restart"] for m in pods_of(p)} == {"2"}
    assert p.status["restartCount"] == 2
    # Evicted=False says what is true now, not what the eviction said.
    cleared = find(p.status["conditions"], "Evicted")
    assert cleared["status"] == "False" and cleared["reason"] == "Admitted"
    assert "evicted" not in cleared["message"] and "admitted" in cleared["message"]


def test_a_finished_job_marks_its_workload_finished():
    status = {"phase": "Running", "restartCount": 0}
    done = gang(phase="Succeeded")
    p = plan(job(**QUEUED), observed(*done, kueue=kueue(ADMITTED)), at(30), CONFIG, status=status)
    assert p.status["phase"] == "Succeeded"
    (patch,) = p.workload_patches
    assert patch.body["status"]["conditions"][0]["type"] == "Finished"
    already = workload_manifest([*ADMITTED["status"]["conditions"], cond("Finished")], ADMISSION)
    again = plan(
        job(**QUEUED), observed(*done, kueue=kueue(already)), at(31), CONFIG, status=p.status
    )
    assert again.workload_patches == []


# ---- partial admission of an elastic job ---------------------------------------------

ELASTIC_1_3 = {"elastic": {"minNodes": 2, "maxNodes": 4, "maxRestarts": 3}}


@pytest.mark.parametrize(
    ("elastic", "min_count"),
    [
        (None, None),  # a fixed gang: all or nothing
        ({"minNodes": 2, "maxNodes": 4}, 1),  # master + 1 worker at the least
        ({"minNodes": 3, "maxNodes": 4}, 2),
        ({"minNodes": 1, "maxNodes": 4}, 1),  # Kueue's minCount is at least 1
        ({"minNodes": 4, "maxNodes": 4}, None),  # cannot shrink
    ],
)
def test_an_elastic_jobs_worker_pod_set_may_be_admitted_partially(elastic, min_count):
    spec = spec_of(job(workers=3, **({"elastic": elastic} if elastic else {})))
    master, workers = wl.pod_sets("llm", "team", "uid-1", spec, "img")
    assert "minCount" not in master and workers["count"] == 3
    assert workers.get("minCount") == min_count


def partially(worker_count: Any) -> dict[str, Any]:
    assignments = [dict(a) for a in ADMISSION["podSetAssignments"]]  # type: ignore[attr-defined]
    assignments[1]["count"] = worker_count
    return workload_manifest(
        [cond("QuotaReserved", reason="QuotaReserved"), cond("Admitted", reason="Admitted")],
        {**ADMISSION, "podSetAssignments": assignments},
    )


@pytest.mark.parametrize(
    ("count", "expected"), [(2, 2), (0, 0), ("2", None), (True, None), (-1, None), (None, None)]
)
def test_the_admitted_count_is_read_and_junk_is_not(count, expected):
    assert admission.admitted_count(ObservedWorkload(partially(count)), "worker") == expected
    assert admission.admitted_count(ObservedWorkload(partially(count)), "master") == 1
    assert admission.admitted_count(ObservedWorkload(PENDING), "worker") is None


def test_a_partially_admitted_elastic_job_runs_the_workers_it_was_given():
    elastic_job = job(workers=3, **QUEUED, **ELASTIC_1_3)
    view = kueue(partially(2))
    first = plan(elastic_job, observed(kueue=view), at(0), CONFIG, status={})
    assert sorted(m["metadata"]["name"] for m in pods_of(first)) == [
        "llm-master-0",
        "llm-worker-0",
        "llm-worker-1",
    ]
    # Those three run: the job is Running at 3 of the 4 it asked for, and the
    # worker Kueue did not admit is neither created nor counted as lost.
    running = plan(elastic_job, observed(*gang(nodes=3), kueue=view), at(5), CONFIG, first.status)
    assert running.create == [] and running.delete == [] and running.gang_restart is None
    assert running.status["phase"] == "Running"
    assert running.status["elastic"]["currentNodes"] == 3
    assert running.status["elastic"]["desiredNodes"] == 4
    assert running.status["elastic"]["replacements"] == 0
    message = find(running.status["conditions"], "Running")["message"]
    assert "Kueue admitted 3 of the 4 pods" in message


def test_a_fixed_gang_ignores_a_smaller_count_and_creates_all():
    p = plan(job(workers=3, **QUEUED), observed(kueue=kueue(partially(2))), at(0), CONFIG, {})
    assert len(pods_of(p)) == 4
