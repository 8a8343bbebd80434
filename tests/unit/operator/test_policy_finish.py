"""policy/finish.py, clean_pod.py and ttl.py: what a finished job deletes, and when
the job itself goes. One row per case."""

from __future__ import annotations

import dataclasses

import pytest

from torchfleet_operator.policy import finish, ttl

from .builders import a_pass, at, deleted_names, observed, pod, spec_of, stamp

DONE = pod("llm", 0, phase="Succeeded")
RUNNING = pod("llm", 1)
SIDECARS = dataclasses.replace(pod("llm", 2, phase="Succeeded"), sidecars_running=True)


def failed(reason: str) -> dict:
    condition = {
        "type": "Failed",
        "status": "True",
        "reason": reason,
        "message": "",
        "lastTransitionTime": stamp(0),
    }
    return {"phase": "Failed", "completionTime": stamp(0), "conditions": [condition]}


SUCCEEDED = {"phase": "Succeeded", "completionTime": stamp(0)}


@pytest.mark.parametrize(
    ("status", "policy", "deleted"),
    [
        (SUCCEEDED, "Running", ["llm-worker-0"]),  # finished pods stay for their logs
        (SUCCEEDED, "All", ["llm-master-0", "llm-worker-0"]),
        (SUCCEEDED, "None", []),
        (failed("PodFailedPermanently"), "None", []),
        # A job that failed for a reason its pods cannot explain holds nothing.
        (failed("DeadlineExceeded"), "None", ["llm-master-0", "llm-worker-0"]),
        (failed("BackoffLimitExceeded"), "Running", ["llm-master-0", "llm-worker-0"]),
    ],
)
def test_a_finished_job_cleans_its_pods(status, policy, deleted):
    run_policy = {"cleanPodPolicy": policy}
    step = a_pass(observed(DONE, RUNNING), status, runPolicy=run_policy)
    decided = finish.finished(step, spec_of(runPolicy=run_policy))
    assert deleted_names(decided) == deleted


def test_a_trainer_done_beside_running_sidecars_is_deleted_whatever_the_policy():
    run_policy = {"cleanPodPolicy": "None"}
    step = a_pass(observed(SIDECARS), SUCCEEDED, runPolicy=run_policy)
    assert deleted_names(finish.finished(step, spec_of(runPolicy=run_policy))) == ["llm-worker-1"]


@pytest.mark.parametrize(
    ("ttl_seconds", "now", "delete_job", "wake"),
    [(None, 1000, False, None), (60, 30, False, 30), (60, 60, True, None), (0, 0, True, None)],
)
def test_the_ttl_deletes_the_job_or_wakes_the_pass_when_due(ttl_seconds, now, delete_job, wake):
    step = a_pass(observed(), SUCCEEDED, now=now)
    ttl.expire(step, ttl_seconds)
    assert step.plan.delete_job is delete_job
    assert step.plan.requeue_after == wake


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        ({"runPolicy": {"ttlSecondsAfterFinished": 5}}, 5),
        ({"runPolicy": {"ttlSecondsAfterFinished": -1}}, None),
        ({"runPolicy": {"ttlSecondsAfterFinished": True}}, None),
        ({"runPolicy": "garbage"}, None),
        ({}, None),
    ],
)
def test_the_raw_ttl_is_read_without_trusting_the_spec(raw, seconds):
    assert ttl.raw_ttl(raw) == seconds


def test_seconds_left_counts_from_completion():
    assert ttl.seconds_left(at(0), 100, at(40)) == 60
    assert ttl.seconds_left(None, 100, at(40)) is None
