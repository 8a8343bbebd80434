"""Giving a model built on the meta device its memory and values, on each rank's shards.

:func:`materialise` is ``to_empty()`` keeping tied parameters tied.
Everything that knows parameters may be DTensors lives here, so models/ stays
free of parallelism (as TorchTitan keeps it).

``to_empty()`` leaves every parameter and buffer uninitialised memory, so a
model materialised from meta must be initialised again, on each rank's shard.
What initialises it, in order of preference:

1. ``init_weights(self)``: the model owns its whole initialisation, parameters
   and non-persistent buffers (masks, RoPE tables) alike, as the built-in
   models and TorchTitan's do. It must work on any subset of the model (a
   pipeline stage has some layers removed). It runs under DTensor's implicit
   replication, so copying a whole tensor into a sharded parameter
   (``param.copy_(whole)``) keeps this rank's shard of it, and plain
   ``nn.init`` fills work on DTensors as they are.
2. Otherwise every submodule's ``reset_parameters()`` (what ``nn.Linear``,
   ``nn.Embedding``, the norms... run in their constructors; on whole-size
   stand-ins of sharded parameters, each rank keeping its shard), then the
   buffers: ``init_buffers(self)`` when the model has one, else a copy of the
   buffers of a buffers-only build of the model (its factory run again on the
   CPU with every parameter replaced by a meta tensor as it is registered, so
   no parameter memory is allocated or initialised).

A parameter owned by a module without ``reset_parameters()`` cannot be
initialised by (2) and is refused by name.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.experimental import implicit_replication
from torch.nn.modules.module import register_module_parameter_registration_hook

from torchfleet_contract.trainer_config import ConfigError, ModelConfig
from torchfleet_trainer.models import build_model
from torchfleet_trainer.models.common import plain_name


def has_init_weights(model: nn.Module) -> bool:
    return callable(getattr(model, "init_weights", None))


def needs_reference_buffers(model: nn.Module) -> bool:
    """True when only a buffers-only build can give this model's buffers their values."""
    if has_init_weights(model) or callable(getattr(model, "init_buffers", None)):
        return False
    return any(True for _ in model.buffers())


@contextmanager
def _parameters_on_meta() -> Iterator[None]:
    def to_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> nn.Parameter | None:
        if param is None or param.is_meta:
            return None
        return nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    # Module.register_parameter keeps a hook's returned parameter (torch's
    # annotation says the hook returns None).
    handle = register_module_parameter_registration_hook(to_meta)  # type: ignore[arg-type]
    try:
        yield
    finally:
        handle.remove()


def reference_buffers(config: ModelConfig, vocab_size: int) -> dict[str, torch.Tensor]:
    """Every buffer of the model, computed on the CPU; parameters are never allocated."""
    with _parameters_on_meta(), torch.device("cpu"):
        model = build_model(config, vocab_size)
    return {name: buffer for name, buffer in model.named_buffers()}


def materialise(module: nn.Module, device: torch.device) -> None:
    """``to_empty()`` that keeps tied parameters tied.

    ``to_empty()`` gives every module its own new tensor, so a parameter shared
    by two modules (``tieEmbeddings``: the output projection and the token
    embedding) would come back as two; the sharing seen before is restored.
    """
    ties = _tied_groups(module)
    module.to_empty(device=device)
    for names in ties:
        shared = module.get_parameter(names[0])
        for name in names[1:]:
            owner_name, _, attr = name.rpartition(".")
            owner = module.get_submodule(owner_name)
            if getattr(owner, attr) is not shared:
                setattr(owner, attr, shared)


def _tied_groups(module: nn.Module) -> list[list[str]]:
    """Names of each parameter that more than one module holds."""
    by_param: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        by_param.setdefault(id(param), []).append(name)
    return [names for names in by_param.values() if len(names) > 1]


@torch.no_grad()
def initialise(
    model: nn.Module, reference: dict[str, torch.Tensor], seed: int, pp_rank: int = 0
) -> None:
    """Initialises a materialised model (or this pipeline rank's stage of it) in place."""
    torch.manual_seed(seed)
    init = getattr(model, "init_weights", None)
    if callable(init):
        # A plain tensor meeting a DTensor counts as replicated: the model's
        # whole-matrix draws copied into its parameters land as this rank's shard.
        with implicit_replication():
            init()
        return
    # reset_parameters() draws from the one global stream in module order: offset
    # by pipeline rank, stages do not start as copies of each other (and stage 0
    # still gets its direct build's values).
    torch.manual_seed(seed + pp_rank)
    _reset_parameters(model)
    init_buffers = getattr(model, "init_buffers", None)
    if callable(init_buffers):
        init_buffers()
        return
    for name, buffer in model.named_buffers():
        plain = plain_name(name)
        if plain not in reference:
            raise ConfigError(
                f"model.importPath: buffer {plain!r} cannot be recreated after meta-device "
                "init; give the model init_buffers(self) or init_weights(self)"
            )
        buffer.copy_(reference[plain])


def _reset_parameters(model: nn.Module) -> None:
    covered: set[int] = set()
    for module in model.modules():
        if callable(getattr(module, "reset_parameters", None)):
            _reset_whole(module)
            covered.update(id(p) for p in module.parameters(recurse=False))
    missing = [plain_name(name) for name, p in model.named_parameters() if id(p) not in covered]
    if missing:
        raise ConfigError(
            f"model.importPath: parameters {missing[:5]} belong to modules without "
            "reset_parameters(), so meta-device init cannot initialise them; give the model "
            "init_weights(self)"
        )


def _reset_whole(module: nn.Module) -> None:
    """``module.reset_parameters()`` as if its parameters were not sharded.

    On DTensor (FSDP/TP) parameters each rank would draw its shard from the
    start of the same stream, repeating values across ranks. Instead the module
    resets whole-tensor stand-ins (every rank draws the same values, as the
    unsharded model would) and each rank keeps its shard of them.
    """
    sharded = dict(module.named_parameters(recurse=False))
    if not any(isinstance(p, DTensor) for p in sharded.values()):
        module.reset_parameters()  # type: ignore[operator]
        return
    # Swapped in the parameter dict directly, not by setattr (which would register
    # new parameters under FSDP's and TP's feet); the sharded ones go back untouched.
    module._parameters.update(
        {
            name: nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=p.device))
            for name, p in sharded.items()
        }
    )
    try:
        module.reset_parameters()  # type: ignore[operator]
        whole = dict(module.named_parameters(recurse=False))
    finally:
        module._parameters.update(sharded)
    for name, param in sharded.items():
        copy_my_shard(param, whole[name].detach())


def copy_my_shard(param: torch.Tensor, whole: torch.Tensor) -> None:
    """Copies into ``param`` its part of ``whole``, which every rank holds alike
    (so each cuts its own shard, without communication)."""
    if not isinstance(param, DTensor):
        param.copy_(whole)
        return
    mine = distribute_tensor(whole, param.device_mesh, param.placements, src_data_rank=None)
    param.to_local().copy_(mine.to_local())
