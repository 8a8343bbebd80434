"""A finished job's status comes from its trainer, not from the last scrape.

A run can end within a scrape interval of its last steps and its last save (a
fast machine ran 20 steps and a save in a second): the master's termination
message carries the trainer's final figures (observed.FinalReport), and the
pass that sets the final phase shows them, in the same status write. A job
whose program wrote no report keeps the last scrape, and says so."""

from __future__ import annotations

import json
from typing import Any

import pytest

from torchfleet_contract import pod as contract
from torchfleet_operator.api.v1alpha1 import ProgressStatus
from torchfleet_operator.observed import FinalReport, ObservedPod, SavedCheckpoint
from torchfleet_operator.reconcile import plan
from torchfleet_operator.status import progress as progress_status
from torchfleet_operator.status.conditions import find, set_condition

from .builders import CONFIG, at, gang, job, observed, running_status, stamp

# The last scrape: taken early in the run, long before its end.
EARLY_SCRAPE = {
    "step": 4,
    "totalSteps": 40,
    "percent": 10,
    "loss": 4.491375,
    "tokensPerSecond": 900.0,
    "etaSeconds": 30,
    "checkpointSaveSeconds": 0.5,
    "updateTime": stamp(50),
    "source": "Metrics",
}
REPORT = {
    contract.REPORTED_STEP: 40,
    contract.REPORTED_TOTAL_STEPS: 40,
    contract.REPORTED_LOSS: 2.912,
    contract.REPORTED_VAL_LOSS: 2.82,
    contract.REPORTED_TOKENS_PER_SECOND: 1200.5,
    contract.REPORTED_TIME: stamp(58),
    contract.SAVED_CHECKPOINT_STEP: 40,
    contract.SAVED_CHECKPOINT_TIME: stamp(57),
}


def running() -> dict[str, Any]:
    conditions = set_condition(None, "Running", True, "GangRunning", "all 3 pods", stamp(0))
    return running_status(
        conditions=conditions,
        progress=EARLY_SCRAPE,
        lastCheckpoint={"step": 20, "time": stamp(45)},
    )


def pod_status(report: dict[str, Any] | None) -> dict[str, Any]:
    """A succeeded master pod as the API server has it, its trainer's message in it."""
    terminated: dict[str, Any] = {"exitCode": 0, "reason": "Completed"}
    if report is not None:
        terminated["message"] = json.dumps(report)
    return {
        "metadata": {
            "name": "llm-master-0",
            "uid": "llm-0-0",
            "labels": {
                "torchfleet.dev/node-rank": "0",
                "torchfleet.dev/restart": "0",
                "torchfleet.dev/role": "master",
            },
        },
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [{"name": "trainer", "state": {"terminated": terminated}}],
        },
    }


def succeeded_master(report: dict[str, Any] | None) -> ObservedPod:
    found = ObservedPod.from_manifest(pod_status(report))
    assert found is not None
    return found


def finish(report: dict[str, Any] | None, **spec: Any) -> dict[str, Any]:
    """The pass that sees the master succeed, its report (if any) kept by the
    informer as a save (observed.saved_checkpoint), as the controller passes it."""
    master = succeeded_master(report)
    saved = None
    if report is not None and contract.SAVED_CHECKPOINT_STEP in report:
        saved = SavedCheckpoint(report[contract.SAVED_CHECKPOINT_STEP], at(57))
    seen = observed(
        *gang(**{master.name: master}),
        progress=EARLY_SCRAPE,
        checkpoint_step=20,
        saved_checkpoint=saved,
    )
    return plan(job(**spec), seen, at(60), CONFIG, status=running()).status


