"""Tensor (and sequence) parallelism with ``parallelize_module``.

Megatron-style: q/k/v and the first MLP projections split by output columns
(heads), the attention output and second MLP projection by input rows, so each
block needs one reduction in forward and one in backward. With sequence
parallelism the residual stream between blocks stays sharded along the
sequence, and norms and dropout run on that shard.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from torchfleet_trainer.models.common import blocks_of


class ReplicateParallel(ParallelStyle):
    """Keeps a module whole on every TP rank, its parameters as replicated DTensors.

    Without sequence parallelism the norms are not split, but their parameters
    must still live on the TP mesh: FSDP then shards every parameter over the
    same 2-D mesh, which foreach optimizers and gradient clipping need.
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(
            module,
            device_mesh,
            input_fn=self._to_dtensor,
            output_fn=self._to_local,
        )

    @staticmethod
    def _to_dtensor(module: nn.Module, inputs: Any, mesh: DeviceMesh) -> Any:
        return tuple(
            DTensor.from_local(x, mesh, [Replicate()], run_check=False)
            if isinstance(x, torch.Tensor) and not isinstance(x, DTensor)
            else x
            for x in inputs
        )

    @staticmethod
    def _to_local(module: nn.Module, output: Any, mesh: DeviceMesh) -> Any:
        return output.to_local() if isinstance(output, DTensor) else output


def _norm_style(sequence_parallel: bool) -> ParallelStyle:
    return SequenceParallel() if sequence_parallel else ReplicateParallel()


def _block_plan(block: nn.Module, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    residual = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, ParallelStyle] = {
        # Rotary tables reach attention as a keyword argument and stay local.
        "attention": PrepareModuleInput(
            input_layouts=(residual,), desired_input_layouts=(Replicate(),)
        ),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=residual),
        "feed_forward": PrepareModuleInput(
            input_layouts=(residual,), desired_input_layouts=(Replicate(),)
        ),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=residual),
    }
    if hasattr(block.feed_forward, "w3"):
        plan["feed_forward.w3"] = ColwiseParallel()
    plan["attention_norm"] = _norm_style(sequence_parallel)
    plan["ffn_norm"] = _norm_style(sequence_parallel)
    return plan


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Shards a Decoder (or a pipeline stage of one) over ``tp_mesh`` in place."""
    residual = Shard(1) if sequence_parallel else Replicate()
    top: dict[str, ParallelStyle] = {}
    # Embeddings split by rows (vocabulary / positions); their partial sums
    # are reduced straight into the residual layout.
    for name in ("tok_embeddings", "pos_embeddings"):
        if getattr(model, name, None) is not None:
            top[name] = RowwiseParallel(input_layouts=Replicate(), output_layouts=residual)
    if getattr(model, "norm", None) is not None:
        top["norm"] = _norm_style(sequence_parallel)
    if getattr(model, "output", None) is not None:
        # Logits stay sharded by vocabulary: the loss runs under loss_parallel
        # instead of gathering (batch, seq, vocab) onto every rank.
        top["output"] = ColwiseParallel(
            input_layouts=residual, output_layouts=Shard(-1), use_local_output=False
        )
    parallelize_module(model, tp_mesh, top)
    blocks = blocks_of(model)
    assert blocks is not None, "tensor parallelism needs a Decoder-style model"
    for block in blocks.values():
        parallelize_module(block, tp_mesh, _block_plan(block, sequence_parallel))
