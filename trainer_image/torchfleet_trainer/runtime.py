"""Where one training process runs: its device, precision, mesh and place in
the gang, decided once at start-up (train.py's setup) and read by the loop and
by the parts it calls (preflight). Its own module, below both, so that neither
imports the other for it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from torchfleet_trainer.distributed.parallel_dims import ParallelDims


@dataclass
class Runtime:
    """Where this process runs: device, precision and (unless single) its mesh."""

    device: torch.device
    dtype: torch.dtype
    dims: ParallelDims | None
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    # Micro-steps per optimizer step at this world size (the global batch is fixed).
    accum_steps: int = 1
    # This rank's place in the data-parallel and pipeline dimensions, read once: a
    # mesh answers through several Python calls on every query.
    dp_rank: int = field(init=False)
    pp_rank: int = field(init=False)

    def __post_init__(self) -> None:
        self.dp_rank = self.dims.dp_rank if self.dims else 0
        self.pp_rank = self.dims.rank_in("pp") if self.dims else 0

    @property
    def is_logger(self) -> bool:
        return self.rank == 0
