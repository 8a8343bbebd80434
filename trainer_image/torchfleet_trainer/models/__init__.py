"""Model registry: built-in families by name, or a user factory by import path."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from torch import nn

from torchfleet_contract.trainer_config import ConfigError, ModelConfig
from torchfleet_trainer.models.common import Decoder
from torchfleet_trainer.models.gpt import GPT
from torchfleet_trainer.models.llama import Llama

ARCHITECTURES: dict[str, Callable[[ModelConfig, int], Decoder]] = {"gpt": GPT, "llama": Llama}

__all__ = ["ARCHITECTURES", "GPT", "Decoder", "Llama", "build_model"]


def build_model(config: ModelConfig, vocab_size: int) -> nn.Module:
    """Builds the model on the current default device (use torch.device('meta') to defer)."""
    if config.import_path is None:
        return ARCHITECTURES[config.architecture](config, vocab_size)
    module_name, _, attr = config.import_path.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ConfigError(
            f"model.importPath: cannot import {config.import_path!r}: {err}"
        ) from None
    model = factory(config.model_copy(update={"vocab_size": vocab_size}))
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"model.importPath: {config.import_path!r} returned {type(model).__name__}, "
            "not a torch.nn.Module"
        )
    return model
