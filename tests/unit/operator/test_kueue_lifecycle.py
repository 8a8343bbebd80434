"""Kueue: the Workload over the job's life while it waits: the
WorkloadPriorityClass its label names, spec.suspend as the Workload's
spec.active, and a new Workload when the job's PodSets change before admission
(desired/workload.py, policy/kueue.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from torchfleet_operator.desired import workload as wl
from torchfleet_operator.observed import KueueView
from torchfleet_operator.reconcile import plan
from torchfleet_operator.status.conditions import find

from .builders import CONFIG, at, gang, job, observed
from .test_kueue_admission import (
    ADMITTED,
    EVICTED,
    PENDING,
    QUEUED,
    cond,
    kueue,
    pods_of,
    spec_of,
    workload_manifest,
)

WPC_LABEL = "kueue.x-k8s.io/priority-class"


def labelled(body: dict[str, Any], **labels: str) -> dict[str, Any]:
    body["metadata"].setdefault("labels", {}).update(labels)
    return body


def created_workload(p: Any) -> dict[str, Any]:
    (created,) = [m for m in p.create if m["kind"] == "Workload"]
    return created


def made_by_this_operator(manifest: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``manifest`` as the operator creates it for ``body`` (its hash annotation)."""
    fresh = created_workload(plan(body, observed(kueue=kueue(None)), at(0), CONFIG, status={}))
    manifest = copy.deepcopy(manifest)
    manifest["metadata"]["annotations"] = dict(fresh["metadata"]["annotations"])
    return manifest


# ---- WorkloadPriorityClass -----------------------------------------------------------


@pytest.mark.parametrize(
    ("api", "expected"),
    [
        (
            "kueue.x-k8s.io/v1beta1",
            {
                "priorityClassName": "urgent",
                "priorityClassSource": "kueue.x-k8s.io/workloadpriorityclass",
            },
        ),
        (
            "kueue.x-k8s.io/v1beta2",
            {
                "priorityClassRef": {
                    "group": "kueue.x-k8s.io",
                    "kind": "WorkloadPriorityClass",
                    "name": "urgent",
                }
            },
        ),
    ],
)
def test_the_priority_class_label_names_the_workloads_priority_class(api, expected):
    body = labelled(job(scheduling={"queueName": "q", "priorityClassName": "high"}))
    body["metadata"]["labels"][WPC_LABEL] = "urgent"
    view = KueueView(
        api_version=api, priority=1000, workload_priority_class="urgent", workload_priority=5
    )
    created = created_workload(plan(body, observed(kueue=view), at(0), CONFIG, status={}))
    fields = ("priorityClassName", "priorityClassSource", "priorityClassRef")
    assert {k: created["spec"][k] for k in fields if k in created["spec"]} == expected
    # The WorkloadPriorityClass orders the queue; the pods keep their PriorityClass.
    assert created["spec"]["priority"] == 5
    templates = [s["template"]["spec"] for s in created["spec"]["podSets"]]
    assert {t["priorityClassName"] for t in templates} == {"high"}


def test_a_priority_class_that_does_not_exist_waits_and_says_so():
    body = labelled(job(**QUEUED), **{WPC_LABEL: "no-such"})
    view = KueueView(workload_priority_class="no-such")
    p = plan(body, observed(kueue=view), at(0), CONFIG, status={})
    assert p.create == [] and p.status["phase"] == "Pending"
    created = find(p.status["conditions"], "Created")
    assert created["reason"] == "WorkloadPriorityClassNotFound"
    assert "'no-such'" in created["message"] and WPC_LABEL in created["message"]


# ---- spec.suspend as spec.active -----------------------------------------------------


def suspended_job() -> dict[str, Any]:
    body = job(**QUEUED)
    body["spec"]["suspend"] = True
    return body


def test_a_job_queued_suspended_gets_an_inactive_workload_and_no_pods():
    p = plan(suspended_job(), observed(kueue=kueue(None)), at(0), CONFIG, status={})
    created = created_workload(p)
    assert created["spec"]["active"] is False
    assert created["metadata"]["annotations"]["torchfleet.dev/suspended"] == "true"
    assert pods_of(p) == [] and p.status["phase"] == "Suspended"


def test_suspending_a_waiting_job_deactivates_its_workload_in_place():
    p = plan(suspended_job(), observed(kueue=kueue(PENDING)), at(0), CONFIG, status={})
    (patch,) = p.workload_patches
    assert patch.field_manager is None and patch.delete_uid is None  # a merge patch, not a new one
    assert patch.body["spec"] == {"active": False}
    assert patch.body["metadata"]["annotations"] == {"torchfleet.dev/suspended": "true"}
    assert p.status["phase"] == "Suspended"