def test_a_job_that_succeeds_shows_its_trainers_last_step_losses_and_checkpoint() -> None:
    status = finish(REPORT)
    assert status["phase"] == "Succeeded"
    # The same write: the final phase, the final figures and the final checkpoint.
    assert status["progress"] == {
        "step": 40,
        "totalSteps": 40,
        "percent": 100,
        "loss": 2.912,
        "validationLoss": 2.82,
        "tokensPerSecond": 1200.5,
        "checkpointSaveSeconds": 0.5,  # the report has none: the last scrape's
        "updateTime": stamp(58),
        "source": "TrainerReport",
    }
    assert status["lastCheckpoint"] == {"step": 40, "time": stamp(57)}
    ProgressStatus.model_validate(status["progress"])  # the schema takes it as written


def test_a_final_save_in_the_second_of_the_scrape_that_showed_the_last_one_still_wins() -> None:
    """Times in the status have whole seconds: a scrape that showed the save of
    step 20 at 57.1 s and the final save of step 40 at 57.6 s read as the same
    second. The later save is the larger step (a run saves forward), so it is
    shown; seen once on a loaded machine as a Succeeded job at checkpoint 20."""
    shown = running()
    shown["lastCheckpoint"] = {"step": 20, "time": stamp(57)}
    master = succeeded_master(REPORT)
    seen = observed(
        *gang(**{master.name: master}),
        progress=EARLY_SCRAPE | {"updateTime": at(57.1).isoformat()},
        checkpoint_step=20,
        saved_checkpoint=SavedCheckpoint(40, at(57.6)),
    )
    status = plan(job(), seen, at(60), CONFIG, status=shown).status
    assert status["lastCheckpoint"] == {"step": 40, "time": stamp(57)}


def test_an_old_scrape_in_the_second_of_a_later_save_takes_nothing_back() -> None:
    """The other way round: the old gang's last scrape, still held, showing step
    20 in the second of the shown save of step 40, changes nothing."""
    shown = running()
    shown["lastCheckpoint"] = {"step": 40, "time": stamp(57)}
    seen = observed(
        *gang(),
        progress=EARLY_SCRAPE | {"updateTime": at(57.4).isoformat()},
        checkpoint_step=20,
    )
    status = plan(job(), seen, at(60), CONFIG, status=shown).status
    assert status["lastCheckpoint"] == {"step": 40, "time": stamp(57)}


def test_a_program_that_wrote_no_report_keeps_the_last_scrape_and_says_so() -> None:
    status = finish(None)
    assert status["phase"] == "Succeeded"
    # Today's behaviour: every step ran (the trainer exits 0 only after its last),
    # the rest is the last scrape's, no ETA; its source says where it comes from.
    expected = {k: v for k, v in EARLY_SCRAPE.items() if k != "etaSeconds"}
    assert status["progress"] == expected | {"step": 40, "percent": 100}
    assert status["progress"]["source"] == "Metrics"
    assert status["lastCheckpoint"]["step"] == 20


def test_a_report_from_a_user_command_is_not_read_as_the_trainers() -> None:
    """A user's command runs no torchfleet-train: its progress is the scrape's."""
    status = finish(REPORT, command=["python", "train.py"])
    assert status["phase"] == "Succeeded"
    assert status["progress"]["source"] == "Metrics"


@pytest.mark.parametrize(
    ("report", "expected"),
    [
        (REPORT, FinalReport(40, at(58), 40, 2.912, 2.82, 1200.5)),
        ({contract.SAVED_CHECKPOINT_STEP: 7, contract.SAVED_CHECKPOINT_TIME: stamp(1)}, None),
        (REPORT | {contract.REPORTED_STEP: True}, None),
        (REPORT | {contract.REPORTED_STEP: -1}, None),
        (REPORT | {contract.REPORTED_STEP: 2**63}, None),
        (REPORT | {contract.REPORTED_TIME: "yesterday"}, None),
        (
            REPORT | {contract.REPORTED_LOSS: "low", contract.REPORTED_VAL_LOSS: None},
            FinalReport(40, at(58), 40, None, None, 1200.5),
        ),
        (
            REPORT | {contract.REPORTED_TOTAL_STEPS: -3, contract.REPORTED_MFU: 0.5},
            FinalReport(40, at(58), None, 2.912, 2.82, 1200.5, 0.5),
        ),
    ],
    ids=[
        "the trainer's report",
        "a preemption save of an older trainer: no final figures",
        "a boolean is no step",
        "a negative step",
        "a step beyond int64",
        "no time",
        "a figure that is no number is left out",
        "a bad total is left out",
    ],
)
def test_the_report_is_read_as_untrusted_data(
    report: dict[str, Any], expected: FinalReport | None
) -> None:
    assert succeeded_master(report).final_report == expected


