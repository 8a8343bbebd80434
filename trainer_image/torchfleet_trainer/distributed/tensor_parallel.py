"""Tensor (and sequence) parallelism with ``parallelize_module``.

Megatron-style: q/k/v and the first MLP projections split by output columns
(heads), the attention output and second MLP projection by input rows, so each
block needs one reduction in forward and one in backward. With sequence
parallelism the residual stream between blocks stays sharded along the
sequence, and norms and dropout run on that shard.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from torchfleet_trainer.models.common import blocks_of


def _block_plan(block: nn.Module, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    residual = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, ParallelStyle] = {
        "attention": PrepareModuleInput(
            input_layouts=(residual, None), desired_input_layouts=(Replicate(), None)
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
    if sequence_parallel:
        plan["attention_norm"] = SequenceParallel()
        plan["ffn_norm"] = SequenceParallel()
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
    if getattr(model, "norm", None) is not None and sequence_parallel:
        top["norm"] = SequenceParallel()
    if getattr(model, "output", None) is not None:
        top["output"] = ColwiseParallel(
            input_layouts=residual, output_layouts=Replicate(), use_local_output=True
        )
    parallelize_module(model, tp_mesh, top)
    blocks = blocks_of(model)
    assert blocks is not None, "tensor parallelism needs a Decoder-style model"
    for block in blocks.values():
        parallelize_module(block, tp_mesh, _block_plan(block, sequence_parallel))
