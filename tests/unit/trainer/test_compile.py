"""Built-in models compile with fullgraph=True: dynamo traces each block, and the
whole model with its loss, plain or activation-checkpointed, as one graph.
Traced with the eager backend (inductor's C++ build takes minutes on CPU); a
graph break fails either way."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from torchfleet_contract.trainer_config import ModelConfig, TrainConfig
from torchfleet_trainer.distributed.parallelize import (
    compiles_fullgraph,
    cross_entropy,
    wrap_blocks,
)
from torchfleet_trainer.models import build_model
from torchfleet_trainer.models.common import Decoder
from torchfleet_trainer.train import COMPILE_CACHE_ENV, persist_compile_cache


def tiny(arch: str) -> Decoder:
    shape = {"kv_heads": 1} if arch == "llama" else {"bias": True}
    config = ModelConfig(architecture=arch, layers=1, dim=16, heads=2, max_seq_len=8, **shape)
    model = build_model(config, 32)
    assert isinstance(model, Decoder)
    return model


@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_builtin_blocks_trace_as_one_graph(arch: str, checkpointed: bool) -> None:
    torch._dynamo.reset()
    model = tiny(arch)
    block = model.layers["0"]
    wrapped = checkpoint_wrapper(block, preserve_rng_state=True) if checkpointed else block
    compiled = torch.compile(wrapped, backend="eager", fullgraph=True)
    x = torch.randn(2, 8, 16, requires_grad=True)
    extra = model.block_kwargs()
    expected = block(x, **extra)
    (grad,) = torch.autograd.grad(expected.sum(), x)
    got = compiled(x, **extra)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), x)[0], grad)


def test_only_builtin_models_compile_fullgraph() -> None:
    assert compiles_fullgraph(TrainConfig())
    user = TrainConfig.model_validate({"model": {"importPath": "tests.trainer.user_models:make"}})
    assert not compiles_fullgraph(user)


@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_builtin_models_trace_whole_with_the_loss_as_one_graph(
    arch: str, checkpointed: bool
) -> None:
    """What whole-model compile (one process) traces: forward and loss, blocks
    checkpointed or not, with no graph break."""
    torch._dynamo.reset()
    model = tiny(arch)
    overrides = {"activation_checkpointing": "full" if checkpointed else "none"}
    config = TrainConfig().model_copy(
        update={"training": TrainConfig().training.model_copy(update=overrides)}
    )
    wrap_blocks(model, config, compile_blocks=False)

    def loss(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return cross_entropy(model(inputs), targets)

    inputs, targets = torch.randint(0, 32, (2, 8)), torch.randint(0, 32, (2, 8))
    expected = loss(inputs, targets)
    grads = torch.autograd.grad(expected, list(model.parameters()))
    compiled = torch.compile(loss, backend="eager", fullgraph=True)
    got = compiled(inputs, targets)
    torch.testing.assert_close(got, expected)
    for a, b in zip(torch.autograd.grad(got, list(model.parameters())), grads, strict=True):
        torch.testing.assert_close(a, b)


def test_compile_cache_lives_on_the_checkpoint_volume(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(COMPILE_CACHE_ENV, raising=False)
    config = TrainConfig.model_validate({"training": {"compile": True}})
    assert persist_compile_cache(config, str(tmp_path)) == tmp_path / "compile-cache"
    assert os.environ[COMPILE_CACHE_ENV] == str(tmp_path / "compile-cache")
    # A directory the user chose wins; no compile or no volume, nothing changes.
    monkeypatch.setenv(COMPILE_CACHE_ENV, "/elsewhere")
    assert persist_compile_cache(config, str(tmp_path)) == Path("/elsewhere")
    monkeypatch.delenv(COMPILE_CACHE_ENV)
    assert persist_compile_cache(TrainConfig(), str(tmp_path)) is None
    assert persist_compile_cache(config, None) is None
    assert COMPILE_CACHE_ENV not in os.environ
