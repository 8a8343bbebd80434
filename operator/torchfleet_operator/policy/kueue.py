"""The Kueue policy of one pass: a queued job's pods wait for its Workload's
admission, take the admitted placement (flavors and, with TAS, each pod's
domain), stop when evicted, and a finished job hands its quota back. A
suspended job deactivates its Workload; a job whose PodSets changed while its
Workload waited gets a new one. Pure.

What each state of the Workload means is admission.py's (read and decide on
Kueue's objects); this module applies it to the pass: the phase, the job's
mirrored conditions, the Workload to create, replace or patch, the pods to
delete.
"""

from __future__ import annotations

from typing import Any

from torchfleet_operator.api import constants as c
from torchfleet_operator.api import reasons as r
from torchfleet_operator.api.constants import KUEUE_PRIORITY_CLASS_LABEL
from torchfleet_operator.api.v1alpha1 import TrainingJobSpec
from torchfleet_operator.desired import names
from torchfleet_operator.desired import workload as workload_builder
from torchfleet_operator.desired.labels import NODE_RANK_LABEL, ROLE_LABEL
from torchfleet_operator.observed import KueueView, ObservedPod, ObservedWorkload
from torchfleet_operator.planning import Pass, WorkloadPatch
from torchfleet_operator.policy import admission
from torchfleet_operator.status import restarts


def gate(
    step: Pass, spec: TrainingJobSpec, queue: str, pods: list[ObservedPod], image: str
) -> dict[str, admission.PodSetInfo] | None:
    """None: this pass creates no pods (not admitted, evicted, no Workload yet);
    else the admitted placement per role, for the pods about to be created."""
    view = step.observed.kueue or KueueView(installed=False)
    live = [p for p in pods if not p.deleting]
    if not view.installed:
        if live:  # running before Kueue went away: not stopped for that
            return {}
        step.set_phase(c.PHASE_PENDING)
        step.set_condition(
            r.WORKLOAD_ADMITTED,
            False,
            r.REASON_KUEUE_MISSING,
            admission.kueue_missing_message(queue),
        )
        return None
    workload = _current_workload(step, spec, queue, view, image)
    if workload is None:
        return None
    if resumed_by_job(workload):
        # The job was resumed: its Workload goes back into the queue, in its place.
        _activate(step, workload, True)
    _mirror(step, workload)
    if workload.evicted and not _deactivated_while_waiting(workload, live):
        _evicted(step, workload, pods, live)
        return None
    if not workload.admitted:
        step.delete_pods(live)  # jobframework stops a job that runs unadmitted
        step.set_phase(c.PHASE_PENDING)
        step.set_condition(
            r.CONDITION_CREATED,
            False,
            r.REASON_WAITING_FOR_ADMISSION,
            f"waiting for Kueue to admit Workload {workload.name} from LocalQueue {queue}",
        )
        return None
    step.clear_condition(
        r.WORKLOAD_EVICTED, r.REASON_ADMITTED, f"Kueue admitted Workload {workload.name} again"
    )
    missing = admission.missing_flavors(workload, view.flavors)
    if missing:  # the ResourceFlavor informer has not caught up yet
        step.plan.wake_in(1.0)
        return None
    if admission.topology_pending(workload):  # Kueue writes it later; its watch wakes us
        _no_topology(step, f"Kueue has not assigned Workload {workload.name} a topology yet")
        return None
    try:
        return admission.pod_set_infos(workload, view.flavors)
    except ValueError as exc:  # Kueue's, not the job's: wait for a readable one
        _no_topology(step, f"Workload {workload.name}: {exc}")
        return None


def _current_workload(
    step: Pass, spec: TrainingJobSpec, queue: str, view: KueueView, image: str
) -> ObservedWorkload | None:
    """The job's Workload as it stands, or None while one is made: created when
    missing; replaced when the job's PodSets changed while it waited (no quota
    reserved: once admitted, it is what the gang runs on)."""
    workload = view.workload
    prebuilt = step.labels.get(c.KUEUE_PREBUILT_WORKLOAD_LABEL)
    if prebuilt:
        return _prebuilt(step, prebuilt, workload)
    wanted_class = view.workload_priority_class
    if workload is None and wanted_class and view.workload_priority is None:
        _mirror(step, None)
        step.set_phase(c.PHASE_PENDING)
        step.set_condition(
            r.CONDITION_CREATED,
            False,
            r.REASON_PRIORITY_CLASS_MISSING,
            f"the job's {KUEUE_PRIORITY_CLASS_LABEL} label names WorkloadPriorityClass "
            f"{wanted_class!r}, which does not exist",
        )
        return None
    if workload is None:
        step.plan.create.append(new_workload(step, spec, queue, view, image))
    elif workload.deleting:
        pass
    elif _stale(workload, step, spec, image):
        step.plan.workload_patches.append(
            WorkloadPatch(
                workload.name,
                {"apiVersion": workload.manifest.get("apiVersion", workload_builder.KUEUE_API)},
                delete_uid=str(workload.metadata.get("uid") or ""),
            )
        )
        step.set_condition(
            r.CONDITION_CREATED,
            False,
            r.REASON_WORKLOAD_REPLACED,
            f"the job's pod sets changed while Workload {workload.name} waited: "
            "it is replaced by a new one",
        )
    else:
        return workload
    _mirror(step, None)
    step.set_phase(c.PHASE_PENDING)
    return None


