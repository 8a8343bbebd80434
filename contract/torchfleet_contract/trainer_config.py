"""The trainer's configuration: one pydantic model, importable without torch.

The operator embeds ``TrainConfig.model_json_schema()`` under a TrainingJob's
spec, so the API server rejects a bad trainer config at ``kubectl apply``; the
same model validates again in the pod before any process group starts. Keep it
schema-friendly: camelCase aliases, no extra keys, descriptions on every field
(they become ``kubectl explain`` text), literal enums, bounds, defaults
everywhere (``{}`` is a valid config) and no recursive types.

Checks that need the world size (parallel degrees) live in
:meth:`ParallelConfig.resolve`, called at launch.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from torchfleet_contract import pod as contract

# A single token file; any other 'tokens' path is a directory with train.bin and val.bin.
BIN_SUFFIX = ".bin"


class ConfigError(ValueError):
    """A trainer config is invalid; the message names the field path."""


class _Section(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
    )


class ModelConfig(_Section):
    """Which decoder-only transformer to train and its shape."""

    architecture: Literal["gpt", "llama"] = Field(
        "gpt",
        description="Built-in model family: 'gpt' (nanoGPT-style: LayerNorm, GELU, learned "
        "positions) or 'llama' (RMSNorm, RoPE, SwiGLU, grouped-query attention).",
    )
    import_path: str | None = Field(
        None,
        # ASCII classes, never \w: pydantic reads \w as Unicode, the API server's
        # RE2 as ASCII, and the CRD rule is generated from this pattern.
        pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$",
        description="A user model as 'package.module:factory'; the factory takes this "
        "ModelConfig and returns a torch.nn.Module. Overrides 'architecture'.",
    )
    blocks: str = Field(
        "layers",
        max_length=253,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$",
        description="Dotted attribute path of the container (ModuleDict, ModuleList or "
        "Sequential) of the model's repeated blocks, which activation checkpointing and "
        "compile wrap one by one; 'layers' in the built-in models. A user model without it "
        "trains without either, with a warning.",
    )
    layers: int = Field(6, ge=1, le=1024, description="Number of transformer blocks.")
    heads: int = Field(6, ge=1, le=1024, description="Attention heads per block.")
    kv_heads: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Key/value heads for grouped-query attention (llama only); "
        "defaults to 'heads'. Must divide 'heads'.",
    )
    dim: int = Field(384, ge=8, le=65536, description="Model (residual stream) width.")
    ffn_hidden: int | None = Field(
        None,
        ge=1,
        description="Hidden width of the feed-forward block; defaults to 4*dim for gpt "
        "and 8/3*dim rounded up to a multiple of 64 for llama.",
    )
    vocab_size: int | None = Field(
        None,
        ge=2,
        le=1_048_576,
        description="Vocabulary size; defaults to the dataset's (65 for tiny Shakespeare).",
    )
    max_seq_len: int = Field(
        256, ge=1, le=1_048_576, description="Longest context the model supports."
    )
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout probability.")
    bias: bool = Field(False, description="Use biases in linear layers and LayerNorm (gpt).")
    norm_eps: float = Field(1e-5, gt=0.0, le=0.1, description="Epsilon of the norm layers.")
    rope_theta: float = Field(10000.0, gt=0.0, description="RoPE base frequency (llama).")
    tie_embeddings: bool = Field(
        False,
        description="Share the token embedding with the output projection. Off by default; "
        "not with parallel.tensor or parallel.pipeline > 1 (tensor parallelism shards the "
        "two differently, pipeline stages hold them on different ranks).",
    )

    @model_validator(mode="after")
    def _check_shape(self) -> Self:
        if self.dim % self.heads:
            raise ValueError(f"model.dim: {self.dim} is not divisible by heads={self.heads}")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"model.kvHeads: {self.kv_heads} must divide heads={self.heads}")
        if self.architecture == "llama" and (self.dim // self.heads) % 2:
            raise ValueError("model.dim: llama's RoPE needs an even head dimension (dim/heads)")
        return self

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads


class DataConfig(_Section):
    """Where training tokens come from."""

    kind: Literal["char", "tokens", "synthetic"] = Field(
        "synthetic",
        description="'char': a character-level text file (vocabulary = its distinct "
        "characters); 'tokens': memory-mapped token files (.bin, uint16/uint32); "
        "'synthetic': random tokens, for benchmarks.",
    )
    path: str | None = Field(
        None,
        description="For 'char', the text file. For 'tokens', a directory with train.bin "
        "and val.bin, or one .bin file (split by valFraction).",
    )
    token_dtype: Literal["uint16", "uint32"] = Field(
        "uint16", description="Element type of the .bin token files."
    )
    seq_len: int = Field(256, ge=1, le=1_048_576, description="Tokens per training sequence.")
    val_fraction: float = Field(
        0.1,
        ge=0.0,
        lt=1.0,
        description="Share of the corpus held out for validation (the tail, as nanoGPT).",
    )
    synthetic_tokens: int = Field(
        1_000_000, ge=1024, description="Corpus length for 'synthetic' data."
    )

    @property
    def splits_tail(self) -> bool:
        """True when validation is the corpus's tail (valFraction applies): a text file or
        a single .bin file. A directory brings its own val.bin; synthetic data always
        holds some tokens out."""
        return self.kind == "char" or (
            self.kind == "tokens" and (self.path or "").endswith(BIN_SUFFIX)
        )

    @model_validator(mode="after")
    def _check_path(self) -> Self:
        if self.kind in ("char", "tokens") and not self.path:
            raise ValueError(f"data.path: required when data.kind is '{self.kind}'")
        return self


class OptimizerConfig(_Section):
    """AdamW and gradient clipping."""

    lr: float = Field(1e-3, gt=0.0, le=10.0, description="Peak learning rate.")
    beta1: float = Field(0.9, ge=0.0, lt=1.0, description="AdamW beta1.")
    beta2: float = Field(0.99, ge=0.0, lt=1.0, description="AdamW beta2.")
    eps: float = Field(1e-8, gt=0.0, le=1.0, description="AdamW epsilon.")
    weight_decay: float = Field(0.1, ge=0.0, le=10.0, description="Decoupled weight decay.")
    grad_clip: float = Field(
        1.0, ge=0.0, description="Clip the global gradient norm to this; 0 disables clipping."
    )


class ScheduleConfig(_Section):
    """Learning-rate schedule: linear warm-up, then decay to minLrRatio*lr."""

    kind: Literal["cosine", "linear", "constant"] = Field(
        "cosine", description="Shape of the decay after warm-up."
    )
    warmup_steps: int = Field(100, ge=0, description="Steps of linear warm-up from ~0 to lr.")
    decay_steps: int | None = Field(
        None, ge=1, description="Step at which decay ends; defaults to training.steps."
    )
    min_lr_ratio: float = Field(
        0.1, ge=0.0, le=1.0, description="Final learning rate as a fraction of lr."
    )


class TrainingConfig(_Section):
    """The loop: steps, batch, precision, evaluation."""

    steps: int = Field(1000, ge=1, description="Optimizer steps to run.")
    global_batch_size: int = Field(
        64,
        ge=1,
        description="Sequences per optimizer step, summed over data-parallel ranks and "
        "gradient-accumulation micro-steps.",
    )
    grad_accum_steps: int = Field(
        1,
        ge=1,
        description="Micro-steps accumulated per optimizer step. In an elastic job, the "
        "count at its largest size (maxNodes); it adapts to the nodes present so that the "
        "global batch stays the same.",
    )
    micro_batch_size: int | None = Field(
        None,
        ge=1,
        description="Sequences each data-parallel rank runs per micro-step (TorchTitan's "
        "local batch size). When set, gradient accumulation is derived for the world size "
        "as globalBatchSize / (data-parallel degree x microBatchSize), and gradAccumSteps "
        "must be left at 1. Elastic jobs always keep the micro batch fixed (by default the "
        "one gradAccumSteps gives at maxNodes), so it must divide the global batch evenly "
        "at every node count they may run at.",
    )
    seed: int = Field(1337, ge=0, description="Seed for initialisation, data and dropout.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="'auto' uses CUDA when present, else CPU."
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="Compute precision. 'auto' is bf16 on CUDA and fp32 on CPU. Parameters "
        "and optimizer state stay fp32. Where a data-parallel degree shards (FSDP2, HSDP), "
        "FSDP2's MixedPrecisionPolicy casts weights to bf16 per gather; elsewhere autocast "
        "runs the forward and loss, keeping norms, softmax and the loss in fp32 (the "
        "trainer README compares the two).",
    )
    meta_device_init: Literal["auto", "always", "never"] = Field(
        "auto",
        description="Build the model on the meta device and materialise only this rank's "
        "shards: 'auto' does on CUDA and builds the whole model directly on CPU; 'always' "
        "also on CPU (how tests cover the GPU path).",
    )
    compile: bool = Field(
        False,
        description="torch.compile the model: for one process without FSDP the whole "
        "forward and loss as one graph; under FSDP2, DDP, tensor or pipeline parallelism "
        "each block. The first steps pay the compilation (tens of seconds on a GPU).",
    )
    cuda_graphs: bool = Field(
        False,
        description="Replay the compiled forward and backward as CUDA graphs (torch.compile "
        "mode 'reduce-overhead'), which removes the per-kernel launch cost that dominates "
        "small models. Needs training.compile, a CUDA device and one process without FSDP "
        "(the whole-model compile), static shapes (compiled with dynamic=False), one "
        "micro-step per step (refused with gradient accumulation) and a fixed gang "
        "(refused for elastic jobs); graphs keep their own memory pool, so peak memory "
        "grows. Off by default until measured on a GPU.",
    )
    activation_checkpointing: Literal["none", "full"] = Field(
        "none", description="Recompute each block's activations in the backward pass."
    )
    eval_interval: int = Field(
        250, ge=0, description="Evaluate every this many steps (and at the end); 0 disables."
    )
    eval_batches: int = Field(20, ge=1, description="Batches averaged per evaluation.")
    log_interval: int = Field(10, ge=1, description="Log metrics every this many steps.")
    max_non_finite_steps: int = Field(
        10,
        ge=1,
        description="A step whose loss or gradient norm is NaN or infinite skips its "
        "optimizer update (and any interval checkpoint); this many such steps in a row "
        "fail the run.",
    )

    def accumulates(self) -> bool:
        """Whether a step runs more than one micro-step on one process (the only world
        cudaGraphs runs in)."""
        micro = self.micro_batch_size
        return self.grad_accum_steps > 1 or (micro is not None and micro < self.global_batch_size)

    @model_validator(mode="after")
    def _check_batch(self) -> Self:
        if self.cuda_graphs and not self.compile:
            raise ValueError(
                "training.cudaGraphs: needs training.compile=true (the graphs are captured "
                "from the compiled forward and backward)"
            )
        if self.cuda_graphs and self.accumulates():
            raise ValueError(
                "training.cudaGraphs: not with gradient accumulation (gradAccumSteps > 1 or "
                "microBatchSize below globalBatchSize): the trainer frees .grad every step, so "
                "the second micro-step's backward would allocate .grad inside the captured "
                "graph, which torch's 'reduce-overhead' mode refuses"
            )
        if self.micro_batch_size is not None and self.grad_accum_steps != 1:
            raise ValueError(
                "training.microBatchSize: set either microBatchSize or gradAccumSteps, not "
                "both (with microBatchSize the accumulation follows from the world size)"
            )
        if self.global_batch_size % self.grad_accum_steps:
            raise ValueError(
                f"training.globalBatchSize: {self.global_batch_size} is not divisible by "
                f"gradAccumSteps={self.grad_accum_steps}"
            )
        return self


class ParallelConfig(_Section):
    """Parallel degrees; their product must equal the world size."""

    data_parallel_replicate: int = Field(
        1, ge=1, description="Replicated data-parallel degree (DDP, or HSDP with shard>1)."
    )
    data_parallel_shard: int = Field(
        -1,
        ge=-1,
        description="Sharded data-parallel degree (FSDP2); -1 takes the ranks the other "
        "degrees leave.",
    )
    tensor: int = Field(1, ge=1, description="Tensor-parallel degree (within a node).")
    pipeline: int = Field(1, ge=1, description="Pipeline-parallel degree (stages groups).")
    pipeline_schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] = Field(
        "1f1b", description="Pipeline schedule."
    )
    pipeline_microbatches: int | None = Field(
        None,
        ge=1,
        description="Microbatches per pipeline step; defaults to the pipeline degree "
        "times stagesPerRank.",
    )
    stages_per_rank: int = Field(
        2, ge=1, description="Model chunks per pipeline rank for interleaved_1f1b."
    )
    sequence_parallel: bool = Field(
        True, description="With tensor>1, also shard norms and dropout along the sequence."
    )
    fsdp_memory_saving: bool = Field(
        False,
        description="A memory mode for bf16 where no data-parallel degree shards (one "
        "process, TP-only, PP-only): wrap the model in FSDP2 anyway, at shard degree 1, so "
        "each block's bf16 weights exist only while it runs instead of autocast's copies of "
        "all of them for the whole forward and backward (5.1 GB less at 1.2B parameters on "
        "an H100). It costs speed (FSDP2's gather copies and per-block hooks: 2% at 1.2B, "
        "2.5x for a 10M-parameter model). Off by "
        "default; no effect in fp32, under DDP, or where FSDP2 shards anyway.",
    )
    reshard_after_forward: bool = Field(
        True,
        description="FSDP2: free gathered parameters after forward (ZeRO-3). Not under "
        "pipeline parallelism, where each microbatch would gather them again.",
    )

    @model_validator(mode="after")
    def _check_degrees(self) -> Self:
        if self.data_parallel_shard == 0:
            raise ValueError("parallel.dataParallelShard: must be -1 or >= 1, got 0")
        return self

    @property
    def stages_per_pipeline_rank(self) -> int:
        return self.stages_per_rank if self.pipeline_schedule == "interleaved_1f1b" else 1

    def resolve(self, world_size: int) -> ResolvedDegrees:
        """Fills dataParallelShard=-1 and checks the product against the world size."""
        fixed = self.data_parallel_replicate * self.tensor * self.pipeline
        shard = self.data_parallel_shard
        if shard == -1:
            if world_size % fixed:
                raise ConfigError(
                    f"parallel: world size {world_size} is not divisible by "
                    f"dataParallelReplicate*tensor*pipeline = {fixed}"
                )
            shard = world_size // fixed
        if fixed * shard != world_size:
            raise ConfigError(
                f"parallel: degrees multiply to {fixed * shard} "
                f"(dataParallelReplicate={self.data_parallel_replicate} x dataParallelShard="
                f"{shard} x tensor={self.tensor} x pipeline={self.pipeline}) but the world "
                f"size is {world_size}"
            )
        return ResolvedDegrees(
            dp_replicate=self.data_parallel_replicate,
            dp_shard=shard,
            tp=self.tensor,
            pp=self.pipeline,
        )


class ResolvedDegrees(BaseModel):
    """Parallel degrees with -1 filled in, for one world size."""

    model_config = ConfigDict(frozen=True)

    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp


class CheckpointConfig(_Section):
    """Distributed checkpoints (torch.distributed.checkpoint)."""

    enabled: bool = Field(True, description="Save checkpoints and resume from them.")
    dir: str | None = Field(
        None,
        description=f"Checkpoint directory; defaults to ${contract.CHECKPOINT_DIR}, the "
        "volume the operator mounts.",
    )
    interval: int = Field(500, ge=1, description="Save every this many steps.")
    keep_last: int = Field(
        3, ge=1, description="Complete checkpoints kept; older ones are deleted."
    )
    async_save: bool = Field(
        False, description="Save in a background thread while training continues."
    )
    save_on_sigterm: bool = Field(
        True, description="On SIGTERM (preemption), save at the next step boundary and exit."
    )
    save_final: bool = Field(True, description="Save after the last step.")


class MetricsConfig(_Section):
    """Prometheus /metrics and JSON step logs."""

    enabled: bool = Field(True, description="Serve Prometheus /metrics from local rank 0.")
    port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description=f"Port for /metrics; defaults to ${contract.METRICS_PORT}, else "
        f"{contract.DEFAULT_METRICS_PORT}. 0 picks a free port.",
    )
    json_logs: bool = Field(True, description="Print one JSON line per logged step on stdout.")
    peak_tflops: float | None = Field(
        None,
        gt=0.0,
        description="Accelerator's dense peak TFLOP/s for MFU; defaults to the GPU's own "
        "at the run's precision (H100/H200 SXM, H100 PCIe/NVL, A100). Without it no MFU is "
        "reported on CPU or an unknown GPU.",
    )


class TensorBoardConfig(_Section):
    """TensorBoard event files, written by rank 0."""

    enabled: bool = Field(
        True,
        description="Write TensorBoard curves (loss, eval loss, learning rate, grad norm, "
        "tokens/s, MFU, step time, peak GPU memory, checkpoint save time) and, at step 0, "
        "the config and parallel layout.",
    )
    dir: str | None = Field(
        None,
        max_length=4096,
        description="Event file directory; defaults to <checkpoint dir>/tensorboard, so a "
        "resumed run appends to the same curves. With neither, nothing is written.",
    )


class PreflightConfig(_Section):
    """A short check of every rank before training: matmul throughput and all-reduce."""

    enabled: bool = Field(
        False,
        description="Before the first step of each gang of two or more processes, measure "
        "each process's matmul throughput (bf16 on GPU, fp32 on CPU) and the gang's "
        "all-reduce bus bandwidth on its own backend; report a node below "
        "minMatmulFraction of the median node, and fail the gang if a collective fails or "
        "times out. Adds a few seconds to every gang start.",
    )
    matmul_size: int | None = Field(
        None,
        ge=64,
        le=32768,
        description="Side of the square matmul each process repeats; defaults to 4096 on "
        "GPU, 512 on CPU.",
    )
    matmul_seconds: float = Field(
        1.0, gt=0.0, le=60.0, description="Seconds each process repeats the matmul for."
    )
    min_matmul_fraction: float = Field(
        0.8,
        gt=0.0,
        le=1.0,
        description="A node whose slowest process's matmul throughput is below this "
        "fraction of the median node's is reported.",
    )
    allreduce_mebibytes: int | None = Field(
        None,
        ge=1,
        le=16384,
        description="Size of the all-reduced buffer in MiB; defaults to 256 on GPU, 16 on CPU.",
    )
    allreduce_iterations: int = Field(
        5, ge=1, le=1000, description="Timed all-reduces (after one warm-up)."
    )
    timeout_seconds: float = Field(
        60.0,
        gt=0.0,
        le=3600.0,
        description="A collective of the check that has not completed after this many "
        "seconds fails the gang (exit code 201) instead of hanging it.",
    )


class TrainConfig(_Section):
    """Everything torchfleet-train needs; `{}` is a valid (synthetic, small) config."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="The model.")
    data: DataConfig = Field(default_factory=DataConfig, description="The training data.")
    optimizer: OptimizerConfig = Field(
        default_factory=OptimizerConfig, description="AdamW and gradient clipping."
    )
    schedule: ScheduleConfig = Field(
        default_factory=ScheduleConfig, description="Learning-rate schedule."
    )
    training: TrainingConfig = Field(
        default_factory=TrainingConfig, description="Steps, batch, precision, evaluation."
    )
    parallel: ParallelConfig = Field(
        default_factory=ParallelConfig, description="Parallel degrees and schedules."
    )
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Distributed checkpointing."
    )
    metrics: MetricsConfig = Field(
        default_factory=MetricsConfig, description="Prometheus metrics and JSON logs."
    )
    tensorboard: TensorBoardConfig = Field(
        default_factory=TensorBoardConfig, description="TensorBoard event files."
    )
    preflight: PreflightConfig = Field(
        default_factory=PreflightConfig,
        description="A check of every node's compute and the gang's collectives before training.",
    )

    @model_validator(mode="after")
    def _check_cross_fields(self) -> Self:
        if self.training.eval_interval and self.data.val_fraction == 0 and self.data.splits_tail:
            raise ValueError(
                "data.valFraction: 0 leaves no validation split for evaluation "
                f"(training.evalInterval={self.training.eval_interval}); set valFraction > 0 "
                "or training.evalInterval=0"
            )
        if self.data.seq_len > self.model.max_seq_len:
            raise ValueError(
                f"data.seqLen: {self.data.seq_len} exceeds model.maxSeqLen={self.model.max_seq_len}"
            )
        tp = self.parallel.tensor
        if self.model.tie_embeddings and (tp > 1 or self.parallel.pipeline > 1):
            raise ValueError(
                f"model.tieEmbeddings: cannot be used with parallel.tensor={tp} or "
                f"parallel.pipeline={self.parallel.pipeline}; tying needs both at 1"
            )
        if self.model.import_path is None:
            if self.model.heads % tp:
                raise ValueError(f"parallel.tensor: {tp} does not divide model.heads")
            if self.model.n_kv_heads % tp:
                raise ValueError(f"parallel.tensor: {tp} does not divide model.kvHeads")
        stages = self.parallel.pipeline * self.parallel.stages_per_pipeline_rank
        if stages > self.model.layers:
            raise ValueError(
                f"parallel.pipeline: {stages} pipeline stages exceed model.layers="
                f"{self.model.layers}"
            )
        return self

    def check_world(self, world_size: int, largest_world: int | None = None) -> ResolvedDegrees:
        """Launch-time checks that need the world size; raises ConfigError.

        ``largest_world``: for an elastic job, the world size at maxNodes, which
        fixes the per-rank micro batch (see :meth:`micro_batch_size`)."""
        degrees = self.parallel.resolve(world_size)
        anchor = self.parallel.resolve(largest_world) if largest_world else degrees
        per_step = self.training.global_batch_size
        accum = self.training.grad_accum_steps
        if self.training.micro_batch_size is None and per_step % (anchor.dp * accum):
            at_max = " at maxNodes" if largest_world else ""
            raise ConfigError(
                f"training.globalBatchSize: {per_step} is not divisible by data-parallel "
                f"degree {anchor.dp}{at_max} x gradAccumSteps {accum}"
            )
        micro = self.micro_batch_size(anchor)
        if per_step % (degrees.dp * micro):
            raise ConfigError(
                f"training.globalBatchSize: {per_step} is not divisible by data-parallel "
                f"degree {degrees.dp} x micro batch {micro} (training.microBatchSize, or "
                "globalBatchSize / (data-parallel degree at maxNodes x gradAccumSteps)): the "
                "global batch would change with the world size"
            )
        if degrees.pp > 1:
            n_micro = self.pipeline_microbatches(degrees)
            if micro % n_micro:
                raise ConfigError(
                    f"parallel.pipelineMicrobatches: {n_micro} does not divide the per-rank "
                    f"micro-batch of {micro} sequences"
                )
        if degrees.tp > 1 and self.parallel.sequence_parallel and self.data.seq_len % degrees.tp:
            raise ConfigError(
                f"data.seqLen: {self.data.seq_len} is not divisible by parallel.tensor="
                f"{degrees.tp}, which sequence parallelism needs"
            )
        return degrees

    def check_elastic(self, node_counts: range, processes_per_node: int) -> None:
        """An elastic job must train at every node count it may run at, with the same
        global batch; refused up front (before any process group) with the field.
        Data parallelism is the degree that follows the world size."""
        if self.training.cuda_graphs:
            raise ConfigError(
                "training.cudaGraphs: not for elastic jobs, whose world changes between "
                "rendezvous rounds; CUDA graphs are for a fixed single-process run"
            )
        if len(node_counts) > 1 and self.parallel.data_parallel_shard != -1:
            raise ConfigError(
                f"parallel.dataParallelShard: {self.parallel.data_parallel_shard} is fixed, but "
                "an elastic job's data-parallel degree follows the nodes present; leave it at -1"
            )
        largest = node_counts[-1] * processes_per_node
        # The largest first: it fixes the micro batch, so its own errors name it.
        for nodes in [node_counts[-1], *node_counts[:-1]]:
            try:
                self.check_world(nodes * processes_per_node, largest_world=largest)
            except ConfigError as err:
                hint = self._batch_hint(node_counts, processes_per_node)
                raise ConfigError(
                    f"{err} (an elastic job must keep training at every size from "
                    f"{node_counts[0]} to {node_counts[-1]} nodes; this fails at {nodes} "
                    f"nodes x {processes_per_node} processes{hint})"
                ) from None

    def _batch_hint(self, node_counts: range, processes_per_node: int) -> str:
        """What micro batch would work at every size, when the degrees allow one."""
        try:
            dps = [self.parallel.resolve(n * processes_per_node).dp for n in node_counts]
        except ConfigError:
            return ""
        common = math.lcm(*dps)
        per_step = self.training.global_batch_size
        if per_step % common:
            return f"; globalBatchSize must be a multiple of {common}"
        return f"; a training.microBatchSize that divides {per_step // common} keeps it exact"

    def micro_batch_size(self, anchor: ResolvedDegrees) -> int:
        """Sequences one data-parallel rank runs per micro-step: training.microBatchSize,
        else what gradAccumSteps gives at ``anchor`` (the world this job runs at, or an
        elastic job's largest)."""
        explicit = self.training.micro_batch_size
        if explicit is not None:
            return explicit
        return self.training.global_batch_size // (anchor.dp * self.training.grad_accum_steps)

    def grad_accum_steps(self, degrees: ResolvedDegrees, largest_world: int | None = None) -> int:
        """Micro-steps per optimizer step at ``degrees``: the global batch over the
        data-parallel degree and the fixed micro batch (exact after check_world)."""
        anchor = self.parallel.resolve(largest_world) if largest_world else degrees
        return self.training.global_batch_size // (degrees.dp * self.micro_batch_size(anchor))

    def pipeline_microbatches(self, degrees: ResolvedDegrees) -> int:
        explicit = self.parallel.pipeline_microbatches
        return explicit or degrees.pp * self.parallel.stages_per_pipeline_rank