def test_an_admitted_job_suspended_stops_and_then_hands_its_quota_back():
    status = {"phase": "Running", "restartCount": 0}
    running = plan(suspended_job(), observed(*gang(), kueue=kueue(ADMITTED)), at(5), CONFIG, status)
    assert sorted(r.name for r in running.delete) == [
        "llm-master-0",
        "llm-worker-0",
        "llm-worker-1",
    ]
    assert [p.body["spec"] for p in running.workload_patches] == [{"active": False}]
    # Kueue evicts the deactivated Workload; once the pods are gone, its quota goes back.
    deactivated = workload_manifest(
        [
            *EVICTED["status"]["conditions"][:2],
            cond("Evicted", reason="Deactivated", message="The workload is deactivated"),
        ],
        EVICTED["status"]["admission"],
    )
    deactivated["spec"]["active"] = False
    deactivated["metadata"]["annotations"] = {"torchfleet.dev/suspended": "true"}
    gone = plan(suspended_job(), observed(kueue=kueue(deactivated)), at(9), CONFIG, status)
    (hand_back,) = gone.workload_patches
    assert hand_back.field_manager == "kueue-admission"
    assert "admission" not in hand_back.body["status"]
    assert gone.status.get("disruptions", 0) == 0  # the user's suspend is no disruption


def deactivated_by(annotations: dict[str, str]) -> dict[str, Any]:
    manifest = workload_manifest(
        [cond("Evicted", reason="Deactivated", message="The workload is deactivated")]
    )
    manifest["spec"]["active"] = False
    manifest["metadata"]["annotations"] = annotations
    return manifest


def test_resuming_reactivates_the_workload_the_job_deactivated():
    manifest = made_by_this_operator(deactivated_by({}), job(**QUEUED))
    manifest["metadata"]["annotations"]["torchfleet.dev/suspended"] = "true"
    p = plan(job(**QUEUED), observed(kueue=kueue(manifest)), at(0), CONFIG, status={})
    (patch,) = p.workload_patches
    assert patch.body["spec"] == {"active": True}
    assert patch.body["metadata"]["annotations"] == {"torchfleet.dev/suspended": None}
    assert pods_of(p) == []


def test_a_workload_someone_else_deactivated_stays_inactive():
    manifest = made_by_this_operator(deactivated_by({}), job(**QUEUED))
    p = plan(job(**QUEUED), observed(kueue=kueue(manifest)), at(0), CONFIG, status={})
    assert [patch.body.get("spec") for patch in p.workload_patches] == []


# ---- a Workload replaced when the job changed while it waits --------------------------


def test_a_waiting_workload_whose_pod_sets_changed_is_replaced():
    before = made_by_this_operator(PENDING, job(workers=2, **QUEUED))
    after = job(workers=3, **QUEUED)
    p = plan(after, observed(kueue=kueue(before)), at(0), CONFIG, status={})
    (patch,) = p.workload_patches
    assert patch.delete_uid == "wl-uid" and patch.name == "trainingjob-llm-abcde"
    assert pods_of(p) == [] and p.status["phase"] == "Pending"
    assert find(p.status["conditions"], "Created")["reason"] == "WorkloadReplaced"
    # Once it is gone, the next pass makes the new one, with three workers.
    again = created_workload(plan(after, observed(kueue=kueue(None)), at(1), CONFIG, status={}))
    assert [s["count"] for s in again["spec"]["podSets"]] == [1, 3]


def test_an_unchanged_workload_is_kept():
    kept = made_by_this_operator(PENDING, job(**QUEUED))
    p = plan(job(**QUEUED), observed(kueue=kueue(kept)), at(0), CONFIG, status={})
    assert p.workload_patches == [] and p.create == []


def test_an_admitted_workload_is_never_replaced():
    admitted = made_by_this_operator(ADMITTED, job(workers=2, **QUEUED))
    p = plan(job(workers=3, **QUEUED), observed(kueue=kueue(admitted)), at(0), CONFIG, status={})
    assert all(patch.delete_uid is None for patch in p.workload_patches)


def test_a_workload_without_the_hash_is_kept():
    # Made by an older operator: no hash to compare, so no churn on upgrade.
    p = plan(job(workers=3, **QUEUED), observed(kueue=kueue(PENDING)), at(0), CONFIG, status={})
    assert p.workload_patches == []


def test_the_hash_ignores_the_image_and_follows_the_requests():
    spec = spec_of(job(workers=2, resources={"gpus": 8}))
    sets = wl.pod_sets("llm", "team", "uid-1", spec, "img:1")
    assert wl.pod_sets_hash(sets) == wl.pod_sets_hash(
        wl.pod_sets("llm", "team", "uid-1", spec, "img:2")
    )
    more = spec_of(job(workers=2, resources={"gpus": 4}))
    assert wl.pod_sets_hash(sets) != wl.pod_sets_hash(
        wl.pod_sets("llm", "team", "uid-1", more, "img:1")
    )


def test_a_resumed_job_whose_workload_never_ran_waits_without_an_eviction():
    # Kueue marks the deactivated Workload Evicted even though it never ran.
    manifest = made_by_this_operator(deactivated_by({}), job(**QUEUED))
    manifest["metadata"]["annotations"]["torchfleet.dev/suspended"] = "true"
    p = plan(job(**QUEUED), observed(kueue=kueue(manifest)), at(0), CONFIG, status={})
    assert find(p.status["conditions"], "Evicted") is None
    assert find(p.status["conditions"], "Created")["reason"] == "WaitingForAdmission"


def test_a_workload_someone_else_deactivated_shows_kueues_eviction():
    manifest = made_by_this_operator(deactivated_by({}), job(**QUEUED))
    p = plan(job(**QUEUED), observed(kueue=kueue(manifest)), at(0), CONFIG, status={})
    evicted = find(p.status["conditions"], "Evicted")
    assert evicted["status"] == "True" and evicted["reason"] == "Deactivated"
