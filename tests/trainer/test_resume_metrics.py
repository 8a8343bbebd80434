"""What a scrape of a resumed trainer shows before the new gang's first step:
the checkpoint's step as the last completed one, and no loss or throughput
(the gauges' initial zeros would read as a perfect model at no speed).

The trainer runs in this process and is read as the operator reads it, through
the contract's names (status/progress.py); a one-rank group, since the
Checkpointer runs collectives.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest

from tests.trainer.user_models import TINY_LLAMA
from torchfleet_contract.trainer_config import load_config
from torchfleet_operator.status.progress import progress_from_metrics
from torchfleet_trainer.metrics import TrainMetrics
from torchfleet_trainer.train import StepOutcome, Trainer, build_runtime

pytestmark = pytest.mark.trainer

NOW = "2026-01-01T00:00:00Z"
# This gang's time blocked on saves, true from the start.
NO_TIME_BLOCKED_YET = {"checkpointSaveSeconds": 0.0, "updateTime": NOW, "source": "Metrics"}


def trainer(tmp_path: Path, steps: int) -> Trainer:
    config = load_config(
        overrides=[
            *TINY_LLAMA,
            f"training.steps={steps}",
            "training.logInterval=2",
            "training.evalInterval=0",
            f"checkpoint.dir={tmp_path / 'ckpt'}",
            "checkpoint.interval=2",
            "metrics.jsonLogs=false",
        ],
        env={},
    )
    return Trainer(config, build_runtime(config), TrainMetrics())


def scraped_at_first_step(run: Trainer, monkeypatch: pytest.MonkeyPatch) -> str:
    """The trainer's /metrics text as its first step starts, after it ran on."""
    texts: list[str] = []
    take_step = run._step

    def step(number: int) -> StepOutcome:
        if not texts:
            assert run.metrics is not None
            texts.append(generate_latest(run.metrics.registry).decode())
        return take_step(number)

    monkeypatch.setattr(run, "_step", step)
    assert run.run().status == "completed"
    return texts[0]


def test_a_resumed_trainer_shows_the_checkpoints_step_and_no_rates_until_it_steps(
    one_rank: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert trainer(tmp_path, steps=4).run().status == "completed"

    text = scraped_at_first_step(trainer(tmp_path, steps=8), monkeypatch)

    progress, checkpoint = progress_from_metrics(text, NOW)
    assert checkpoint == 4
    assert progress == {"step": 4, "totalSteps": 8, "percent": 50} | NO_TIME_BLOCKED_YET


def test_a_fresh_trainer_shows_step_zero_and_no_rates_until_it_steps(
    one_rank: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = scraped_at_first_step(trainer(tmp_path, steps=4), monkeypatch)

    progress, checkpoint = progress_from_metrics(text, NOW)
    assert checkpoint is None  # the gauge's 0 is no checkpoint yet, not a save of step 0
    assert progress == {"step": 0, "totalSteps": 4, "percent": 0} | NO_TIME_BLOCKED_YET
