"""policy/gang.py, kueue.py and reporting.py: create what the gang misses, read its
phase, gate on Kueue, report progress. One row per case."""

from __future__ import annotations

from typing import Any

import pytest

from torchfleet_operator.observed import Flavor, KueueView, Observed, ObservedWorkload
from torchfleet_operator.policy import gang as gang_policy
from torchfleet_operator.policy import kueue, reporting
from torchfleet_operator.status.conditions import find

from .builders import (
    a_pass,
    created_names,
    gang,
    observed,
    pod,
    running_status,
    spec_of,
    stamp,
    status_of,
)

QUEUED = {"scheduling": {"queueName": "team-a"}}


# ---- gang.py ----


@pytest.mark.parametrize(
    ("seen", "kinds", "pods"),
    [
        (
            Observed(),
            ["Service", "Pod", "Pod", "Pod"],
            ["llm-master-0", "llm-worker-0", "llm-worker-1"],
        ),
        (observed(pod("llm", 0)), ["Pod", "Pod"], ["llm-worker-0", "llm-worker-1"]),
        # Not yet watched: not created twice.
        (
            observed(expected_created=frozenset({"llm-worker-0"})),
            ["Pod", "Pod"],
            ["llm-master-0", "llm-worker-1"],
        ),
        # Refused a moment ago: waits for its back-off.
        (
            observed(held=frozenset({"llm-worker-1"})),
            ["Pod", "Pod"],
            ["llm-master-0", "llm-worker-0"],
        ),
        # A refused Service holds back every pod (they need its DNS names).
        (Observed(held=frozenset({"llm"})), [], []),
    ],
)
def test_create_missing(seen, kinds, pods):
    step = a_pass(seen)
    gang_policy.create_missing(step, spec_of(), list(seen.pods), 0, "img:1", None)
    assert [m["kind"] for m in step.plan.create] == kinds
    assert created_names(step.plan) == pods


@pytest.mark.parametrize(
    ("phases", "old", "phase", "running"),
    [
        (("Running",) * 3, {}, "Running", "True"),
        (("Running", "Running", "Pending"), {}, "Pending", None),
        # A restart's back-off is not hidden by pods still forming.
        (("Pending",) * 3, {"phase": "Restarting", "restartCount": 1}, "Restarting", None),
    ],
)
def test_the_phase_comes_from_the_gang(phases, old, phase, running):
    pods = [pod("llm", rank, phase=p) for rank, p in enumerate(phases)]
    status = dict(old)
    if old.get("phase") == "Restarting":
        status["conditions"] = [
            {
                "type": "Restarting",
                "status": "True",
                "reason": "PodFailed",
                "message": "",
                "lastTransitionTime": stamp(0),
            }
        ]
    step = a_pass(observed(*pods), {"restartCount": 0, **status})
    gang_policy.observe(step, spec_of(), pods, 3)
    assert status_of(step)["phase"] == phase
    found = find(status_of(step).get("conditions"), "Running")
    assert (found or {}).get("status") == running


def test_an_unscheduled_pod_is_named_with_the_schedulers_words():
    pods = [pod("llm", 0), pod("llm", 1, unschedulable="Unschedulable: 0/3 nodes have GPUs")]
    step = a_pass(observed(*pods), {"restartCount": 0})
    gang_policy.observe(step, spec_of(workers=1), pods, 2)
    scheduled = find(status_of(step)["conditions"], "Scheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
    assert scheduled["message"] == "pod llm-worker-0: 0/3 nodes have GPUs"


# ---- kueue.py ----


def workload(
    *conditions: dict[str, Any], admission: dict[str, Any] | None = None
) -> ObservedWorkload:
    status: dict[str, Any] = {"conditions": list(conditions)}
    if admission is not None:
        status["admission"] = admission
    meta = {"name": "trainingjob-llm-1", "namespace": "team", "uid": "wl", "resourceVersion": "1"}
    return ObservedWorkload({"kind": "Workload", "metadata": meta, "status": status})


def cond(type_: str, value: bool = True, reason: str = "R") -> dict[str, Any]:
    status = "True" if value else "False"
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": "m",
        "lastTransitionTime": stamp(0),
    }


ADMISSION = {
    "podSetAssignments": [
        {"name": "master", "flavors": {"cpu": "f"}, "count": 1},
        {"name": "worker", "flavors": {"cpu": "f"}, "count": 2},
    ]
}
ADMITTED = workload(cond("QuotaReserved"), cond("Admitted"), admission=ADMISSION)
FLAVORS = {"f": Flavor(node_labels={"pool": "a"})}