def test_figures_outside_the_schema_are_dropped_not_written() -> None:
    """One bad value in a status write gets the whole write refused (422)."""
    bad = FinalReport(40, at(58), 40, loss=2.0, tokens_per_second=-5.0, mfu=7.0)
    shown = progress_status.final(bad, None, at(60))
    assert "tokensPerSecond" not in shown and "mfu" not in shown
    assert shown["loss"] == 2.0
    # A pod's clock ahead of ours: the report is dated no later than now.
    ahead = progress_status.final(FinalReport(40, at(600), 40), None, at(60))
    assert ahead["updateTime"] == stamp(60)
    ProgressStatus.model_validate(shown)


FAILED_TAIL = (
    "Traceback (most recent call last):\n  ...\nRuntimeError: CUDA error: an illegal memory access"
)


def fail(report: dict[str, Any] | None, exit_code: int = 1) -> dict[str, Any]:
    """The pass that sees the master fail for good (restartPolicy Never; the
    peers it waited for have had their time), its
    trainer's message (the figures and the log tail the launcher put there) in it."""
    manifest = pod_status(report)
    manifest["status"]["phase"] = "Failed"
    terminated = manifest["status"]["containerStatuses"][0]["state"]["terminated"]
    terminated |= {"exitCode": exit_code, "reason": "Error", "finishedAt": stamp(48)}
    master = ObservedPod.from_manifest(manifest)
    assert master is not None
    seen = observed(*gang(**{master.name: master}), progress=EARLY_SCRAPE, checkpoint_step=20)
    spec = {"runPolicy": {"restartPolicy": "Never"}}
    return plan(job(**spec), seen, at(60), CONFIG, status=running()).status


def test_a_job_that_fails_shows_where_its_trainer_stood_and_its_last_lines() -> None:
    at_failure = REPORT | {
        contract.REPORTED_STEP: 23,
        contract.SAVED_CHECKPOINT_STEP: 20,
        contract.REPORTED_LOG_TAIL: FAILED_TAIL,
    }
    status = fail(at_failure)
    assert status["phase"] == "Failed"
    # The same write: the phase, the figures of the step it failed after.
    progress = status["progress"]
    assert (progress["step"], progress["source"]) == (23, "TrainerReport")
    assert (progress["loss"], progress["validationLoss"]) == (2.912, 2.82)
    assert "etaSeconds" not in progress  # a failed run has no time left
    failed = find(status["conditions"], "Failed")
    # The message is the failure's last lines, not the report's JSON.
    assert failed["message"].endswith(
        FAILED_TAIL.splitlines()[-1] + "; not retryable under restartPolicy Never"
    ), failed
    assert contract.REPORTED_LOSS not in failed["message"]


def test_a_failure_without_a_report_keeps_the_last_scrape_and_the_kubelets_tail() -> None:
    """An empty message (the launcher had no kept log lines), which the kubelet
    fills with the log's own tail: the last scrape stays, the tail is the message."""
    manifest_tail = "RuntimeError: out of patience"
    status = fail(None)
    assert status["phase"] == "Failed"
    assert status["progress"] == EARLY_SCRAPE
    master = pod_status(None)
    master["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = manifest_tail
    found = ObservedPod.from_manifest(master)
    assert found is not None and found.message == manifest_tail
