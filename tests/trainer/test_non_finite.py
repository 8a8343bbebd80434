"""A NaN loss or gradient norm skips the update, is counted, never costs a good
checkpoint, and too many in a row fail the run with a clear error.

The NaN comes from a user model that injects it on chosen steps
(tests/trainer/nan_model.py); the trainer runs as the real CLI process.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from tests.fixtures.trainer import REPO_ROOT
from tests.trainer import nan_model
from tests.trainer.cli_process import TrainerProcess
from torchfleet_contract.trainer_config import load_config
from torchfleet_trainer.checkpoint import complete_checkpoints
from torchfleet_trainer.launcher.outcomes import EXIT_DIVERGED
from torchfleet_trainer.metrics import TrainMetrics
from torchfleet_trainer.train import Trainer, build_runtime

pytestmark = pytest.mark.trainer

CONFIG = [
    f"model.importPath={nan_model.__name__}:build",
    "model.dim=16",
    "model.heads=2",
    "model.vocabSize=32",
    "model.maxSeqLen=8",
    "data.seqLen=8",
    "data.syntheticTokens=4096",
    "training.globalBatchSize=2",
    "training.evalInterval=0",
    "training.logInterval=1",
    "training.maxNonFiniteSteps=3",
    "schedule.warmupSteps=0",
    "checkpoint.interval=1",
    "metrics.enabled=false",
]


def run(tmp_path: Path, nan_steps: str, *overrides: str) -> TrainerProcess:
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = {nan_model.NAN_STEPS: nan_steps, "PYTHONPATH": path}
    ckpt = f"checkpoint.dir={tmp_path / 'ckpt'}"
    return TrainerProcess([*CONFIG, ckpt, *overrides], env)


def saved_steps(tmp_path: Path) -> list[int]:
    return [step for step, _ in complete_checkpoints(tmp_path / "ckpt")]


def test_non_finite_steps_are_skipped_and_not_checkpointed(tmp_path: Path) -> None:
    trainer = run(tmp_path, "3,4", "training.steps=6", "checkpoint.keepLast=10")
    assert trainer.finish(timeout=120) == 0, trainer.stderr[-3000:]
    skipped = trainer.of("non_finite_step")
    assert [(e["step"], e["consecutive"], e["loss"]) for e in skipped] == [
        (3, 1, "nan"),
        (4, 2, "nan"),
    ]
    # Had the NaN gradients reached the optimizer, every later loss would be NaN.
    losses = {e["step"]: e["loss"] for e in trainer.of("step")}
    assert all(math.isfinite(losses[step]) for step in (5, 6)), losses
    assert saved_steps(tmp_path) == [1, 2, 5, 6]


def test_consecutive_non_finite_steps_fail_the_run_keeping_good_checkpoints(
    tmp_path: Path,
) -> None:
    nan_from_3 = ",".join(str(step) for step in range(3, 50))
    trainer = run(tmp_path, nan_from_3, "training.steps=40", "checkpoint.keepLast=2")
    assert trainer.finish(timeout=120) == EXIT_DIVERGED
    assert "training.maxNonFiniteSteps: 3 consecutive steps (up to step 5)" in trainer.stderr
    assert [e["step"] for e in trainer.of("non_finite_step")] == [3, 4, 5]
    assert max(e["step"] for e in trainer.of("step")) == 5
    # keepLast=2 still holds the two good checkpoints from before the NaNs.
    assert saved_steps(tmp_path) == [1, 2]


def test_skipped_steps_are_counted_in_the_metric(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(nan_model.NAN_STEPS, "2,4,5")
    config = load_config(
        overrides=[*CONFIG, "training.steps=6", "checkpoint.enabled=false"], env={}
    )
    metrics = TrainMetrics()
    result = Trainer(config, build_runtime(config, distributed=False), metrics).run()
    assert result.status == "completed"
    assert metrics.registry.get_sample_value("torchfleet_train_non_finite_steps_total") == 3
