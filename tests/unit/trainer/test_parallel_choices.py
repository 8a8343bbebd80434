"""Choices parallelize makes from the config and the degrees, before any process group."""

from __future__ import annotations

import pytest

from torchfleet_contract.trainer_config import ResolvedDegrees, TrainConfig
from torchfleet_trainer.distributed.parallelize import reshards_after_forward


def degrees(pp: int = 1, dp_shard: int = 2) -> ResolvedDegrees:
    return ResolvedDegrees(dp_replicate=1, dp_shard=dp_shard, tp=1, pp=pp)


@pytest.mark.parametrize("configured", [True, False])
def test_fsdp_reshards_after_forward_as_configured_without_a_pipeline(configured: bool) -> None:
    config = TrainConfig.model_validate({"parallel": {"reshardAfterForward": configured}})
    assert reshards_after_forward(config, degrees()) is configured


def test_fsdp_under_a_pipeline_keeps_parameters_gathered_across_microbatches() -> None:
    config = TrainConfig.model_validate({"parallel": {"reshardAfterForward": True}})
    assert reshards_after_forward(config, degrees(pp=2)) is False
