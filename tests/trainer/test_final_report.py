"""A run that ends leaves its final figures in the termination message.

Two gloo ranks under the launcher train a tiny model to its last step, saving
and evaluating on the way. Rank 0's termination message (the file the kubelet
makes; here one the test names) then holds what its last log lines say: the
last step, its loss and throughput, the last validation loss, and the step
and time of the last save, which is on the volume. The operator shows these,
not its last scrape, as the job's final status (tests/unit/operator/
test_final_status.py; end to end: tests/e2e/test_final_status.py).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.trainer.cli_process import TrainerProcess, free_port
from tests.trainer.user_models import TINY_LLAMA
from torchfleet_trainer import contract
from torchfleet_trainer.checkpoint import MARKER, step_dir

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
