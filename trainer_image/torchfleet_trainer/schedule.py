"""Learning rate as a pure function of the step (so resuming needs only the step)."""

from __future__ import annotations

import math

from torchfleet_contract.trainer_config import TrainConfig


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warm-up over warmupSteps, then cosine/linear decay to minLrRatio*lr.

    ``step`` counts from 1, so the first step already has a non-zero rate.
    """
    peak = config.optimizer.lr
    sched = config.schedule
    warmup = min(sched.warmup_steps, config.training.steps)
    if step <= warmup:
        return peak * step / warmup
    if sched.kind == "constant":
        return peak
    end = sched.decay_steps or config.training.steps
    progress = min(max((step - warmup) / max(end - warmup, 1), 0.0), 1.0)
    cosine = sched.kind == "cosine"
    shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if cosine else 1.0 - progress
    return peak * (sched.min_lr_ratio + (1.0 - sched.min_lr_ratio) * shape)
