"""Rules that need the world size: the trainer's parallel degrees and batch
against the job's shape (nodes x processes per node).

The world size is fixed by the spec alone (processesPerNode 'gpu'/'auto'
resolve from resources.gpus), so these checks, which the trainer would
otherwise make only at launch (``TrainConfig.check_world``), run at
``kubectl apply``. Each rule is CEL over the spec (``self``) plus the same
check in Python, built on the trainer's own ``ParallelConfig.resolve`` and
``TrainConfig.pipeline_microbatches``.
"""

from __future__ import annotations

from collections.abc import Callable

from torchfleet_contract.trainer_config import (
    ConfigError,
    DataConfig,
    ParallelConfig,
    ResolvedDegrees,
    TrainConfig,
    TrainingConfig,
)
from torchfleet_operator.api.base import Rule
from torchfleet_operator.api.shape import SpecShape
from torchfleet_operator.api.trainer_rules import or_default

# ---- CEL fragments over the spec --------------------------------------------------------

_GPUS = "(self.resources.gpus > 0 ? self.resources.gpus : 1)"
PROCS = f"(type(self.processesPerNode) == int ? self.processesPerNode : {_GPUS})"
WORLD = f"((1 + self.worker.replicas) * {PROCS})"

_PARALLEL = "self.trainer.?parallel"
REPLICATE = or_default(_PARALLEL, ParallelConfig, "data_parallel_replicate")
_TENSOR = or_default(_PARALLEL, ParallelConfig, "tensor")
PIPELINE = or_default(_PARALLEL, ParallelConfig, "pipeline")
SHARD = or_default(_PARALLEL, ParallelConfig, "data_parallel_shard")
FIXED = f"({REPLICATE} * {_TENSOR} * {PIPELINE})"
_FITS = f"({SHARD} == -1 ? {WORLD} % {FIXED} == 0 : {FIXED} * {SHARD} == {WORLD})"
_DP = f"({REPLICATE} * ({SHARD} == -1 ? {WORLD} / {FIXED} : {SHARD}))"

TRAINING = "self.trainer.?training"
BATCH = or_default(TRAINING, TrainingConfig, "global_batch_size")
_MICRO_STEPS = f"({_DP} * {or_default(TRAINING, TrainingConfig, 'grad_accum_steps')})"
_STAGES_PER_RANK = (
    f"({or_default(_PARALLEL, ParallelConfig, 'pipeline_schedule')} == 'interleaved_1f1b' ? "
    f"{or_default(_PARALLEL, ParallelConfig, 'stages_per_rank')} : 1)"
)
MICROBATCHES = f"{_PARALLEL}.?pipelineMicrobatches.orValue({PIPELINE} * {_STAGES_PER_RANK})"
_SEQ_LEN = or_default("self.trainer.?data", DataConfig, "seq_len")
_SEQUENCE_PARALLEL = or_default(_PARALLEL, ParallelConfig, "sequence_parallel")

# format(), not '+': the cost estimator prices string concatenation as unbounded.
_DEGREES_MESSAGE = (
    "'trainer.parallel: dataParallelReplicate x tensor x pipeline = %d%s the world size %d "
    f"(nodes x processesPerNode)'.format([{FIXED}, {SHARD} == -1 ? ' does not divide' : "
    f"' x dataParallelShard %d does not equal'.format([{SHARD}]), {WORLD}])"
)


def _when_degrees_fit(cel: str) -> str:
    """Rules past the degrees apply only once they fit (else they are reported)."""
    return f"!has(self.trainer) || !{_FITS} || ({cel})"


# ---- the same in Python -----------------------------------------------------------------

TrainerCheck = Callable[[TrainConfig, ResolvedDegrees], bool]


def _degrees_fit(spec: SpecShape) -> bool:
    if spec.trainer is None:
        return True
    try:
        spec.trainer.parallel.resolve(spec.world_size)
    except ConfigError:
        return False
    return True


def _degrees_message(spec: SpecShape) -> str:
    assert spec.trainer is not None
    parallel = spec.trainer.parallel
    fixed = parallel.data_parallel_replicate * parallel.tensor * parallel.pipeline
    shard = parallel.data_parallel_shard
    verb = " does not divide" if shard == -1 else f" x dataParallelShard {shard} does not equal"
    return (
        f"trainer.parallel: dataParallelReplicate x tensor x pipeline = {fixed}{verb} "
        f"the world size {spec.world_size} (nodes x processesPerNode)"
    )


def _once_degrees_fit(check: TrainerCheck) -> Callable[[SpecShape], bool]:
    """A check of the trainer config against resolved degrees, as a spec check
    that passes when there is no trainer or the degrees do not fit."""

    def spec_check(spec: SpecShape) -> bool:
        if spec.trainer is None:
            return True
        try:
            degrees = spec.trainer.parallel.resolve(spec.world_size)
        except ConfigError:
            return True
        return check(spec.trainer, degrees)

    return spec_check


def _micro_steps(config: TrainConfig, degrees: ResolvedDegrees) -> int:
    return degrees.dp * config.training.grad_accum_steps


def _batch_splits(config: TrainConfig, degrees: ResolvedDegrees) -> bool:
    return config.training.global_batch_size % _micro_steps(config, degrees) == 0


def _microbatches_split(config: TrainConfig, degrees: ResolvedDegrees) -> bool:
    if degrees.pp == 1 or not _batch_splits(config, degrees):
        return True
    per_rank = config.training.global_batch_size // _micro_steps(config, degrees)
    return per_rank % config.pipeline_microbatches(degrees) == 0


def _sequence_splits(config: TrainConfig, degrees: ResolvedDegrees) -> bool:
    if degrees.tp == 1 or not config.parallel.sequence_parallel:
        return True
    return config.data.seq_len % degrees.tp == 0


def world_size_rules() -> tuple[Rule, ...]:
    """The spec's rules that involve the world size, in the order they apply."""
    return (
        Rule(
            cel=f"!has(self.trainer) || {_FITS}",
            message="trainer.parallel: dataParallelReplicate x dataParallelShard x tensor x "
            "pipeline must equal the world size (nodes x processesPerNode)",
            check=_degrees_fit,
            message_expression=_DEGREES_MESSAGE,
            describe=_degrees_message,
            field_path=".trainer.parallel",
        ),
        Rule(
            cel=_when_degrees_fit(f"{BATCH} % {_MICRO_STEPS} == 0"),
            message="trainer.training.globalBatchSize must be divisible by the data-parallel "
            "degree x gradAccumSteps",
            check=_once_degrees_fit(_batch_splits),
            field_path=".trainer.training.globalBatchSize",
        ),
        Rule(
            cel=_when_degrees_fit(
                f"{PIPELINE} == 1 || {BATCH} % {_MICRO_STEPS} != 0 || "
                f"({BATCH} / {_MICRO_STEPS}) % {MICROBATCHES} == 0"
            ),
            message="trainer.parallel.pipelineMicrobatches must divide each rank's share of "
            "globalBatchSize (globalBatchSize / (data-parallel degree x gradAccumSteps))",
            check=_once_degrees_fit(_microbatches_split),
            field_path=".trainer.parallel.pipelineMicrobatches",
        ),
        Rule(
            cel=_when_degrees_fit(
                f"{_TENSOR} == 1 || !{_SEQUENCE_PARALLEL} || {_SEQ_LEN} % {_TENSOR} == 0"
            ),
            message="trainer.data.seqLen must be divisible by parallel.tensor when "
            "sequenceParallel is on",
            check=_once_degrees_fit(_sequence_splits),
            field_path=".trainer.data.seqLen",
        ),
    )
