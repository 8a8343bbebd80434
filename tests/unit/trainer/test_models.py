"""The model family: shapes, causality, GQA, meta init, pipeline carving, user models."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchfleet_contract.trainer_config import ConfigError, ModelConfig
from torchfleet_trainer.distributed.pipeline import carve_stage, layer_ranges, stage_ids
from torchfleet_trainer.models import build_model

TINY = {"layers": 4, "dim": 32, "heads": 4, "max_seq_len": 16}


def tiny(arch: str, **extra: object) -> nn.Module:
    torch.manual_seed(0)
    model = build_model(ModelConfig(architecture=arch, **{**TINY, **extra}), vocab_size=50)  # type: ignore[arg-type]
    model.init_weights()  # type: ignore[operator]
    return model.eval()


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_logits_shape_and_causality(arch: str) -> None:
    model = tiny(arch)
    tokens = torch.randint(0, 50, (2, 12))
    logits = model(tokens)
    assert logits.shape == (2, 12, 50)
    changed = tokens.clone()
    changed[:, 8] = (changed[:, 8] + 1) % 50
    with torch.no_grad():
        after = model(changed)
    # Positions before the change cannot see it; the changed one must react.
    torch.testing.assert_close(after[:, :8], logits[:, :8].detach())
    assert not torch.allclose(after[:, 8], logits[:, 8].detach())


def test_grouped_query_attention_shrinks_key_value_projections() -> None:
    full, grouped = tiny("llama"), tiny("llama", kv_heads=1)
    assert grouped.layers["0"].attention.wk.weight.shape == (8, 32)
    assert full.layers["0"].attention.wk.weight.shape == (32, 32)
    assert grouped(torch.randint(0, 50, (1, 5))).shape == (1, 5, 50)


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_meta_device_build_materialises_and_initialises(arch: str) -> None:
    with torch.device("meta"):
        model = build_model(ModelConfig(architecture=arch, **TINY), vocab_size=50)  # type: ignore[arg-type]
    assert all(p.is_meta for p in model.parameters())
    model.to_empty(device="cpu")
    model.init_weights()  # type: ignore[operator]
    out = model(torch.randint(0, 50, (1, 6)))
    assert torch.isfinite(out).all()
    # Depth-scaled residual init: wo's spread is below the other projections'.
    block = model.layers["0"]
    assert block.attention.wo.weight.std() < block.attention.wq.weight.std()


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_carved_stages_chained_equal_the_whole_model(arch: str) -> None:
    model = tiny(arch)
    ranges = layer_ranges(4, 3)
    assert ranges == [range(0, 2), range(2, 3), range(3, 4)]
    stages = [carve_stage(model, r, first=i == 0, last=i == 2) for i, r in enumerate(ranges)]
    assert stages[1].tok_embeddings is None and stages[1].output is None
    assert set(stages[2].state_dict()) >= {"layers.3.ffn_norm.weight", "output.weight"}
    tokens = torch.randint(0, 50, (2, 10))
    hidden = tokens
    with torch.no_grad():
        for stage in stages:
            hidden = stage(hidden)
        torch.testing.assert_close(hidden, model(tokens))


def test_interleaved_stage_assignment_is_loop_order() -> None:
    assert stage_ids(pp_rank=1, pp_degree=2, stages_per_rank=2) == [1, 3]


def make_user_model(config: ModelConfig) -> nn.Module:
    assert config.vocab_size is not None
    return nn.Sequential(nn.Embedding(config.vocab_size, 8), nn.Linear(8, config.vocab_size))


def not_a_model(config: ModelConfig) -> int:
    return 42


def test_user_model_by_import_path() -> None:
    path = f"{__name__}:make_user_model"
    model = build_model(ModelConfig(import_path=path), vocab_size=11)
    assert model(torch.zeros(1, 3, dtype=torch.long)).shape == (1, 3, 11)
    with pytest.raises(ConfigError, match=r"model\.importPath: cannot import"):
        build_model(ModelConfig(import_path=f"{__name__}:missing"), vocab_size=11)
    with pytest.raises(ConfigError, match=r"model\.importPath: .* not a torch\.nn\.Module"):
        build_model(ModelConfig(import_path=f"{__name__}:not_a_model"), vocab_size=11)
