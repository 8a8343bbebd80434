"""Rules of an elastic job (``spec.elastic``) against the rest of the spec.

An elastic job runs at any node count from minNodes to maxNodes, so what the
world-size rules check for the desired size must hold at every size in that
range. With ``dataParallelShard: -1`` the data-parallel degree is the one that
follows the nodes: the fixed degrees (dataParallelReplicate x tensor x
pipeline) must then divide the world at every node count n. Two consecutive
counts n and n + 1 both being multiples of ``fixed / gcd`` forces ``fixed`` to
divide processesPerNode itself (it divides their difference), and that in turn
is enough for every n: so the CEL needs no loop over the sizes.

The global batch must split evenly at every size too (the trainer's
``TrainConfig.check_elastic``, which the Python side calls): with u = the
data-parallel degree per node, the per-rank micro batch m is
training.microBatchSize, else globalBatchSize / (maxNodes x u x gradAccumSteps);
then n x u x m must divide globalBatchSize for every n from minNodes to
maxNodes (and pipelineMicrobatches must divide m). That one loops, over
``lists.range`` with a constant bound so the API server can price it.

Each rule is CEL over the spec (``self``) plus the same check in Python.
"""

from __future__ import annotations

from torchfleet_contract.trainer_config import ConfigError, TrainingConfig
from torchfleet_operator.api import constants as c
from torchfleet_operator.api.base import Rule
from torchfleet_operator.api.shape import SpecShape
from torchfleet_operator.api.trainer_rules import or_default
from torchfleet_operator.api.world import (
    BATCH,
    FIXED,
    MICROBATCHES,
    PIPELINE,
    PROCS,
    REPLICATE,
    SHARD,
    TRAINING,
)

# On an elastic pod no per-pod or per-process rank exists: each rendezvous round
# numbers the nodes that joined it, so a command cannot name these.
RANK_VARIABLES = ("$(RANK)", "$(WORLD_SIZE)", "$(NODE_RANK)", "$(LOCAL_RANK)")

_ELASTIC = "has(self.elastic)"
_RESIZES = f"{_ELASTIC} && self.elastic.minNodes < self.elastic.maxNodes"
_NODES = "(1 + self.worker.replicas)"
# Past the two degree rules (each reports its own failure): the data-parallel degree
# per node, the micro batch, and the global batch's split at each size.
_DEGREES_FOLLOW = f"{SHARD} == -1 && {PROCS} % {FIXED} == 0"
_DP_PER_NODE = f"({REPLICATE} * {PROCS} / {FIXED})"
_ACCUM = or_default(TRAINING, TrainingConfig, "grad_accum_steps")
_GRAPHS = or_default(TRAINING, TrainingConfig, "cuda_graphs")
_GIVEN_MICRO = f"{TRAINING}.?microBatchSize"
_MIN, _MAX = "self.elastic.minNodes", "self.elastic.maxNodes"
_MICRO = f"{_GIVEN_MICRO}.orValue({BATCH} / ({_MAX} * {_DP_PER_NODE} * {_ACCUM}))"
_ANCHOR_SPLITS = (
    f"({_GIVEN_MICRO}.hasValue() || {BATCH} % ({_MAX} * {_DP_PER_NODE} * {_ACCUM}) == 0)"
)
_EVERY_SIZE_SPLITS = (
    f"lists.range({1 + c.MAX_WORKERS}).all(i, i > {_MAX} - {_MIN} || "
    f"{BATCH} % (({_MIN} + i) * {_DP_PER_NODE} * {_MICRO}) == 0)"
)
_MICROBATCHES_SPLIT = f"({PIPELINE} == 1 || {_MICRO} % {MICROBATCHES} == 0)"


def _resizes(spec: SpecShape) -> bool:
    """True for an elastic job that may run at more than one size."""
    return spec.elastic is not None and spec.elastic.min_nodes < spec.elastic.max_nodes


def _size_within_bounds(spec: SpecShape) -> bool:
    elastic = spec.elastic
    return elastic is None or elastic.min_nodes <= spec.nodes <= elastic.max_nodes


def _no_rank_in_command(spec: SpecShape) -> bool:
    words = [*(spec.command or ()), *(spec.args or ())]
    return spec.elastic is None or not any(v in word for word in words for v in RANK_VARIABLES)


def _no_cuda_graphs(spec: SpecShape) -> bool:
    return spec.elastic is None or spec.trainer is None or not spec.trainer.training.cuda_graphs


