"""Which kept log file a failure's condition and event name. Pure.

``torchfleet-train`` keeps every rank's stdout and stderr on the checkpoint
volume (contract.kept_log_file: ``logs/gen-<G>/round-<R>/rank-<rank>.log``),
so the lines of a rank that died outlive its pod. A gang restart deletes the
pods, and the failure's condition is where users look first: it names the file
of the pod that failed first, for its gang generation and the in-place round it
failed in. An elastic job's ranks change from round to round, and the operator
does not know the round a pod failed in: it names the generation's folder.
Nothing is named for a command of the user's own (its output is not kept), a
job without a checkpoint directory, or pods whose trainer container turns kept
logs off (TORCHFLEET_LOG_KEEP_GENERATIONS=0 in the role template's env).
"""

from __future__ import annotations

from typing import Any

from torchfleet_contract import pod as contract
from torchfleet_operator.api.v1alpha1 import TrainingJobSpec, trainer_and_sidecars
from torchfleet_operator.desired.pods import template_for


def logs_root(spec: TrainingJobSpec) -> str | None:
    """The checkpoint directory the trainer keeps logs under, as it resolves it."""
    if not spec.runs_trainer:
        return None
    own = spec.trainer.checkpoint.dir if spec.trainer is not None else None
    return own or (spec.checkpoint.mount_path if spec.checkpoint else None)


def keeps_logs(spec: TrainingJobSpec, node_rank: int) -> bool:
    """Whether the pod at ``node_rank`` keeps its output: not where its role
    template's trainer container sets TORCHFLEET_LOG_KEEP_GENERATIONS to 0 (a
    value from a reference, or one the trainer refuses, leaves it at the default)."""
    template = template_for(spec, node_rank)
    containers = (template.spec or {}).get("containers") if template else None
    trainer, _ = trainer_and_sidecars(containers or [])
    for var in trainer.get("env") or []:
        if var.get("name") == contract.LOG_KEEP_GENERATIONS:
            return _as_int(var.get("value")) != 0
    return True


def _as_int(value: Any) -> int | None:
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def pod_logs(spec: TrainingJobSpec, restart: int, round_: int, node_rank: int) -> str | None:
    """Where the ranks of the pod at ``node_rank`` kept their output, as a phrase."""
    root = logs_root(spec)
    if root is None or not keeps_logs(spec, node_rank):
        return None
    if spec.elastic is not None:
        folder = f"{root.rstrip('/')}/{contract.LOGS_SUBDIR}/gen-{restart}/"
        return f"the ranks' output is kept under {folder} on the checkpoint volume"
    processes = spec.resolved_processes_per_node
    first = node_rank * processes
    path = contract.kept_log_file(root, restart, round_, first)
    if processes == 1:
        return f"its output is kept in {path} on the checkpoint volume"
    last = contract.kept_log_file(root, restart, round_, first + processes - 1).rsplit("/", 1)[1]
    return f"its ranks' output is kept in {path} to {last} on the checkpoint volume"


def round_logs(spec: TrainingJobSpec, restart: int, round_: int) -> str | None:
    """Where every rank of the in-place round ``round_`` kept its output (an
    elastic job's: its generation's folder, as for one pod)."""
    root = logs_root(spec)
    if root is None or not (keeps_logs(spec, 0) or keeps_logs(spec, 1)):
        return None
    if spec.elastic is not None:
        return pod_logs(spec, restart, round_, 0)
    folder = contract.kept_log_file(root, restart, round_, 0).rsplit("/", 1)[0]
    return f"every rank's output of the round is kept under {folder}/ on the checkpoint volume"
