"""A user model (``model.importPath``) whose loss is NaN on chosen training steps.

The trainer's non-finite policy is under test, not the cause of a NaN, so the
NaN is injected where a real one appears: in the forward pass. ``NAN_STEPS``
lists the training forwards (1-based; one per step without gradient
accumulation) whose logits are multiplied by NaN, which makes the loss and
every gradient NaN.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from torchfleet_contract.trainer_config import ModelConfig

NAN_STEPS = "TEST_NAN_STEPS"


class NanOnSteps(nn.Module):
    def __init__(self, vocab_size: int, dim: int, nan_steps: set[int]) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, dim)
        self.output = nn.Linear(dim, vocab_size)
        self.nan_steps = nan_steps
        self.forwards = 0

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.output(self.embedding(tokens))
        if not self.training:
            return logits
        self.forwards += 1
        return logits * float("nan") if self.forwards in self.nan_steps else logits


def build(config: ModelConfig) -> nn.Module:
    assert config.vocab_size is not None
    steps = {int(s) for s in os.environ.get(NAN_STEPS, "").split(",") if s}
    return NanOnSteps(config.vocab_size, config.dim, steps)
