"""training.cudaGraphs: off by default, and refused with a message that says why
wherever it cannot work, gradient accumulation included (the GPU tier checks that it
trains alike)."""

from __future__ import annotations

import pytest

from tests.trainer.user_models import TINY_LLAMA
from torchfleet_contract.trainer_config import ConfigError, TrainConfig, load_config
from torchfleet_trainer.train import Trainer, build_runtime


def test_off_by_default() -> None:
    assert not TrainConfig().training.cuda_graphs


def test_needs_compile() -> None:
    with pytest.raises(ConfigError, match=r"training.cudaGraphs: needs training.compile=true"):
        load_config(overrides=["training.cudaGraphs=true"], env={})


@pytest.mark.parametrize(
    "accumulation",
    [["training.gradAccumSteps=2"], ["training.globalBatchSize=8", "training.microBatchSize=4"]],
    ids=["grad-accum-steps", "smaller-micro-batch"],
)
def test_refused_with_gradient_accumulation(accumulation: list[str]) -> None:
    """The trainer frees .grad every step; a second micro-step's backward inside a
    captured graph would allocate it there (pytorch issue 169545)."""
    overrides = ["training.compile=true", "training.cudaGraphs=true", *accumulation]
    with pytest.raises(ConfigError, match=r"training.cudaGraphs: not with gradient accumulation"):
        load_config(overrides=overrides, env={})


def test_a_micro_batch_of_the_whole_batch_is_no_accumulation() -> None:
    overrides = ["training.compile=true", "training.cudaGraphs=true"]
    overrides += ["training.globalBatchSize=8", "training.microBatchSize=8"]
    assert load_config(overrides=overrides, env={}).training.cuda_graphs


def test_refused_for_elastic_jobs_before_any_process_starts() -> None:
    config = load_config(overrides=["training.compile=true", "training.cudaGraphs=true"], env={})
    with pytest.raises(ConfigError, match=r"training.cudaGraphs: not for elastic jobs"):
        config.check_elastic(range(1, 3), processes_per_node=1)


def test_refused_on_a_cpu() -> None:
    overrides = [*TINY_LLAMA, "training.compile=true", "training.cudaGraphs=true"]
    config = load_config(overrides=[*overrides, "training.device=cpu"], env={})
    with pytest.raises(ConfigError, match=r"training.cudaGraphs: needs a CUDA device; .* cpu"):
        Trainer(config, build_runtime(config, distributed=False))
