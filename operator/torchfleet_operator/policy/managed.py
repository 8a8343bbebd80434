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
(under the copied Workload: policy/kueue.py).
"""

from __future__ import annotations

from typing import Any

from torchfleet_operator.api import constants as c
from torchfleet_operator.api import reasons as r
from torchfleet_operator.api.v1alpha1 import TrainingJobSpec
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


def multikueue_workload(
    step: Pass, spec: TrainingJobSpec
) -> tuple[dict[str, Any] | None, list[WorkloadPatch]]:
    """What the operator does with the Workload of a job MultiKueue dispatches,
    on the manager cluster: the Workload to create (None when it has one, names
    no queue, or Kueue is not installed), and the writes to the one it has.
    Made as for a job this operator runs (its pod sets are what the worker's
    Kueue admits), owned by the job (MultiKueue finds its adapter by the
    Workload's controller). Evicted (a worker lost, preempted), it gets
    jobframework's eviction step: the job stopped (here it has no pods) and
    the quota handed back, so that Kueue queues it again and dispatches it
    anew; without that it stays evicted with its quota, dispatched nowhere."""
    view = step.observed.kueue
    queue = admission.kueue_queue(spec, step.labels)
    if queue is None or view is None or not view.installed:
        return None, []
    workload = view.workload
    if workload is None:
        if view.workload_priority_class and view.workload_priority is None:
            return None, []  # made once the class exists (its event wakes the job)
        return kueue.new_workload(step, spec, queue, view, step.config.trainer_image), []
    if workload.evicted and workload.has_reservation and not workload.deleting:
        return None, [kueue.hand_back(step, workload)]
    return None, []


def left_alone(
    manager: str,
    workload: dict[str, Any] | None = None,
    workload_patches: list[WorkloadPatch] | None = None,
) -> Plan:
    """The pass of a job ``manager`` runs: no status, nothing deleted or
    requeued, nothing created or written but MultiKueue's Workload (above);
    one event naming the manager, posted once per job."""
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
        create=[workload] if workload is not None else [],
        workload_patches=list(workload_patches or ()),
        events=[EventSpec("Normal", r.EVENT_MANAGED_ELSEWHERE, message, once=True)],
    )
