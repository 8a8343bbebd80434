"""An elastic job's failures: which pods are replaced alone, and when it runs. Pure.

In an elastic job (spec.elastic) every node's torchrun agent joins the c10d
rendezvous that the master's agent serves. A worker that fails or is taken
away leaves the survivors training (their agents re-form the world without
it); the operator only recreates that one pod, which joins at the next
rendezvous round. The master holds the rendezvous store: its loss, or a
failure that is not retryable, is handled as in a fixed gang (restart or fail).

``status.elastic.replacing`` maps each worker being replaced to the uid of the
pod it replaces ('' when that pod was already gone), so that a loss seen on
several passes (failed, then terminating, then missing) is counted once; the
entry goes when a pod of that name with another uid exists (the replacement).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from torchfleet_operator.api.v1alpha1 import TrainingJobSpec
from torchfleet_operator.observed import ObservedPod
from torchfleet_operator.policy.failure import Failure

# Failed reason when the counted replacements pass elastic.maxRestarts.
REASON_RESTARTS_EXCEEDED = "ElasticRestartsExceeded"


@dataclass(frozen=True)
class Replacements:
    """The decision on one pass's failures of an elastic job."""

    # Failures left to the gang's own handling (master lost, not retryable).
    gang: list[Failure]
    # Workers newly lost this pass, to delete and recreate.
    new: list[Failure] = field(default_factory=list)
    replacing: dict[str, str] = field(default_factory=dict)
    replacements: int = 0
    counted: int = 0


def still_replacing(replacing: Mapping[str, str], gang: Iterable[ObservedPod]) -> dict[str, str]:
    """``replacing`` without the workers whose replacement pod now exists."""
    uids = {pod.name: pod.uid for pod in gang}
    return {
        name: uid
        for name, uid in replacing.items()
        if name not in uids or (uid and uids[name] == uid)
    }


def replace_workers(
    failures: list[Failure],
    master: str,
    gang: Iterable[ObservedPod],
    replacing: Mapping[str, str],
    replacements: int,
    counted: int,
) -> Replacements:
    """Splits ``failures``: retryable worker losses are replaced alone; any other
    failure (the master's, or one that is not retryable) goes to the gang, and
    then nothing is replaced alone: the gang's handling takes every pod, and a
    restarted gang starts with nothing being replaced."""
    if not failures:
        return Replacements([], [], dict(replacing), replacements, counted)
    if any(not f.retryable or f.pod == master for f in failures):
        return Replacements(failures, [], {}, replacements, counted)
    uids = {pod.name: pod.uid for pod in gang}
    replacing = dict(replacing)
    new = []
    for failure in failures:
        uid = uids.get(failure.pod)
        if failure.pod in replacing and (uid is None or replacing[failure.pod] == uid):
            continue  # the same loss, seen again
        replacing[failure.pod] = uid or ""
        replacements += 1
        counted += 0 if failure.disruption else 1
        new.append(failure)
    return Replacements([], new, replacing, replacements, counted)


def surplus(spec: TrainingJobSpec, gang: Iterable[ObservedPod]) -> list[ObservedPod]:
    """The pods of an elastic job past its size: worker.replicas went down while
    it ran (a fixed gang's size cannot change while it runs)."""
    if spec.elastic is None:
        return []
    return [pod for pod in gang if pod.node_rank >= spec.nodes]


def runs(running: Iterable[ObservedPod], master: str, min_nodes: int) -> bool:
    """An elastic job trains while its master and at least minNodes pods run."""
    names = {pod.name for pod in running}
    return master in names and len(names) >= min_nodes
