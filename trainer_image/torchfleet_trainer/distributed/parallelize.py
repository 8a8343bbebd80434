"""Turns a plain model into this rank's parallel model parts, in a fixed order.

Order: pipeline split -> tensor parallel -> activation checkpointing ->
torch.compile (per block; for one process without FSDP, the whole forward and
loss as one graph) -> FSDP2 or DDP. TP must see plain ``nn.Linear`` modules,
checkpointing and compile wrap the already-sharded blocks, and FSDP goes last
so it shards the final parameters (DTensors from TP included).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed._composable.replicate import DDP
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from torchfleet_contract.trainer_config import ConfigError, ResolvedDegrees, TrainConfig
from torchfleet_trainer.distributed.data_parallel import apply_ddp, apply_fsdp, find_blocks
from torchfleet_trainer.distributed.parallel_dims import ParallelDims
from torchfleet_trainer.distributed.tensor_parallel import apply_tensor_parallel

if TYPE_CHECKING:
    # Imported when a pipeline is built: torch.distributed.pipelining pulls in
    # torch._dynamo, seconds of start-up a run without pipeline or compile skips.
    from torch.distributed.pipelining.schedules import _PipelineSchedule


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token loss; vocabulary-sharded logits (a DTensor, from TP) need
    ``loss_parallel`` around this and its backward."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def local(loss: torch.Tensor) -> torch.Tensor:
    """A loss from loss_parallel is a replicated DTensor: every rank's copy is whole."""
    return loss.to_local() if isinstance(loss, DTensor) else loss