def new_workload(
    step: Pass, spec: TrainingJobSpec, queue: str, view: KueueView, image: str
) -> dict[str, Any]:
    """The job's Workload as this operator creates it (for a job it runs, or
    on MultiKueue's manager cluster for one MultiKueue runs: managed.py)."""
    wanted_class = view.workload_priority_class
    return workload_builder.workload(
        step.name,
        step.namespace,
        step.uid,
        spec,
        queue,
        view.workload_priority if wanted_class else view.priority,
        image,
        view.api_version,
        wanted_class,
    )


def _prebuilt(step: Pass, name: str, workload: ObservedWorkload | None) -> ObservedWorkload | None:
    """A job MultiKueue copied to this (worker) cluster runs under the Workload
    it copied beside it, named by the job's label: none is made or replaced
    here. It is taken over as jobframework does (the job its controller, the
    job's uid label), so it goes with the job."""
    if workload is None or workload.deleting:
        _mirror(step, None)
        step.set_phase(c.PHASE_PENDING)
        step.set_condition(
            r.CONDITION_CREATED,
            False,
            r.REASON_WAITING_FOR_ADMISSION,
            f"waiting for Workload {name}, which MultiKueue creates with the job",
        )
        return None
    if not _controlled_by_job(step, workload):
        step.plan.workload_patches.append(
            WorkloadPatch(
                workload.name,
                workload_builder.adoption(
                    step.name,
                    step.uid,
                    workload.manifest.get("apiVersion", workload_builder.KUEUE_API),
                ),
            )
        )
    return workload


def _controlled_by_job(step: Pass, workload: ObservedWorkload) -> bool:
    return any(
        ref.get("controller") and ref.get("uid") == step.uid
        for ref in workload.metadata.get("ownerReferences") or ()
    )


def _deactivated_while_waiting(workload: ObservedWorkload, live: list[ObservedPod]) -> bool:
    """Kueue marks every deactivated Workload Evicted, even one that never ran
    (a job suspended while it waited, now resumed): nothing to stop, it waits.
    One someone else deactivated still shows as evicted (Kueue's reason)."""
    reason = str((workload.condition(r.WORKLOAD_EVICTED) or {}).get("reason") or "")
    return (
        reason.startswith(r.WORKLOAD_DEACTIVATED)  # 0.10: also "DeactivatedDueTo<reason>"
        and (workload.active or bool(workload.annotation(workload_builder.SUSPENDED_ANNOTATION)))
        and not workload.has_reservation
        and not live
    )


def _stale(workload: ObservedWorkload, step: Pass, spec: TrainingJobSpec, image: str) -> bool:
    """The Workload no longer matches the job and may still be replaced. One
    without the hash (an older operator's) is kept as it is."""
    recorded = workload.annotation(workload_builder.POD_SETS_HASH_ANNOTATION)
    if recorded is None or workload.has_reservation:
        return False
    wanted = workload_builder.pod_sets(step.name, step.namespace, step.uid, spec, image)
    return recorded != workload_builder.pod_sets_hash(wanted)


def _activate(step: Pass, workload: ObservedWorkload, active: bool) -> None:
    step.plan.workload_patches.append(activation(workload, active))


def activation(workload: ObservedWorkload, active: bool) -> WorkloadPatch:
    """The write that (de)activates the Workload for the job's spec.suspend."""
    return WorkloadPatch(workload.name, workload_builder.activation(workload.manifest, active))


def resumed_by_job(workload: ObservedWorkload) -> bool:
    """Inactive because the job was suspended (not by someone else), and so
    the job's to activate again once it is resumed."""
    return not workload.active and bool(workload.annotation(workload_builder.SUSPENDED_ANNOTATION))


