"""Activation checkpointing and compile reach a user model's blocks, or say why not."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from tests.trainer.user_models import MaskedMixer
from torchfleet_contract.trainer_config import ModelConfig, TrainConfig
from torchfleet_trainer.distributed.parallelize import wrap_blocks


class StackedUserModel(nn.Module):
    """A user model whose blocks live in a ModuleList under another name."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Module()
        self.trunk.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.trunk.blocks:
            x = block(x)
        return x


def config(**sections: dict[str, object]) -> TrainConfig:
    return TrainConfig.model_validate(sections)


def test_a_user_model_without_the_container_warns_instead_of_silently_skipping() -> None:
    model = MaskedMixer(ModelConfig(dim=8, heads=2, max_seq_len=8, vocab_size=16))
    with pytest.warns(UserWarning, match="model.blocks: this model has no 'layers' container"):
        wrap_blocks(model, config(training={"activationCheckpointing": "full"}))
    with pytest.warns(UserWarning, match="training.compile do nothing"):
        wrap_blocks(model, config(training={"compile": True}))


def test_named_blocks_of_a_user_model_are_checkpointed_and_still_compute_the_same() -> None:
    model = StackedUserModel()
    x = torch.randn(2, 8)
    expected = model(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning when the blocks are found
        wrap_blocks(
            model,
            config(model={"blocks": "trunk.blocks"}, training={"activationCheckpointing": "full"}),
        )
    assert all(isinstance(block, CheckpointWrapper) for block in model.trunk.blocks)
    torch.testing.assert_close(model(x), expected)


def test_nothing_requested_leaves_the_model_alone_and_quiet() -> None:
    model = StackedUserModel()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wrap_blocks(model, config())
    assert not any(isinstance(block, CheckpointWrapper) for block in model.trunk.blocks)