@pytest.mark.parametrize(
    ("view", "placement", "created", "condition"),
    [
        (KueueView(installed=False), None, [], ("Admitted", "False", "KueueNotInstalled")),
        (KueueView(), None, ["Workload"], ("Admitted", "False", "WorkloadCreated")),
        (
            KueueView(workload=workload(cond("QuotaReserved", False))),
            None,
            [],
            ("Created", "False", "WaitingForAdmission"),
        ),
        (KueueView(workload=ADMITTED), None, [], ("Admitted", "True", "R")),  # flavors not seen yet
        (
            KueueView(workload=ADMITTED, flavors=FLAVORS),
            {"pool": "a"},
            [],
            ("Admitted", "True", "R"),
        ),
    ],
)
def test_the_kueue_gate(view, placement, created, condition):
    step = a_pass(observed(kueue=view), {}, **QUEUED)
    admitted = kueue.gate(step, spec_of(**QUEUED), "team-a", [], "img:1")
    if placement is None:
        assert admitted is None and status_of(step).get("phase", "Pending") == "Pending"
    else:
        assert admitted is not None and admitted["worker"].node_selector == placement
    assert [m["kind"] for m in step.plan.create] == created
    found = find(status_of(step)["conditions"], condition[0])
    assert (found["type"], found["status"], found["reason"]) == condition


def test_an_evicted_gang_stops_then_hands_its_quota_back():
    evicted = workload(
        cond("QuotaReserved"),
        cond("Admitted"),
        cond("Evicted", reason="Preempted"),
        admission=ADMISSION,
    )
    running = a_pass(
        observed(*gang(), kueue=KueueView(workload=evicted)), running_status(), **QUEUED
    )
    assert kueue.gate(running, spec_of(**QUEUED), "team-a", list(gang()), "img:1") is None
    assert len(running.plan.delete) == 3 and running.plan.workload_patches == []
    assert status_of(running)["disruptions"] == 1
    gone = a_pass(observed(kueue=KueueView(workload=evicted)), status_of(running), **QUEUED)
    kueue.gate(gone, spec_of(**QUEUED), "team-a", [], "img:1")
    assert [p.name for p in gone.plan.workload_patches] == ["trainingjob-llm-1"]
    assert status_of(gone)["disruptions"] == 1  # counted once


# ---- reporting.py ----


@pytest.mark.parametrize(
    ("old_phase", "shown"),
    [("Running", 7), ("Pending", None)],  # only a running gang's scrape is shown
)
def test_the_latest_scrape_is_shown_for_a_running_gang(old_phase, shown):
    scrape = {"step": 7, "updateTime": stamp(1)}
    step = a_pass(
        observed(progress=scrape, checkpoint_step=5), running_status(phase=old_phase), now=2
    )
    reporting.record_progress(step)
    assert (status_of(step).get("progress") or {}).get("step") == shown
    assert status_of(step)["lastCheckpoint"] == {"step": 5, "time": stamp(1)}  # when scraped


SHOWN = {"step": 48, "time": stamp(50)}
SAVED = {"step": 139, "time": stamp(60)}


@pytest.mark.parametrize(
    ("shown", "scraped", "saved", "expected"),
    [
        # The save a preempted trainer reported, after the last scrape: shown, dated when made.
        (SHOWN, (48, 50), (139, 60), SAVED),
        # The old gang's last scrape, still held by the poller, never takes it back.
        (SAVED, (48, 55), (139, 60), SAVED),
        # A newer gang's scrape of a later save wins over an older report.
        (SAVED, (160, 90), (139, 60), {"step": 160, "time": stamp(90)}),
        # A report no newer than what is shown changes nothing.
        (SHOWN, None, (30, 40), SHOWN),
        # A pod's clock ahead of ours: dated now, never in the future.
        (SHOWN, None, (139, 500), {"step": 139, "time": stamp(100)}),
    ],
    ids=["grace-save", "stale-scrape", "newer-scrape", "older-report", "future-clock"],
)
def test_the_newest_save_known_is_the_last_checkpoint(shown, scraped, saved, expected):
    from torchfleet_operator.observed import SavedCheckpoint

    from .builders import at

    progress = {"step": scraped[0], "updateTime": stamp(scraped[1])} if scraped else None
    seen = observed(
        progress=progress,
        checkpoint_step=scraped[0] if scraped else None,
        saved_checkpoint=SavedCheckpoint(saved[0], at(saved[1])),
    )
    step = a_pass(seen, running_status(phase="Suspended", lastCheckpoint=shown), now=100)
    reporting.record_checkpoint(step)
    assert status_of(step)["lastCheckpoint"] == expected