def suspended(
    step: Pass, spec: TrainingJobSpec, queue: str, pods: list[ObservedPod], image: str
) -> None:
    """A queued job suspended: its Workload is deactivated (kept, so it keeps its
    place: Kueue orders by creation time), and made inactive if it is new.
    Deactivated while admitted, Kueue evicts it; once the pods are gone the
    quota goes back, as jobframework hands back an evicted Workload's."""
    view = step.observed.kueue or KueueView(installed=False)
    if not view.installed:
        return
    workload = _current_workload(step, spec, queue, view, image)
    if workload is None:
        return
    if workload.active:
        _activate(step, workload, False)
    _mirror(step, workload)
    if workload.evicted and not pods and workload.has_reservation:
        _hand_back(step, workload)


def _hand_back(step: Pass, workload: ObservedWorkload) -> None:
    step.plan.workload_patches.append(hand_back(step, workload))


def hand_back(step: Pass, workload: ObservedWorkload) -> WorkloadPatch:
    """The write that drops an evicted Workload's admission (its job stopped)."""
    return WorkloadPatch(
        workload.name,
        admission.clear_reservation(workload, step.stamp),
        admission.ADMISSION_FIELD_MANAGER,
    )


def _no_topology(step: Pass, message: str) -> None:
    step.set_phase(c.PHASE_PENDING)
    step.set_condition(r.CONDITION_CREATED, False, r.REASON_WAITING_FOR_TOPOLOGY, message)


def _mirror(step: Pass, workload: ObservedWorkload | None) -> None:
    for type_, value, reason, message in admission.mirrored_conditions(workload):
        step.set_condition(type_, value, reason, message)


def _evicted(
    step: Pass,
    workload: ObservedWorkload,
    pods: list[ObservedPod],
    live: list[ObservedPod],
) -> None:
    """Stop the gang gracefully (SIGTERM, the trainer saves); once no pod is left,
    hand the quota back so that Kueue requeues the Workload. A disruption: it
    never counts toward backoffLimit."""
    evicted = workload.condition(r.WORKLOAD_EVICTED) or {}
    reason = str(evicted.get("reason") or r.WORKLOAD_EVICTED)
    message = f"evicted by Kueue: {evicted.get('message') or reason}"
    running = [p for p in live if not p.finished]
    if running and not step.is_true(r.WORKLOAD_EVICTED):
        restarts.count_failure(step.status, disruption=True)
    step.set_condition(r.WORKLOAD_EVICTED, True, reason, message)
    step.clear_condition(r.CONDITION_RUNNING, reason, message)
    step.set_condition(r.CONDITION_CREATED, False, reason, message)
    step.set_phase(c.PHASE_PENDING)
    step.delete_pods(live)
    if not pods and workload.has_reservation:
        _hand_back(step, workload)


def place(step: Pass, placement: dict[str, admission.PodSetInfo]) -> None:
    """Puts the admitted flavors' nodeSelector and tolerations (and, admitted by
    TAS, each pod's domain) on the pods to create."""
    step.plan.create = [
        admission.apply_pod_set_info(m, placement[role], _index_in_pod_set(m, role))
        if m["kind"] == "Pod" and (role := m["metadata"]["labels"].get(ROLE_LABEL, "")) in placement
        else m
        for m in step.plan.create
    ]


def _index_in_pod_set(pod: dict[str, Any], role: str) -> int:
    """The pod's place in its role's PodSet: the master is the master set's
    only pod, worker k (node rank k + 1) the worker set's k-th."""
    rank = int(pod["metadata"]["labels"][NODE_RANK_LABEL])
    return rank if role == names.MASTER_ROLE else rank - 1


def admitted_size(step: Pass, spec: TrainingJobSpec) -> TrainingJobSpec:
    """The job as its gang is made: an elastic job that Kueue admitted with fewer
    workers than it asked for (partial admission) runs those; the rest of the
    queue's room is another job's. The spec's size stays the desired one shown."""
    view = step.observed.kueue
    if spec.elastic is None or view is None or view.workload is None:
        return spec
    count = admission.admitted_count(view.workload, names.WORKER_ROLE)
    if count is None or count >= spec.worker.replicas:
        return spec
    count = max(count, workload_builder.min_workers(spec))  # never below minNodes
    worker = spec.worker.model_copy(update={"replicas": count})
    return spec.model_copy(update={"worker": worker})


def mark_finished(step: Pass, spec: TrainingJobSpec) -> None:
    """A finished job's Workload is marked Finished: Kueue releases its quota."""
    view = step.observed.kueue
    if admission.kueue_queue(spec, step.labels) is None or view is None:
        return
    workload = view.workload
    if workload is None or workload.finished or workload.deleting:
        return
    phase = step.phase
    found = step.condition(str(phase))
    step.plan.workload_patches.append(
        WorkloadPatch(
            workload.name,
            admission.mark_finished(
                workload,
                phase == c.PHASE_SUCCEEDED,
                (found.message if found else None) or f"the TrainingJob {phase}",
                step.stamp,
            ),
            admission.FINISHED_FIELD_MANAGER,
        )
    )
