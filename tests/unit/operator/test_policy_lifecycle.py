"""policy/invalid.py, deadline.py, suspend.py and success.py: one row per case."""

from __future__ import annotations

import pytest

from torchfleet_operator.api.parse import wire
from torchfleet_operator.observed import timestamp
from torchfleet_operator.policy import deadline, invalid, success, suspend
from torchfleet_operator.status.conditions import find

from .builders import a_pass, at, deleted_names, gang, observed, pod, running_status, spec_of, stamp


def condition(type_: str, status: str, reason: str, message: str = "") -> dict:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": stamp(0),
    }


# ---- invalid.py ----


@pytest.mark.parametrize(
    ("status", "pods", "raw", "phase", "deleted"),
    [
        # Before any gang: an invalid spec, Failed.
        ({}, (), {}, "Failed", []),
        # A running gang keeps its pods and phase.
        (running_status(), gang(), {}, "Running", []),
        # A finished job keeps its phase.
        ({"phase": "Succeeded", "completionTime": stamp(0)}, (), {}, "Succeeded", []),
        # A suspended one stays without pods.
        (running_status(), gang(), {"suspend": True}, "Suspended", sorted(p.name for p in gang())),
    ],
)
def test_a_spec_that_no_longer_parses(status, pods, raw, phase, deleted):
    step = a_pass(observed(*pods), status)
    decided = invalid.not_understood(step, raw, "spec.x: unknown field")
    assert decided.status["phase"] == phase
    assert deleted_names(decided) == deleted
    if phase != "Failed":
        said = find(decided.status["conditions"], "SpecNotUnderstood")
        assert said["status"] == "True" and "spec.x" in said["message"]


@pytest.mark.parametrize(
    ("children", "observed_generation", "fails"),
    [
        (condition("ChildrenRejected", "True", "PodInvalid", "bad mount"), 1, True),
        (condition("ChildrenRejected", "True", "PodInvalid", "bad mount"), 0, False),  # fixed since
        (condition("ChildrenRejected", "True", "CreateRejected", "quota"), 1, False),
        (condition("ChildrenRejected", "False", "Accepted"), 1, False),
    ],
)
def test_a_pod_template_refused_as_invalid_fails_the_job(children, observed_generation, fails):
    status = {"conditions": [children], "observedGeneration": observed_generation}
    step = a_pass(observed(), status)
    assert invalid.fail_if_pods_refused(step) is fails
    if fails:
        failed = step.condition("Failed")
        assert failed is not None and failed.reason == "InvalidSpec"
        assert "bad mount" in (failed.message or "")


# ---- deadline.py ----


@pytest.mark.parametrize(
    ("limit", "now", "exceeded", "wake"),
    [(None, 10_000, False, None), (100, 40, False, 60), (100, 100, True, None)],
)
def test_the_deadline_fails_the_job_or_wakes_the_pass(limit, now, exceeded, wake):
    run_policy = {} if limit is None else {"activeDeadlineSeconds": limit}
    step = a_pass(observed(), running_status(), now=now, runPolicy=run_policy)
    assert deadline.exceeded(step, spec_of(runPolicy=run_policy)) is exceeded
    assert step.plan.requeue_after == wake
    if exceeded:
        failed = step.condition("Failed")
        assert failed is not None and failed.reason == "DeadlineExceeded"


@pytest.mark.parametrize(
    ("old", "start"),
    [
        ({}, stamp(50)),  # the first unsuspended pass
        (running_status(), stamp(0)),  # kept while it runs
        (running_status(phase="Suspended"), stamp(50)),  # again at each resume
    ],
)
def test_the_clock_starts_at_the_first_pass_and_at_each_resume(old, start):
    step = a_pass(observed(), old, now=50)
    deadline.start_clock(step)
    assert step.status.start_time is not None and timestamp(step.status.start_time) == start


# ---- suspend.py ----


def test_suspending_deletes_every_live_pod_and_keeps_the_status():
    step = a_pass(observed(*gang()), running_status(restart=2))
    decided = suspend.suspend(step, list(gang()))
    assert decided.status["phase"] == "Suspended"
    assert decided.status["restartCount"] == 2
    assert deleted_names(decided) == sorted(p.name for p in gang())
    assert find(decided.status["conditions"], "Suspended")["status"] == "True"


# ---- success.py ----


@pytest.mark.parametrize(
    ("policy", "phases", "done"),
    [
        ("", ("Succeeded", "Running", "Running"), True),
        ("", ("Running", "Succeeded", "Succeeded"), False),
        ("AllWorkers", ("Succeeded", "Succeeded", "Running"), False),
        ("AllWorkers", ("Succeeded", "Succeeded", "Succeeded"), True),
    ],
)
def test_success(policy, phases, done):
    pods = [pod("llm", rank, phase=phase) for rank, phase in enumerate(phases)]
    assert success.succeeded(policy, pods, 3) is done


def test_a_trainer_that_succeeded_ran_every_step():
    progress = {"step": 90, "totalSteps": 100, "percent": 90, "etaSeconds": 5}
    pods = [pod("llm", 0, phase="Succeeded")]
    step = a_pass(observed(*pods), running_status(progress=progress), now=1)
    assert success.finish_if_succeeded(step, spec_of(), pods)
    assert step.status.phase == "Succeeded" and step.status.completion_time == at(1)
    assert step.status.progress is not None
    assert wire(step.status.progress) == {"step": 100, "totalSteps": 100, "percent": 100}