def _shard_follows_nodes(spec: SpecShape) -> bool:
    if not _resizes(spec) or spec.trainer is None:
        return True
    return spec.trainer.parallel.data_parallel_shard == -1


def _fixed_degrees_fit_a_node(spec: SpecShape) -> bool:
    if not _resizes(spec) or spec.trainer is None:
        return True
    parallel = spec.trainer.parallel
    fixed = parallel.data_parallel_replicate * parallel.tensor * parallel.pipeline
    return spec.resolved_processes_per_node % fixed == 0


def _batch_splits_at_every_size(spec: SpecShape) -> bool:
    return _batch_problem(spec) is None


def _batch_problem(spec: SpecShape) -> str | None:
    """The trainer's own refusal of this elastic layout's batch, or None."""
    if not (_shard_follows_nodes(spec) and _fixed_degrees_fit_a_node(spec)):
        return None  # reported by those rules
    if not _resizes(spec) or spec.trainer is None or spec.elastic is None:
        return None
    sizes = range(spec.elastic.min_nodes, spec.elastic.max_nodes + 1)
    try:
        spec.trainer.check_elastic(sizes, spec.resolved_processes_per_node)
    except ConfigError as error:
        return f"trainer.{error}"  # the trainer's words name the field below trainer
    return None


def elastic_rules() -> tuple[Rule, ...]:
    """The spec's rules for spec.elastic, in the order they apply."""
    no_rank = " && ".join(f"!a.contains({v!r})" for v in RANK_VARIABLES)
    words = "(has(self.command) ? self.command : []) + (has(self.args) ? self.args : [])"
    return (
        Rule(
            cel=f"!{_ELASTIC} || ({_NODES} >= self.elastic.minNodes && "
            f"{_NODES} <= self.elastic.maxNodes)",
            message="worker.replicas: the desired size 1 + worker.replicas must lie within "
            "elastic.minNodes..elastic.maxNodes",
            check=_size_within_bounds,
            field_path=".worker.replicas",
        ),
        Rule(
            cel=f"!{_ELASTIC} || ({words}).all(a, {no_rank})",
            message="spec.command/spec.args of an elastic job use $(RANK), $(WORLD_SIZE), "
            "$(NODE_RANK) or $(LOCAL_RANK), which no elastic pod has (each rendezvous round "
            "numbers the nodes): run plain `torchrun train.py` (it reads the pod's PET_* "
            "variables) and read the ranks torchrun gives each process",
            check=_no_rank_in_command,
            field_path=".command",
        ),
        Rule(
            cel=f"!{_ELASTIC} || !has(self.trainer) || !{_GRAPHS}",
            message="trainer.training.cudaGraphs is not for elastic jobs: the world changes "
            "between rendezvous rounds, and CUDA graphs are for a fixed single-process run",
            check=_no_cuda_graphs,
            field_path=".trainer.training.cudaGraphs",
        ),
        Rule(
            cel=f"!({_RESIZES}) || !has(self.trainer) || {SHARD} == -1",
            message="trainer.parallel.dataParallelShard must be -1 in an elastic job whose "
            "minNodes < maxNodes: its data-parallel degree follows the nodes present",
            check=_shard_follows_nodes,
            field_path=".trainer.parallel.dataParallelShard",
        ),
        Rule(
            cel=f"!({_RESIZES}) || !has(self.trainer) || {PROCS} % {FIXED} == 0",
            message="trainer.parallel: in an elastic job whose minNodes < maxNodes, "
            "dataParallelReplicate x tensor x pipeline must divide processesPerNode, so that "
            "every node count from minNodes to maxNodes has a whole data-parallel degree",
            check=_fixed_degrees_fit_a_node,
            field_path=".trainer.parallel",
        ),
        Rule(
            cel=f"!({_RESIZES}) || !has(self.trainer) || !({_DEGREES_FOLLOW}) || "
            f"({_ANCHOR_SPLITS} && {_EVERY_SIZE_SPLITS} && {_MICROBATCHES_SPLIT})",
            message="trainer.training.globalBatchSize must split evenly at every node count "
            "from elastic.minNodes to maxNodes: data-parallel degree x the micro batch "
            "(training.microBatchSize, or globalBatchSize / (data-parallel degree at maxNodes "
            "x gradAccumSteps)) must divide it, and pipelineMicrobatches the micro batch",
            check=_batch_splits_at_every_size,
            describe=lambda spec: _batch_problem(spec) or "",
            field_path=".trainer.training.globalBatchSize",
        ),
    )
