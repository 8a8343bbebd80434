"""FSDP2 (``fully_shard``, HSDP on a 2-D mesh) and DDP (composable ``replicate``)."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed._composable.replicate import replicate
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

BLOCK_CONTAINERS = (nn.ModuleDict, nn.ModuleList, nn.Sequential)


def find_blocks(model: nn.Module, path: str) -> nn.Module | None:
    """The container of repeated blocks at ``path`` (model.blocks), or None."""
    node: object = model
    for name in path.split("."):
        node = getattr(node, name, None)
    return node if isinstance(node, BLOCK_CONTAINERS) else None


def apply_fsdp(
    model: nn.Module,
    dp_mesh: DeviceMesh,
    param_dtype: torch.dtype,
    reshard_after_forward: bool,
    blocks_path: str = "layers",
) -> None:
    """One FSDP unit per block (those at ``blocks_path``) plus the root, so gathers
    overlap block by block.

    Gradients are reduced in fp32 even when compute is bf16.
    """
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    container = find_blocks(model, blocks_path)
    blocks = list(container.children()) if container is not None else []
    for index, block in enumerate(blocks):
        # The last block's parameters are needed again at once by backward.
        reshard = reshard_after_forward and index < len(blocks) - 1
        fully_shard(block, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)


def apply_ddp(model: nn.Module, dp_mesh: DeviceMesh) -> None:
    replicate(model, device_mesh=dp_mesh, bucket_cap_mb=100)
