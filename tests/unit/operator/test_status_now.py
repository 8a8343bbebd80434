"""Conditions say what is true now, and each lifecycle transition has its event.

When a condition flips, its reason and message describe the new state: a
succeeded job's Running=False does not say "all 3 pods are running", a
running gang's Restarting=False does not repeat the restart. A job whose
trainer knows no MFU (a CPU) shows none rather than 0.
"""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from torchfleet_operator.reconcile import plan
from torchfleet_operator.status.conditions import find
from torchfleet_operator.status.progress import progress_from_metrics
from torchfleet_trainer.metrics import TrainMetrics

from .builders import CONFIG, at, gang, job, observed, pod, running_status

RESTART_ON_FAILURE = {"runPolicy": {"restartPolicy": "OnFailure"}}


def ran_whole() -> dict:
    """The status of a job whose gang 0 ran whole."""
    return plan(job(), observed(*gang()), at(0), CONFIG, status={}).status


def restarted() -> dict:
    failed = pod("llm", 1, phase="Failed", exit_code=1, finished_at=at(1))
    seen = observed(*gang(**{"llm-worker-0": failed}))
    return plan(job(**RESTART_ON_FAILURE), seen, at(2), CONFIG, status=ran_whole()).status


def test_a_succeeded_jobs_running_condition_says_it_succeeded():
    done = gang(**{"llm-master-0": pod("llm", 0, phase="Succeeded")})
    status = plan(job(), observed(*done), at(5), CONFIG, status=ran_whole()).status
    running = find(status["conditions"], "Running")
    assert (running["status"], running["reason"]) == ("False", "Succeeded")
    assert "pods are running" not in running["message"]
    assert running["message"] == "the job Succeeded: the master pod exited 0"


def test_a_restart_ends_running_with_the_failure_and_a_new_gang_ends_restarting():
    status = restarted()
    running = find(status["conditions"], "Running")
    assert (running["status"], running["reason"]) == ("False", "PodFailed")
    assert running["message"].startswith("gang 0 ended: pod llm-worker-0 PodFailed")
    again = plan(
        job(**RESTART_ON_FAILURE), observed(*gang(restart=1)), at(30), CONFIG, status=status
    ).status
    restarting = find(again["conditions"], "Restarting")
    assert (restarting["status"], restarting["reason"]) == ("False", "GangRunning")
    assert restarting["message"] == "gang 1 is running"


def test_a_resumed_gang_says_from_which_checkpoint():
    status = restarted() | {"lastCheckpoint": {"step": 40, "time": "2026-01-01T12:00:01Z"}}
    resumed = plan(
        job(**RESTART_ON_FAILURE), observed(*gang(restart=1)), at(30), CONFIG, status=status
    )
    events = {(e.type, e.reason): e.message for e in resumed.events}
    assert events[("Normal", "GangResumed")] == (
        "gang 1 is running; it resumes from the checkpoint of step 40"
    )
    assert ("Normal", "GangRunning") in events  # the phase change's own event stays


def test_the_first_gang_of_a_job_without_a_checkpoint_has_no_resume_event():
    events = plan(job(), observed(*gang()), at(0), CONFIG, status={}).events
    assert [e.reason for e in events] == ["GangRunning"]


def test_a_restart_while_already_restarting_has_its_event():
    """Gang 1 fails before it ever ran whole: the phase stays Restarting, and the
    second restart is still announced."""
    status = restarted()
    failed = pod("llm", 2, restart=1, phase="Failed", exit_code=1, finished_at=at(31))
    seen = observed(*gang(restart=1, phase="Pending", **{"llm-worker-1": failed}))
    second = plan(job(**RESTART_ON_FAILURE), seen, at(32), CONFIG, status=status)
    assert second.gang_restart == "PodFailed" and second.status["restartCount"] == 2
    assert [(e.type, e.reason) for e in second.events] == [("Warning", "PodFailed")]
    assert second.events[0].message.startswith("restart 2 ")


@pytest.mark.parametrize(("finish", "reason", "type_"), [("Succeeded", "Succeeded", "Normal")])
def test_the_end_of_a_job_has_its_event(finish, reason, type_):
    done = gang(**{"llm-master-0": pod("llm", 0, phase=finish)})
    events = plan(job(), observed(*done), at(5), CONFIG, status=ran_whole()).events
    assert [(e.type, e.reason) for e in events] == [(type_, reason)]


def test_a_job_that_fails_has_its_event():
    failed = pod("llm", 1, phase="Failed", exit_code=1, finished_at=at(1))
    status = running_status(countedRestarts=0)
    p = plan(
        job(runPolicy={"backoffLimit": 0}),
        observed(*gang(**{"llm-worker-0": failed})),
        at(2),
        CONFIG,
        status=status,
    )
    assert [(e.type, e.reason) for e in p.events] == [("Warning", "BackoffLimitExceeded")]


def test_no_mfu_is_shown_where_the_trainer_knows_none():
    """On a CPU the trainer never sets its MFU gauge: its 0 means unknown."""
    trainer = TrainMetrics()
    trainer.step.set(5)
    trainer.loss.set(2.5)
    trainer.step_seconds.observe(1.0)
    progress, _ = progress_from_metrics(generate_latest(trainer.registry).decode(), "now")
    assert progress is not None and progress["loss"] == 2.5
    assert "mfu" not in progress
    trainer.mfu.set(0.3)
    progress, _ = progress_from_metrics(generate_latest(trainer.registry).decode(), "now")
    assert progress is not None and progress["mfu"] == 0.3
