"""Pipeline parallelism with ``torch.distributed.pipelining``.

The model is cut by layer into ``pp x stages_per_rank`` stages; each stage is
a copy of the model with the other layers (and, off the ends, the embeddings
or norm/output) removed, so parameter names match the unsplit model. Rank ``r``
holds stages ``r, r + pp, ...`` (the loop order the interleaved schedule
expects).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.distributed.pipelining.schedules import _PipelineSchedule

from torchfleet_trainer.models.common import blocks_of

SCHEDULES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved_1f1b": ScheduleInterleaved1F1B,
}


def layer_ranges(num_layers: int, num_stages: int) -> list[range]:
    """Contiguous, as-even-as-possible layer ranges; earlier stages get the extras."""
    base, extra = divmod(num_layers, num_stages)
    bounds = [0]
    for stage in range(num_stages):
        bounds.append(bounds[-1] + base + (1 if stage < extra else 0))
    return [range(a, b) for a, b in itertools.pairwise(bounds)]


def stage_ids(pp_rank: int, pp_degree: int, stages_per_rank: int) -> list[int]:
    return [pp_rank + k * pp_degree for k in range(stages_per_rank)]


def carve_stage(model: nn.Module, layers: range, first: bool, last: bool) -> nn.Module:
    """A copy of ``model`` keeping only ``layers`` and the ends this stage owns."""
    stage = copy.deepcopy(model)
    blocks = blocks_of(stage)
    assert blocks is not None, "pipeline parallelism needs a Decoder-style model"
    for name in list(blocks.keys()):
        if int(name) not in layers:
            del blocks[name]
    if not first:
        for name, child in list(stage.named_children()):
            if isinstance(child, nn.Embedding):
                setattr(stage, name, None)
    if not last:
        stage.norm = None  # type: ignore[assignment]
        stage.output = None  # type: ignore[assignment]
    return stage


def split_model(
    model: nn.Module, pp_rank: int, pp_degree: int, stages_per_rank: int
) -> list[tuple[int, nn.Module]]:
    """(stage index, stage module) for each stage this pipeline rank holds."""
    num_stages = pp_degree * stages_per_rank
    blocks = blocks_of(model)
    assert blocks is not None, "pipeline parallelism needs a Decoder-style model"
    ranges = layer_ranges(len(blocks), num_stages)
    return [
        (i, carve_stage(model, ranges[i], first=i == 0, last=i == num_stages - 1))
        for i in stage_ids(pp_rank, pp_degree, stages_per_rank)
    ]


def build_schedule(
    stages: list[tuple[int, nn.Module]],
    num_stages: int,
    pp_mesh: DeviceMesh,
    device: torch.device,
    schedule: str,
    n_microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> _PipelineSchedule:
    """Wraps stage modules in PipelineStages and returns the schedule that runs them.

    ``loss_fn`` must already divide by the number of microbatches: the
    schedule's own gradient scaling is off because it would also rescale
    gradients accumulated by earlier gradient-accumulation micro-steps.
    """
    group = pp_mesh.get_group()
    pipeline_stages = [
        PipelineStage(module, index, num_stages, device, group=group) for index, module in stages
    ]
    cls = SCHEDULES[schedule]
    if schedule == "interleaved_1f1b":
        return cls(
            pipeline_stages, n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=False
        )
    (only,) = pipeline_stages
    return cls(only, n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=False)
