"""Rules of an elastic job (``spec.elastic``) against the rest of the spec.

An elastic job runs at any node count from minNodes to maxNodes, so what the
world-size rules check for the desired size must hold at every size in that
range. With ``dataParallelShard: -1`` the data-parallel degree is the one that
follows the nodes: the fixed degrees (dataParallelReplicate x tensor x
pipeline) must then divide the world at every node count n. Two consecutive
counts n and n + 1 both being multiples of ``fixed / gcd`` forces ``fixed`` to
divide processesPerNode itself (it divides their difference), and that in turn
is enough for every n: so the CEL needs no loop over the sizes.

Each rule is CEL over the spec (``self``) plus the same check in Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchfleet_operator.api.base import Rule
from torchfleet_operator.api.world import FIXED, PROCS, SHARD

if TYPE_CHECKING:
    from torchfleet_operator.api.v1alpha1 import TrainingJobSpec

# On an elastic pod no per-pod or per-process rank exists: each rendezvous round
# numbers the nodes that joined it, so a command cannot name these.
RANK_VARIABLES = ("$(RANK)", "$(WORLD_SIZE)", "$(NODE_RANK)", "$(LOCAL_RANK)")

_ELASTIC = "has(self.elastic)"
_RESIZES = f"{_ELASTIC} && self.elastic.minNodes < self.elastic.maxNodes"
_NODES = "(1 + self.worker.replicas)"


def _resizes(spec: TrainingJobSpec) -> bool:
    """True for an elastic job that may run at more than one size."""
    return spec.elastic is not None and spec.elastic.min_nodes < spec.elastic.max_nodes


def _size_within_bounds(spec: TrainingJobSpec) -> bool:
    elastic = spec.elastic
    return elastic is None or elastic.min_nodes <= spec.nodes <= elastic.max_nodes


def _no_rank_in_command(spec: TrainingJobSpec) -> bool:
    words = [*(spec.command or ()), *(spec.args or ())]
    return spec.elastic is None or not any(v in word for word in words for v in RANK_VARIABLES)


def _shard_follows_nodes(spec: TrainingJobSpec) -> bool:
    if not _resizes(spec) or spec.trainer is None:
        return True
    return spec.trainer.parallel.data_parallel_shard == -1


def _fixed_degrees_fit_a_node(spec: TrainingJobSpec) -> bool:
    if not _resizes(spec) or spec.trainer is None:
        return True
    parallel = spec.trainer.parallel
    fixed = parallel.data_parallel_replicate * parallel.tensor * parallel.pipeline
    return spec.resolved_processes_per_node % fixed == 0


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
    )
