"""MultiKueue's two sides of one job: on the manager cluster the operator makes
only the job's Workload (policy/managed.py: Kueue's rule for an external
framework), on the worker it runs the copy under the Workload MultiKueue
copied beside it, named by the job's prebuilt-workload label (policy/kueue.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from torchfleet_operator.api import constants as c
from torchfleet_operator.desired import workload as wl
from torchfleet_operator.observed import Observed, ObservedWorkload
from torchfleet_operator.policy import admission
from torchfleet_operator.reconcile import plan
from torchfleet_operator.status.conditions import find

from .builders import CONFIG, at, job, observed
from .test_kueue_admission import ADMITTED, EVICTED, PENDING, QUEUED, kueue, pods_of

MK = {"managedBy": c.MANAGED_BY_MULTIKUEUE}
PREBUILT = "trainingjob-llm-abcde"  # ADMITTED's name


def _deleting(body: dict[str, Any]) -> dict[str, Any]:
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return body


# (case, job, observed, makes a Workload)
MANAGER = [
    ("queued, Kueue installed, no Workload yet", job(**MK, **QUEUED), kueue(None), True),
    ("its Workload exists", job(**MK, **QUEUED), kueue(PENDING), False),
    ("no queue: Kueue does not dispatch it", job(**MK), kueue(None), False),
    ("Kueue not installed", job(**MK, **QUEUED), kueue(None, installed=False), False),
    ("no Kueue view at all", job(**MK, **QUEUED), None, False),
    ("being deleted", _deleting(job(**MK, **QUEUED)), kueue(None), False),
    ("another manager", job(managedBy="example.com/other", **QUEUED), kueue(None), False),
    ("a spec it cannot parse", job(**MK, **QUEUED, nonsense=1), kueue(None), False),
    (
        "its WorkloadPriorityClass missing",
        job(**MK, **QUEUED),
        kueue(None, workload_priority_class="high"),
        False,
    ),
]


@pytest.mark.parametrize(
    ("body", "view", "makes"), [row[1:] for row in MANAGER], ids=[row[0] for row in MANAGER]
)
def test_on_the_manager_only_the_workload_is_made(body: Any, view: Any, makes: bool) -> None:
    seen = observed(kueue=view) if view is not None else Observed()
    decided = plan(body, seen, at(0), CONFIG)
    assert decided.managed_by == body["spec"]["managedBy"]
    assert [m["kind"] for m in decided.create] == (["Workload"] if makes else [])
    # Never a status (MultiKueue mirrors the worker's), a pod, a deletion or a patch.
    assert decided.status == {} and decided.delete == [] and decided.workload_patches == []


def test_the_managers_workload_is_the_one_the_job_would_have_and_the_job_controls_it() -> None:
    body = job(**MK, **QUEUED)
    [made] = plan(body, observed(kueue=kueue(None)), at(0), CONFIG).create
    unmanaged = job(**QUEUED)
    [same] = [
        m
        for m in plan(unmanaged, observed(kueue=kueue(None)), at(0), CONFIG, status={}).create
        if m["kind"] == "Workload"
    ]
    assert made == same  # MultiKueue copies it; the worker's Kueue admits these pod sets
    [owner] = made["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("TrainingJob", "uid-1", True)
    assert made["metadata"]["name"] == wl.workload_name("llm", "uid-1")


def test_on_the_manager_an_evicted_workload_hands_its_quota_back() -> None:
    """A worker lost (the admission check set to Retry) or a preemption evicts
    the manager's Workload; the job has no pods there, so its quota is handed
    back at once (jobframework's eviction step) and Kueue dispatches it anew."""
    assert ObservedWorkload(EVICTED).has_reservation
    decided = plan(job(**MK, **QUEUED), observed(kueue=kueue(EVICTED)), at(0), CONFIG)
    [patch] = decided.workload_patches
    assert (patch.name, patch.field_manager) == (EVICTED["metadata"]["name"], "kueue-admission")
    assert patch.field_manager == admission.ADMISSION_FIELD_MANAGER
    reserved = find(patch.body["status"]["conditions"], "QuotaReserved")
    assert reserved is not None and reserved["status"] == "False"
    assert "admission" not in patch.body["status"]
    assert decided.create == [] and decided.status == {}
    # Its admission checks' states stay (Kueue applies them under the same
    # manager: an apply without them is refused, 422 'admissionChecks[0].state:
    # Required value').
    checks = [{"name": "mk", "state": "Pending", "message": "m", "lastTransitionTime": "t"}]
    with_check = copy.deepcopy(EVICTED)
    with_check["status"]["admissionChecks"] = checks
    [kept] = plan(
        job(**MK, **QUEUED), observed(kueue=kueue(with_check)), at(0), CONFIG
    ).workload_patches
    assert kept.body["status"]["admissionChecks"] == checks
    # Handed back already (no reservation): nothing more.
    again = plan(job(**MK, **QUEUED), observed(kueue=kueue(PENDING)), at(0), CONFIG)
    assert again.workload_patches == []


def _copy_on_worker(**spec: Any) -> dict[str, Any]:
    """The job as MultiKueue creates it on the worker: no managedBy, the label
    naming the Workload it copied, another uid than the manager's."""
    body = job(**QUEUED, **spec)
    body["metadata"]["uid"] = "worker-uid"
    body["metadata"]["labels"] = {c.KUEUE_PREBUILT_WORKLOAD_LABEL: PREBUILT}
    return body


def _unowned(manifest: dict[str, Any], **annotations: str) -> dict[str, Any]:
    """MultiKueue's copy of the manager's Workload: no owner (CloneObjectMetaForCreation)."""
    found = copy.deepcopy(manifest)
    found["metadata"].pop("ownerReferences")
    found["metadata"]["annotations"] = dict(annotations)
    return found


def _owned(manifest: dict[str, Any]) -> dict[str, Any]:
    found = copy.deepcopy(manifest)
    found["metadata"]["ownerReferences"] = [{"uid": "worker-uid", "controller": True}]
    return found


def test_on_the_worker_the_copy_waits_for_the_copied_workload_and_makes_none() -> None:
    decided = plan(_copy_on_worker(), observed(kueue=kueue(None)), at(0), CONFIG, status={})
    assert decided.managed_by is None  # the copy is this operator's to run
    assert decided.create == [] and decided.workload_patches == []
    assert decided.status["phase"] == "Pending"
    created = find(decided.status["conditions"], "Created")
    assert created is not None
    assert PREBUILT in created["message"] and "MultiKueue" in created["message"]


def test_on_the_worker_the_copied_workload_is_taken_over_as_jobframework_does() -> None:
    decided = plan(
        _copy_on_worker(), observed(kueue=kueue(_unowned(PENDING))), at(0), CONFIG, status={}
    )
    [patch] = decided.workload_patches
    assert patch.name == PREBUILT and patch.field_manager is None and not patch.delete_uid
    meta = patch.body["metadata"]
    assert meta["labels"] == {wl.JOB_UID_LABEL: "worker-uid"}
    [owner] = meta["ownerReferences"]
    assert (owner["uid"], owner["controller"], owner["name"]) == ("worker-uid", True, "llm")
    assert pods_of(decided) == []  # not admitted yet


@pytest.mark.parametrize("owned", [False, True], ids=["not yet owned", "owned"])
def test_on_the_worker_the_admitted_copy_runs_and_is_never_replaced(owned: bool) -> None:
    # The manager's hash annotation (another image, another uid) must not make it stale.
    found = _owned(ADMITTED) if owned else _unowned(ADMITTED)
    found["metadata"]["annotations"] = {wl.POD_SETS_HASH_ANNOTATION: "from-the-manager"}
    decided = plan(_copy_on_worker(), observed(kueue=kueue(found)), at(0), CONFIG, status={})
    assert [m["kind"] for m in decided.create if m["kind"] == "Workload"] == []
    assert not any(p.delete_uid for p in decided.workload_patches)
    assert len(pods_of(decided)) == 3
    assert len(decided.workload_patches) == (0 if owned else 1)
