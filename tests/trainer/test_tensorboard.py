"""TensorBoard curves across a resume: one run directory, no step twice.

A first run logs every step to 8 but checkpoints only step 5 (as a run that
crashed after step 8 would leave things); the second resumes from 5 and logs
6..10 again into the same directory. The event files on disk then hold steps
6..8 twice; TensorBoard's own reader must show each step once, with the
resumed run's values, because the writer purges from the resumed step + 1.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from tests.trainer.user_models import TINY_LLAMA
from torchfleet_contract.trainer_config import load_config
from torchfleet_trainer import tensorboard as tb
from torchfleet_trainer.train import RunResult, run_worker

pytestmark = pytest.mark.trainer

COMMON = [
    *TINY_LLAMA,
    "training.logInterval=1",
    "training.evalInterval=5",
    "training.evalBatches=1",
    "schedule.warmupSteps=1",
    "checkpoint.interval=5",
    "checkpoint.saveFinal=false",
    "checkpoint.asyncSave=false",
    "metrics.enabled=false",
    "metrics.jsonLogs=false",
    # MFU needs a peak to compare with; CPUs have none of their own.
    "metrics.peakTflops=1",
]


def train(checkpoint_dir: Path, steps: int) -> RunResult:
    config = load_config(
        overrides=[*COMMON, f"training.steps={steps}", f"checkpoint.dir={checkpoint_dir}"], env={}
    )
    return run_worker(config)


def raw_loss_steps(directory: Path) -> list[int]:
    """Every loss point in every event file, purges not applied."""
    steps = []
    for path in sorted(directory.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            if any(value.tag == tb.LOSS for value in event.summary.value):
                steps.append(event.step)
    return steps


def test_resumed_run_appends_to_the_same_curves_without_duplicated_steps(tmp_path: Path) -> None:
    checkpoint_dir = tmp_path / "ckpt"
    first = train(checkpoint_dir, steps=8)
    assert first.status == "completed" and first.last_step == 8
    resumed = train(checkpoint_dir, steps=10)
    assert (resumed.start_step, resumed.last_step) == (5, 10)

    directory = checkpoint_dir / tb.SUBDIR
    assert len(list(directory.glob("events.out.tfevents.*"))) == 2, "one file per run"
    # Without the purge steps 6..8 would show twice: both runs wrote them.
    assert Counter(raw_loss_steps(directory)) == Counter([*range(1, 9), *range(6, 11)])

    events = EventAccumulator(str(directory))
    events.Reload()
    loss = events.Scalars(tb.LOSS)
    assert [point.step for point in loss] == list(range(1, 11))
    # Steps after the checkpoint carry the resumed run's values.
    resumed_losses = {int(r["step"]): r["loss"] for r in resumed.history}
    for point in loss[5:]:
        assert point.value == pytest.approx(resumed_losses[point.step], rel=1e-6)

    tags = events.Tags()
    for tag in (tb.LEARNING_RATE, tb.GRAD_NORM, tb.TOKENS_PER_SECOND, tb.MFU, tb.STEP_SECONDS):
        assert [p.step for p in events.Scalars(tag)] == list(range(1, 11)), tag
    assert [p.step for p in events.Scalars(tb.EVAL_LOSS)] == [5, 10]
    # Only step 5 was saved: by the first run (the second's 10 is its last, not saved).
    assert [p.step for p in events.Scalars(tb.CHECKPOINT_SAVE_SECONDS)] == [5]
    assert tb.PEAK_GPU_MEMORY not in tags["scalars"], "CPU run: no GPU memory curve"
    # SummaryWriter.add_text files the text under this suffix.
    (config_text,) = events.Tensors(f"{tb.CONFIG_TEXT}/text_summary")
    assert config_text.step == 0
    text = config_text.tensor_proto.string_val[0].decode()
    assert "world size 1 = pp 1 x dp_replicate 1 x dp_shard 1 x tp 1" in text
    assert '"architecture": "llama"' in text
