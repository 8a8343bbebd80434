"""spec.managedBy (KEP-4368's field, as a Job and a JobSet have it): whether
this operator runs the job at all. Pure.

A job another controller runs (Kueue's MultiKueue, or any other) is left
alone: no pods, Services, claims or PodGroups, and no status write, since the
other controller owns the status (MultiKueue mirrors a worker cluster's there)
and two writers would fight over it. Nothing is requeued either: the field is
immutable, so no later pass can find the job turned into this operator's.
Who runs it shows in ``kubectl get tj -o wide`` (the Managed-By column) and
in one event per job.

One exception, Kueue's rule for an external framework: for a job MultiKueue
runs, on the manager cluster, this operator is the job's integration and
creates its Workload (Kueue makes none for a kind it has no controller for);
Kueue admits it through the MultiKueue admission check, copies the job and
the Workload to a worker cluster, mirrors the worker's status into the job
here, and finishes the Workload when the worker's finishes. On the worker the
copy arrives without spec.managedBy, so that cluster's operator runs it
(under the copied Workload: policy/kueue.py). The job's status here is the
worker's copy, which cannot name the worker, so the operator says which
cluster runs it in an event on the job, once per dispatch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchfleet_operator.api import constants as c
from torchfleet_operator.api import reasons as r
from torchfleet_operator.api.v1alpha1 import TrainingJobSpec
from torchfleet_operator.observed import ObservedWorkload
from torchfleet_operator.planning import EventSpec, Pass, Plan, WorkloadPatch
from torchfleet_operator.policy import admission, kueue

THIS_OPERATOR = ("", c.MANAGED_BY_OPERATOR)


def manager_elsewhere(spec: Any) -> str | None:
    """The controller ``spec.managedBy`` names when it is not this operator;
    None when this operator runs the job (unset, empty or its own value).

    Read from the raw spec, before it is parsed: a job another controller runs
    gets no status from this operator, not even for a spec it cannot parse.
    """
    value = spec.get("managedBy") if isinstance(spec, dict) else None
    if not isinstance(value, str) or value in THIS_OPERATOR:
        return None
    return value


@dataclass(frozen=True)
class ManagerSide:
    """What a pass does for a job MultiKueue dispatches, on the manager cluster."""

    workload: dict[str, Any] | None = None  # the Workload to create
    workload_patches: tuple[WorkloadPatch, ...] = ()  # writes to the one it has
    events: tuple[EventSpec, ...] = ()  # which worker cluster runs it


def multikueue_workload(step: Pass, spec: TrainingJobSpec) -> ManagerSide:
    """What the operator does with the Workload of a job MultiKueue dispatches,
    on the manager cluster: the Workload to create (none when it has one, names
    no queue, or Kueue is not installed), the writes to the one it has (its
    activation for spec.suspend, its quota handed back once evicted), and the
    event naming the worker cluster it was dispatched to. Made as for a job
    this operator runs (its pod sets are what the worker's Kueue admits),
    owned by the job (MultiKueue finds its adapter by the Workload's
    controller). Evicted (a worker lost, preempted), it gets jobframework's
    eviction step: the job stopped (here it has no pods) and the quota handed
    back, so that Kueue queues it again and dispatches it anew; without that
    it stays evicted with its quota, dispatched nowhere."""
    view = step.observed.kueue
    queue = admission.kueue_queue(spec, step.labels)
    if queue is None or view is None or not view.installed:
        return ManagerSide()
    workload = view.workload
    if workload is None:
        if view.workload_priority_class and view.workload_priority is None:
            return ManagerSide()  # made once the class exists (its event wakes the job)
        return ManagerSide(
            workload=kueue.new_workload(step, spec, queue, view, step.config.trainer_image)
        )
    if workload.deleting:
        return ManagerSide()
    patches: list[WorkloadPatch] = []
    # spec.suspend as for a job this operator runs: the Workload deactivated
    # (Kueue evicts it, and MultiKueue removes the worker's copy once its
    # quota is handed back below), and activated again on resume, to be
    # dispatched anew.
    if spec.suspend and workload.active:
        patches.append(kueue.activation(workload, False))
    elif not spec.suspend and kueue.resumed_by_job(workload):
        patches.append(kueue.activation(workload, True))
    if workload.evicted and workload.has_reservation:
        patches.append(kueue.hand_back(step, workload))
    found = None if spec.suspend else dispatched(workload)
    return ManagerSide(workload_patches=tuple(patches), events=(found,) if found else ())


def dispatched(workload: ObservedWorkload) -> EventSpec | None:
    """The event naming the worker cluster the manager's Workload was admitted
    to (MultiKueue sets its status.clusterName), once per dispatch: its key is
    the cluster and the Workload's evictions so far (Kueue counts each in
    status.schedulingStats), and a job is dispatched again only after an
    eviction (a worker lost, a suspend), so each dispatch, even to the same
    cluster, has its own. Timestamps would not do: they have whole seconds,
    and a dispatch, a suspend and a resume can fit in one."""
    cluster = workload.cluster_name
    if cluster is None or not workload.admitted or workload.finished:
        return None
    return EventSpec(
        "Normal",
        r.EVENT_DISPATCHED,
        f"MultiKueue dispatched it to the worker cluster {cluster} (Workload "
        f"{workload.name}); the status here is that cluster's",
        once=True,
        key=f"{cluster}.{workload.evictions}",
    )


def left_alone(manager: str, side: ManagerSide | None = None) -> Plan:
    """The pass of a job ``manager`` runs: no status, nothing deleted or
    requeued, nothing created or written but MultiKueue's Workload (above);
    one event naming the manager, posted once per job, and for MultiKueue one
    per dispatch naming the worker cluster."""
    side = side or ManagerSide()
    if manager == c.MANAGED_BY_MULTIKUEUE:
        who = "Kueue's MultiKueue runs it on a worker cluster and mirrors its status here"
    else:
        who = f"{manager} runs it and owns its status"
    message = (
        f"spec.managedBy is {manager}: {who}; this operator creates no pods, Services, "
        "claims or PodGroups for it and never writes its status"
    )
    return Plan(
        managed_by=manager,
        create=[side.workload] if side.workload is not None else [],
        workload_patches=list(side.workload_patches),
        events=[EventSpec("Normal", r.EVENT_MANAGED_ELSEWHERE, message, once=True), *side.events],
    )
