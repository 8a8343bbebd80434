"""A run that ends leaves its final figures in the termination message.

Two gloo ranks under the launcher train a tiny model to its last step, saving
and evaluating on the way. Rank 0's termination message (the file the kubelet
makes; here one the test names) then holds what its last log lines say: the
last step, its loss and throughput, the last validation loss, and the step
and time of the last save, which is on the volume. The operator shows these,
not its last scrape, as the job's final status (tests/unit/operator/
test_final_status.py; end to end: tests/e2e/test_final_status.py).

A run that fails (here: it diverges, NaNs from step 3 on) leaves the same
figures, of the last step it ran, and beside them the failed rank's last log
lines, which the kubelet gives only for an empty message: the operator shows
them as the failure's message. Alone in its pod (no agent of ours) and under
the launcher alike.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.fixtures.trainer import REPO_ROOT
from tests.trainer.cli_process import TrainerProcess, free_port
from tests.trainer.test_non_finite import CONFIG as DIVERGING
from tests.trainer.test_non_finite import nan_model
from tests.trainer.user_models import TINY_LLAMA
from torchfleet_contract import pod as contract
from torchfleet_trainer.checkpoint import MARKER, step_dir
from torchfleet_trainer.launcher.outcomes import EXIT_DIVERGED
from torchfleet_trainer.termination import MESSAGE_LIMIT

pytestmark = pytest.mark.trainer

STEPS = 12


def test_a_completed_run_reports_its_last_step_losses_and_checkpoint(tmp_path: Path) -> None:
    message = tmp_path / "termination-log"
    env = {
        contract.CHECKPOINT_DIR: str(tmp_path / "ckpt"),
        contract.MASTER_PORT: str(free_port()),
        contract.JOB_NAME: "final-report",
        contract.TERMINATION_MESSAGE_PATH_ENV: str(message),
    }
    args = [
        *("--nproc-per-node", "2", *TINY_LLAMA, f"training.steps={STEPS}"),
        *("training.logInterval=5", "training.evalInterval=5", "training.evalBatches=2"),
        *("schedule.warmupSteps=1", "checkpoint.interval=5", "metrics.enabled=false"),
    ]
    trainer = TrainerProcess(args, env)
    assert trainer.finish(timeout=300) == 0, trainer.stderr[-3000:]

    report = json.loads(message.read_text())
    last = trainer.of("step")[-1]
    evaluations = trainer.of("eval")
    saves = trainer.of("checkpoint")
    assert last["step"] == STEPS and saves[-1]["step"] == STEPS  # the final save
    assert report[contract.REPORTED_STEP] == STEPS
    assert report[contract.REPORTED_TOTAL_STEPS] == STEPS
    assert report[contract.REPORTED_LOSS] == pytest.approx(last["loss"], rel=1e-6)
    assert report[contract.REPORTED_TOKENS_PER_SECOND] == pytest.approx(
        last["tokens_per_second"], rel=1e-3
    )
    assert evaluations[-1]["step"] == STEPS  # the last step evaluates too
    assert report[contract.REPORTED_VAL_LOSS] == pytest.approx(evaluations[-1]["val_loss"], 1e-5)
    assert report[contract.SAVED_CHECKPOINT_STEP] == STEPS
    assert (step_dir(tmp_path / "ckpt", STEPS) / MARKER).is_file()
    for key in (contract.SAVED_CHECKPOINT_TIME, contract.REPORTED_TIME):
        written = datetime.fromisoformat(report[key])
        assert abs((datetime.now(UTC) - written).total_seconds()) < 300
    assert contract.REPORTED_MFU not in report  # no peak is known for a CPU


@pytest.mark.parametrize("processes", [1, 2], ids=["alone", "under the launcher"])
def test_a_failed_run_reports_where_it_stood_and_its_last_lines(
    tmp_path: Path, processes: int
) -> None:
    message = tmp_path / "termination-log"
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = {
        nan_model.NAN_STEPS: ",".join(str(step) for step in range(3, 50)),
        "PYTHONPATH": path,
        contract.CHECKPOINT_DIR: str(tmp_path / "ckpt"),  # where the logs are kept
        contract.MASTER_PORT: str(free_port()),
        contract.JOB_NAME: "failed-report",
        contract.TERMINATION_MESSAGE_PATH_ENV: str(message),
    }
    args = ["--nproc-per-node", str(processes), *DIVERGING, "training.steps=40"]
    trainer = TrainerProcess(args, env)
    assert trainer.finish(timeout=300) == EXIT_DIVERGED, trainer.stderr[-3000:]

    written = message.read_bytes()
    assert len(written) <= MESSAGE_LIMIT
    report = json.loads(written)
    last = trainer.of("step")[-1]
    assert report[contract.REPORTED_STEP] == last["step"] == 5
    assert report[contract.SAVED_CHECKPOINT_STEP] == 2  # the NaN steps saved nothing
    # The failure's own words, as the pod's log ends with them.
    why = "training.maxNonFiniteSteps: 3 consecutive steps (up to step 5)"
    assert why in report[contract.REPORTED_LOG_TAIL], report
    assert why in trainer.stderr
