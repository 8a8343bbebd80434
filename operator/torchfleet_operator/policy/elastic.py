"""The elastic policy: which lost pods are replaced alone, resizes, and when
an elastic job runs. Pure.

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
from typing import Any

from torchfleet_operator.api import constants as c
from torchfleet_operator.api import reasons as r
from torchfleet_operator.api.v1alpha1 import ElasticStatus, TrainingJobSpec
from torchfleet_operator.desired import names
from torchfleet_operator.observed import ObservedPod
from torchfleet_operator.planning import Pass
from torchfleet_operator.policy.failure import Failure
from torchfleet_operator.status import restarts
from torchfleet_operator.status.counts import running


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


def replaced_alone(spec: TrainingJobSpec, pod: ObservedPod) -> bool:
    return spec.elastic is not None and pod.role == names.WORKER_ROLE


def replace_lost_workers(
    step: Pass, spec: TrainingJobSpec, gang: list[ObservedPod], failures: list[Failure]
) -> list[Failure]:
    """Deletes (to recreate) the workers lost this pass, counted in status.elastic;
    returns the failures left for the gang (the master's, or not retryable). Past
    elastic.maxRestarts counted replacements the job fails."""
    assert spec.elastic is not None
    shown = step.status.elastic or ElasticStatus()
    decided = replace_workers(
        failures,
        names.master_pod_name(step.name),
        gang,
        still_replacing(shown.replacing or {}, gang),
        shown.replacements,
        shown.counted_replacements,
    )
    step.status.elastic = ElasticStatus.model_validate(_elastic_status(spec, gang, decided))
    limit = spec.elastic.max_restarts
    counted = [f for f in decided.new if not f.disruption]
    if restarts.limit_reached(decided.counted, limit) and counted:
        before = decided.counted - len(counted)
        step.finish(
            c.PHASE_FAILED,
            r.REASON_ELASTIC_RESTARTS_EXCEEDED,
            f"{counted[0].describe()}; elastic.maxRestarts {limit} reached "
            f"({before} worker replacements counted before)",
        )
        return []
    for failure in decided.new:
        step.event("Warning", r.EVENT_WORKER_REPLACED, f"replacing it alone: {failure.describe()}")
        step.plan.worker_replacements.append(failure.reason)
    step.delete_pods([p for p in gang if p.name in {f.pod for f in decided.new}])
    return decided.gang


def _elastic_status(
    spec: TrainingJobSpec, gang: list[ObservedPod], decided: Replacements
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "currentNodes": len(running(gang)),
        "desiredNodes": spec.nodes,
        "replacements": decided.replacements,
        "countedReplacements": decided.counted,
    }
    if decided.replacing:
        status["replacing"] = decided.replacing
    return status


def resize(step: Pass, spec: TrainingJobSpec, surplus_pods: list[ObservedPod]) -> None:
    """worker.replicas changed while an elastic job runs. Fewer: the workers past
    the new size are deleted with their grace period (their trainers save, the
    others' agents form a smaller world). More: the new ranks are created like
    any missing pod and join at the next rendezvous round."""
    expected = step.observed.expected_deleted
    leaving = [p for p in surplus_pods if not p.deleting and p.uid not in expected]
    step.delete_pods(leaving)
    if leaving:
        names_ = ", ".join(sorted(p.name for p in leaving))
        step.event(
            "Normal",
            r.EVENT_SCALED_DOWN,
            f"worker.replicas is {spec.worker.replicas}: deleting {names_}",
        )
    before = step.previous_size()
    if spec.elastic is not None and before is not None and before < spec.nodes:
        step.event(
            "Normal",
            r.EVENT_SCALED_UP,
            f"worker.replicas is {spec.worker.replicas}: "
            f"{spec.nodes - before} more pods join the running gang",
        )
