"""FSDP2 (``fully_shard``, HSDP on a 2-D mesh) and DDP (composable ``replicate``)."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed._composable.replicate import replicate
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def apply_fsdp(
    model: nn.Module,
    dp_mesh: DeviceMesh,
    param_dtype: torch.dtype,
    reshard_after_forward: bool,
) -> None:
    """One FSDP unit per block plus the root, so gathers overlap block by block.

    Gradients are reduced in fp32 even when compute is bf16.
    """
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    layers = getattr(model, "layers", None)
    blocks = list(layers.values()) if isinstance(layers, nn.ModuleDict) else []
    for index, block in enumerate(blocks):
        # The last block's parameters are needed again at once by backward.
        reshard = reshard_after_forward and index < len(blocks) - 1
        fully_shard(block, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)


def apply_ddp(model: nn.Module, dp_mesh: DeviceMesh) -> None:
    replicate(model, device_mesh=dp_mesh, bucket_cap_mb=100)