# ---- loading -------------------------------------------------------------------------------


_NAMED_MESSAGE = re.compile(r"^[A-Za-z][\w.]*: ")


def format_validation_error(error: ValidationError) -> str:
    """One line per problem, each starting with the dotted field path."""
    lines = []
    for item in error.errors():
        path = ".".join(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        # Model validators already start their message with the full field path.
        named = _NAMED_MESSAGE.match(message) is not None
        lines.append(f"{path}: {message}" if path and not named else message)
    return "; ".join(lines)


def _to_camel_path(key: str) -> list[str]:
    return [to_camel(part) if "_" in part else part for part in key.split(".")]


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Applies ``key.sub=value`` overrides (values parsed as YAML) to a raw config dict."""
    result = json.loads(json.dumps(data))  # deep copy of plain data
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r}: expected key.sub=value")
        path = _to_camel_path(key.strip())
        node = result
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{key}: {part} is not a section")
            node = child
        node[path[-1]] = yaml.safe_load(raw)
    return result


def _normalise_keys(data: Any) -> Any:
    """Accepts snake_case keys too by mapping them to the camelCase aliases."""
    if isinstance(data, dict):
        return {
            (to_camel(k) if isinstance(k, str) and "_" in k else k): _normalise_keys(v)
            for k, v in data.items()
        }
    return data


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
) -> TrainConfig:
    """The config from a YAML/JSON file, else the operator's rendered config, plus overrides.

    The operator has already written the job's checkpoint cadence into the
    rendered config (``desired/env.py``); nothing here merges env into it."""
    raw: Any
    if path is not None:
        try:
            raw = yaml.safe_load(Path(path).read_text())
        except OSError as err:
            raise ConfigError(f"--config: cannot read {path}: {err.strerror}") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"--config: {path} is not valid YAML/JSON: {err}") from None
    elif (rendered := pod_contract(env).train_config) is not None:
        try:
            raw = json.loads(rendered)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{contract.TRAIN_CONFIG}: not valid JSON: {err}") from None
    else:
        raw = {}
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config: expected a mapping at the top level, got {type(raw).__name__}")
    raw = apply_overrides(_normalise_keys(raw), overrides)
    try:
        return TrainConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None


def pod_contract(env: Mapping[str, str] | None = None) -> contract.PodContract:
    """The pod contract from ``env`` (default: this process's), as a ConfigError if broken."""
    try:
        return contract.PodContract.from_env(env)
    except contract.ContractError as err:
        raise ConfigError(str(err)) from None


def recovery_settings(env: Mapping[str, str] | None = None) -> contract.RecoverySettings:
    """Collective timeouts and kept logs from ``env``, as a ConfigError if broken."""
    try:
        return contract.RecoverySettings.from_env(env)
    except contract.ContractError as err:
        raise ConfigError(str(err)) from None


def largest_world(pod: contract.PodContract, processes_per_node: int) -> int | None:
    """An elastic job's world size at maxNodes, which fixes its micro batch; None for a
    fixed gang."""
    return pod.elastic.max_nodes * processes_per_node if pod.elastic else None


def resolve_checkpoint_dir(config: TrainConfig, pod: contract.PodContract) -> str | None:
    return config.checkpoint.dir or pod.checkpoint_dir


def resolve_metrics_port(config: TrainConfig, pod: contract.PodContract) -> int:
    return config.metrics.port if config.metrics.port is not None else pod.metrics_port
