"""Meta-device init (the GPU path, forced on CPU) gives the values a direct build does.

Built-in models initialise themselves; a user model without ``init_weights``
gets its submodules' ``reset_parameters()`` and its buffers from a
buffers-only build. Either way the materialised model must equal the same
model built directly with the same seed, buffers included.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.trainer.user_models import SMALL, MaskedMixer
from torchfleet_contract.trainer_config import ConfigError, ModelConfig, TrainConfig, load_config
from torchfleet_trainer.distributed.materialize import initialise, materialise
from torchfleet_trainer.distributed.pipeline import carve_stage, layer_ranges
from torchfleet_trainer.models import build_model
from torchfleet_trainer.train import Trainer, build_runtime, uses_meta_init

SEED = 7


class WithBareParameter(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        assert config.vocab_size is not None
        self.output = nn.Linear(config.dim, config.vocab_size)
        self.scale = nn.Parameter(torch.ones(config.dim))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.output(torch.ones(*tokens.shape, self.scale.shape[0]) * self.scale)


def config(*extra: str) -> TrainConfig:
    return load_config(
        overrides=[
            *SMALL,
            f"training.seed={SEED}",
            "checkpoint.enabled=false",
            "metrics.enabled=false",
            *extra,
        ],
        env={},
    )


def trainer_model(cfg: TrainConfig) -> nn.Module:
    (model,) = Trainer(cfg, build_runtime(cfg, distributed=False)).model.parts
    return model


def assert_same_tensors(got: nn.Module, expected: nn.Module) -> None:
    got_tensors = dict(got.named_parameters()) | dict(got.named_buffers())
    expected_tensors = dict(expected.named_parameters()) | dict(expected.named_buffers())
    assert got_tensors.keys() == expected_tensors.keys()
    for name, tensor in got_tensors.items():
        assert not tensor.is_meta, name
        torch.testing.assert_close(tensor, expected_tensors[name], rtol=0, atol=0, msg=name)


def test_meta_init_is_forced_on_cpu_only_when_asked() -> None:
    cpu = torch.device("cpu")
    assert not uses_meta_init(config(), cpu)
    assert uses_meta_init(config("training.metaDeviceInit=always"), cpu)
    assert uses_meta_init(config(), torch.device("cuda", 0))
    assert not uses_meta_init(config("training.metaDeviceInit=never"), torch.device("cuda", 0))


def test_user_model_without_init_hook_equals_its_direct_build() -> None:
    path = f"model.importPath={MaskedMixer.__module__}:MaskedMixer"
    cfg = config(path, "training.metaDeviceInit=always")
    torch.manual_seed(SEED)
    direct = MaskedMixer(cfg.model.model_copy(update={"vocab_size": 32}))
    materialised = trainer_model(cfg)
    assert_same_tensors(materialised, direct)
    tokens = torch.randint(0, 32, (2, 8))
    torch.testing.assert_close(materialised(tokens), direct(tokens), rtol=0, atol=0)


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_built_in_model_meta_init_equals_direct_build(arch: str) -> None:
    direct = trainer_model(config(f"model.architecture={arch}"))
    materialised = trainer_model(
        config(f"model.architecture={arch}", "training.metaDeviceInit=always")
    )
    assert_same_tensors(materialised, direct)


def test_parameter_without_reset_parameters_is_refused_by_name() -> None:
    cfg = config(f"model.importPath={__name__}:WithBareParameter", "training.metaDeviceInit=always")
    with pytest.raises(ConfigError, match=r"model\.importPath: parameters \['scale'\]"):
        trainer_model(cfg)
    # Built directly, the constructor's own values stand.
    direct = build_model(cfg.model, 32)
    assert torch.equal(direct.scale, torch.ones(16))  # type: ignore[arg-type]


def test_tied_embeddings_stay_one_parameter_after_meta_init() -> None:
    tied = ["model.architecture=gpt", "model.tieEmbeddings=true"]
    direct = trainer_model(config(*tied))
    materialised = trainer_model(config(*tied, "training.metaDeviceInit=always"))
    assert materialised.output.weight is materialised.tok_embeddings.weight
    assert_same_tensors(materialised, direct)


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_meta_initialised_pipeline_stages_equal_the_whole_models_layers(arch: str) -> None:
    model_config = ModelConfig(architecture=arch, layers=4, dim=16, heads=2, max_seq_len=8)  # type: ignore[arg-type]
    torch.manual_seed(SEED)
    whole = build_model(model_config, 32)
    initialise(whole, {}, SEED)
    with torch.device("meta"):
        meta_model = build_model(model_config, 32)
    for rank, layers in enumerate(layer_ranges(4, 4)):
        stage = carve_stage(meta_model, layers, first=rank == 0, last=rank == 3)
        materialise(stage, torch.device("cpu"))
        initialise(stage, {}, SEED, pp_rank=rank)
        expected = dict(whole.named_parameters()) | dict(whole.named_buffers())
        for name, tensor in [*stage.named_parameters(), *stage.named_buffers()]:
            torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0, msg=name)
