"""The loop never waits on the device between log steps.

Every ``.item()``, ``.tolist()``, ``float()``, ``int()`` or ``bool()`` of a
tensor makes the host wait for the device to finish all queued work. The
trainer runs in this process with those instrumented, each call attributed to
the step last started; only the steps whose values the host needs (here the
log steps and the last) may have any, and one each: their batch of losses and
gradient norms comes over in one transfer. TensorBoard curves are on, so they
are proved to add no sync either.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainer.user_models import TINY_LLAMA
from torchfleet_trainer.config import load_config
from torchfleet_trainer.metrics import TrainMetrics
from torchfleet_trainer.train import StepOutcome, Trainer, build_runtime

pytestmark = pytest.mark.trainer

CONFIG = [
    *TINY_LLAMA,
    "training.gradAccumSteps=2",
    "training.steps=12",
    "training.logInterval=4",
    "training.evalInterval=0",
    "optimizer.gradClip=1.0",
    "checkpoint.enabled=false",
    "metrics.jsonLogs=false",
]
SYNCING = ("item", "tolist", "__float__", "__int__", "__bool__")


def test_only_log_steps_bring_values_to_the_host(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = load_config(overrides=[*CONFIG, f"tensorboard.dir={tmp_path}"], env={})
    trainer = Trainer(config, build_runtime(config, distributed=False), TrainMetrics())
    current: dict[str, int] = {"step": 0}
    syncs: list[int] = []

    def counting(original: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            syncs.append(current["step"])
            return original(self, *args, **kwargs)

        return call

    for name in SYNCING:
        monkeypatch.setattr(torch.Tensor, name, counting(getattr(torch.Tensor, name)))
    run_step = trainer._step

    def step(number: int) -> StepOutcome:
        current["step"] = number
        return run_step(number)

    monkeypatch.setattr(trainer, "_step", step)
    result = trainer.run()

    assert result.status == "completed" and result.last_step == 12
    assert Counter(syncs) == {4: 1, 8: 1, 12: 1}, Counter(syncs)
    # Every step is still reported, with its own loss, once settled.
    assert [r["step"] for r in result.history] == list(range(1, 13))
    assert len({r["loss"] for r in result.history}) == 12
    assert trainer.metrics is not None
    assert trainer.metrics.registry.get_sample_value("torchfleet_train_step") == 12
    assert list(tmp_path.glob("events.out.tfevents.*")), "TensorBoard wrote no event file"