@dataclass
class ParallelModel:
    """This rank's share of the model and how to run a forward/backward on it."""

    parts: list[nn.Module]
    schedule: _PipelineSchedule | None
    has_first_stage: bool
    has_last_stage: bool
    # Whether FSDP's MixedPrecisionPolicy already runs the forward in the compute
    # dtype (then no autocast is needed around it).
    fsdp_mixed_precision: bool = False
    # The dtype autocast runs the forward and loss in; None runs them as the
    # parameters are (fp32, or cast by FSDP's policy).
    autocast_dtype: torch.dtype | None = None
    device_type: str = "cpu"
    # Whether the logits come sharded by vocabulary (tensor parallelism).
    vocab_sharded: bool = False
    # Set before each step: the factor the pipeline's per-microbatch loss is scaled by.
    loss_scale: float = 1.0
    # The forward and loss as one compiled graph (whole-model compile), else None.
    compiled_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    # Whether that graph replays as CUDA graphs (training.cudaGraphs).
    cuda_graphs: bool = False

    def parameters(self) -> list[nn.Parameter]:
        return [p for part in self.parts for p in part.parameters()]

    def train(self, mode: bool = True) -> None:
        for part in self.parts:
            part.train(mode)

    def forward_backward(
        self, inputs: torch.Tensor, targets: torch.Tensor, scale: float, sync_grads: bool = True
    ) -> torch.Tensor:
        """Accumulates gradients of ``scale * mean loss``; returns the unscaled loss
        (zero on pipeline ranks without the last stage).

        ``sync_grads=False`` (all but the last gradient-accumulation micro-step)
        lets FSDP keep unsharded gradients locally instead of reduce-scattering,
        and DDP skip its all-reduce, every micro-step.
        """
        if self.schedule is None:
            for part in self.parts:
                if isinstance(part, FSDPModule | DDP):
                    part.set_requires_gradient_sync(sync_grads)
            with self.loss_context():
                loss = self.loss(inputs, targets)
                (loss * scale).backward()
            return local(loss.detach())
        self.loss_scale = scale
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.has_first_stage else ()
        # A pipeline schedule runs backward inside its step, so autocast covers it
        # there; backward ops keep their forward ops' dtypes either way.
        with self.loss_context(), self.autocast():
            self.schedule.step(*args, target=targets, losses=losses)
        return self._mean_microbatch_loss(losses, scale, inputs.device)

    @torch.no_grad()
    def eval_loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.schedule is None:
            with self.loss_context():
                return local(self.loss(inputs, targets))
        self.loss_scale = 1.0
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.has_first_stage else ()
        with self.loss_context(), self.autocast():
            self.schedule.eval(*args, target=targets, losses=losses)
        return self._mean_microbatch_loss(losses, 1.0, inputs.device)

    def loss_context(self) -> contextlib.AbstractContextManager[Any]:
        """Cross-entropy (and its backward) on vocabulary-sharded logits: each TP
        rank reduces its shard, never materialising the full logits."""
        return loss_parallel() if self.vocab_sharded else contextlib.nullcontext()

    def loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Forward and loss of an unpipelined model, compiled as one graph when
        the layout allows (``compile_whole_model``)."""
        if self.compiled_loss is not None:
            if self.cuda_graphs:
                # Each call is a new iteration: the previous outputs may be reused.
                torch.compiler.cudagraph_mark_step_begin()
            return self.compiled_loss(inputs, targets)
        return self.eager_loss(inputs, targets)

    def eager_loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # Backward runs outside autocast, as PyTorch recommends: its ops keep the
        # dtypes their forward ops chose.
        with self.autocast():
            return cross_entropy(self.parts[0](inputs), targets)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)

    def _mean_microbatch_loss(
        self, losses: list[torch.Tensor], scale: float, device: torch.device
    ) -> torch.Tensor:
        if not self.has_last_stage:
            return torch.zeros((), device=device)
        # Each microbatch loss was scaled by scale/n for backward; undo it.
        return torch.stack([local(loss.detach()) for loss in losses]).sum() / scale

    def pipeline_loss(
        self, n_microbatches: int
    ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return cross_entropy(logits, targets) * (self.loss_scale / n_microbatches)

        return loss_fn


def _require_decoder(model: nn.Module, what: str) -> None:
    if not isinstance(getattr(model, "layers", None), nn.ModuleDict):
        raise ConfigError(
            f"parallel: {what} needs a model with a 'layers' ModuleDict of blocks "
            "(like the built-in gpt/llama); this model has none"
        )


# What torch.compile builds with; tests trace with "aot_eager" (no inductor build).
COMPILE_BACKEND: str | Callable[..., Any] = "inductor"


def compiles_fullgraph(config: TrainConfig) -> bool:
    """Built-in models compile without a graph break, whole or block by block,
    checkpointed or not (tests/unit/trainer/test_compile.py). A user model may break
    the graph, which fullgraph would turn into an error, so it compiles without."""
    return config.model.import_path is None


def compiles_whole_model(config: TrainConfig, dims: ParallelDims, wraps_in_fsdp: bool) -> bool:
    """One process without FSDP: forward and loss compile as one graph, so the
    forward fuses across blocks and no Python runs between them. FSDP (its hooks
    gather per block), TP and PP (DTensor layouts, stages) compile block by block,
    and so does DDP: composable ``replicate``'s forward hook disables dynamo, which
    breaks a whole-model graph (nn.parallel.DistributedDataParallel would be needed)."""
    alone = dims.degrees.world_size == 1
    return config.training.compile and alone and not wraps_in_fsdp


def compile_loss(model: ParallelModel, config: TrainConfig) -> None:
    if config.training.cuda_graphs:
        # Static shapes: a new shape compiles and captures anew rather than
        # making the graph dynamic, which CUDA graphs cannot replay.
        model.compiled_loss = torch.compile(
            model.eager_loss,
            fullgraph=compiles_fullgraph(config),
            dynamic=False,
            mode="reduce-overhead",
        )
        model.cuda_graphs = True
        return
    model.compiled_loss = torch.compile(
        model.eager_loss, fullgraph=compiles_fullgraph(config), backend=COMPILE_BACKEND
    )


def check_cuda_graphs(config: TrainConfig, dims: ParallelDims | None, device: torch.device) -> None:
    """training.cudaGraphs where it can work, else a ConfigError that says why."""
    if not config.training.cuda_graphs:
        return
    if device.type != "cuda":
        raise ConfigError(f"training.cudaGraphs: needs a CUDA device; this run is on {device}")
    if dims is None:
        return
    fsdp = dims.wraps_in_fsdp(torch.bfloat16, config.parallel.fsdp_memory_saving)
    if not compiles_whole_model(config, dims, fsdp):
        raise ConfigError(
            "training.cudaGraphs: needs one process without FSDP (the whole-model compile); "
            f"this run has {dims.degrees.world_size} processes"
            + (" and parallel.fsdpMemorySaving" if fsdp else "")
        )


def wrap_blocks(part: nn.Module, config: TrainConfig, compile_blocks: bool = True) -> None:
    """Activation checkpointing and compile, block by block (compile only when
    ``compile_blocks``: not when the whole model compiles); a model without the
    named container gets neither, and says so rather than silently."""
    checkpoints = config.training.activation_checkpointing == "full"
    compiles = config.training.compile and compile_blocks
    if not (checkpoints or compiles):
        return
    container = find_blocks(part, config.model.blocks)
    if container is None:
        warnings.warn(
            f"model.blocks: this model has no {config.model.blocks!r} container of blocks "
            "(a ModuleDict, ModuleList or Sequential), so training.activationCheckpointing "
            "and training.compile do nothing; set model.blocks to the attribute path of the "
            "model's blocks",
            UserWarning,
            stacklevel=2,
        )
        return
    for name, block in list(container.named_children()):
        if checkpoints:
            block = checkpoint_wrapper(block, preserve_rng_state=True)
            container.register_module(name, block)
        if compiles:
            block.compile(fullgraph=compiles_fullgraph(config), backend=COMPILE_BACKEND)


def reshards_after_forward(config: TrainConfig, degrees: ResolvedDegrees) -> bool:
    """FSDP frees gathered parameters after forward as configured, except under
    pipeline parallelism: a stage runs forward once per microbatch and would
    gather again each time (TorchTitan's default too)."""
    return config.parallel.reshard_after_forward and degrees.pp == 1


def _apply_within_stage(
    part: nn.Module, config: TrainConfig, dims: ParallelDims, param_dtype: torch.dtype
) -> None:
    if dims.degrees.tp > 1:
        apply_tensor_parallel(part, dims.mesh["tp"], config.parallel.sequence_parallel)
    fsdp = dims.wraps_in_fsdp(param_dtype, config.parallel.fsdp_memory_saving)
    wrap_blocks(part, config, compile_blocks=not compiles_whole_model(config, dims, fsdp))
    if fsdp:
        apply_fsdp(
            part,
            dims.dp_mesh(),
            param_dtype,
            reshards_after_forward(config, dims.degrees),
            config.model.blocks,
        )
    elif dims.uses_ddp:
        apply_ddp(part, dims.mesh["dp_replicate"])


def parallelize(
    model: nn.Module,
    config: TrainConfig,
    dims: ParallelDims | None,
    device: torch.device,
    param_dtype: torch.dtype,
) -> ParallelModel:
    """This rank's parallel model; ``dims=None`` means a plain single-process model."""
    check_cuda_graphs(config, dims, device)
    reduced = param_dtype != torch.float32
    if dims is None:
        autocast = param_dtype if reduced else None
        return ParallelModel([model], None, True, True, False, autocast_dtype=autocast)
    if dims.degrees.tp > 1:
        _require_decoder(model, "tensor parallelism")
    fsdp_wraps = dims.wraps_in_fsdp(param_dtype, config.parallel.fsdp_memory_saving)
    fsdp_mixed_precision = reduced and fsdp_wraps
    precision: dict[str, Any] = {
        "fsdp_mixed_precision": fsdp_mixed_precision,
        "autocast_dtype": param_dtype if reduced and not fsdp_mixed_precision else None,
        "device_type": device.type,
        "vocab_sharded": dims.degrees.tp > 1,
    }
    if dims.degrees.pp == 1:
        _apply_within_stage(model, config, dims, param_dtype)
        result = ParallelModel([model], None, True, True, **precision)
        if compiles_whole_model(config, dims, fsdp_wraps):
            compile_loss(result, config)
        return result
    _require_decoder(model, "pipeline parallelism")
    from torchfleet_trainer.distributed.pipeline import build_schedule, split_model

    per_rank = config.parallel.stages_per_pipeline_rank
    num_stages = dims.degrees.pp * per_rank
    stages = split_model(model, dims.rank_in("pp"), dims.degrees.pp, per_rank)
    for _, part in stages:
        _apply_within_stage(part, config, dims, param_dtype)
    n_micro = config.pipeline_microbatches(dims.degrees)
    result = ParallelModel(
        parts=[part for _, part in stages],
        schedule=None,
        has_first_stage=any(i == 0 for i, _ in stages),
        has_last_stage=any(i == num_stages - 1 for i, _ in stages),
        **precision,
    )
    result.schedule = build_schedule(
        stages,
        num_stages,
        dims.mesh["pp"],
        device,
        config.parallel.pipeline_schedule,
        n_micro,
        result.pipeline_loss(n_micro),
    )
    return result
