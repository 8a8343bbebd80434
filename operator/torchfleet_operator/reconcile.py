"""plan = f(job, observed, now): what to create, delete and report. Pure.

One pass of the operator for one TrainingJob. The same function runs for
every trigger, and running it again on the same input gives the same plan,
which the executor turns into no-ops (409 on create, 404 on delete).

The gang's *generation* is the restart count: pods carry it in the
``torchfleet.dev/restart`` label. A restart bumps the generation in the status
and deletes the old generation's pods; the new generation is created once the
old pods are gone and the back-off has passed. The controller persists the
bump before it deletes anything, so a crash in between cannot lose a restart.

Full validation of the spec gates only the *first* gang. A job that already
had one keeps going from what its pods are when its stored spec stops parsing
(a stricter operator, a rollback under a newer CRD): it is never failed for
it, and a finished job keeps its phase and its TTL.

``after_execute`` is the second half of a pass: what the apiserver refused is
folded into the status there, so every status field is decided in this module.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from torchfleet_operator.api import constants as c
from torchfleet_operator.api.parse import InvalidSpecError, parse_training_job
from torchfleet_operator.api.v1alpha1 import TrainingJob, TrainingJobSpec
from torchfleet_operator.build import names, podgroup, pvc, security, service
from torchfleet_operator.build import workload as workload_builder
from torchfleet_operator.build.labels import ROLE_LABEL
from torchfleet_operator.build.pods import build_pod, pod_name_for_rank
from torchfleet_operator.config import OperatorConfig
from torchfleet_operator.observed import Observed, ObservedPod, parse_time, timestamp
from torchfleet_operator.policy import (
    admission,
    clean_pod,
    deadline,
    elastic,
    success,
    suspend,
    ttl,
)
from torchfleet_operator.policy.failure import (
    Failure,
    exit_is_retryable,
    first_failure,
    restart_backoff,
    settle_left,
)
from torchfleet_operator.status import conditions as cond
from torchfleet_operator.status import goodput
from torchfleet_operator.status import podgroup as podgroup_status
from torchfleet_operator.status import progress as progress_status
from torchfleet_operator.status.counts import nodes_ready, replica_statuses

FINISHED = (c.PHASE_SUCCEEDED, c.PHASE_FAILED)
# Condition types beyond the API's lifecycle ones.
CONDITION_CHILDREN = "ChildrenRejected"  # the apiserver refused a child; message is its own
# The stored spec no longer parses under this operator's models; the job goes on as is.
CONDITION_SPEC_NOT_UNDERSTOOD = "SpecNotUnderstood"
# False while a pod of the gang is unscheduled: the scheduler's reason and message.
CONDITION_SCHEDULED = "Scheduled"
# The apiserver found a pod invalid (400/422): creating it again fails the same way.
REASON_POD_INVALID = "PodInvalid"
# A child's name is held by an object this job does not control; it is not used.
REASON_NAME_CONFLICT = "NameConflict"
# Status keys the time accounting writes.
TIME_ACCOUNTING, ACCOUNTING_KEYS = goodput.TIME_ACCOUNTING, goodput.STATUS_KEYS
# Failed reasons that delete every pod whatever cleanPodPolicy says.
HOLDS_NOTHING = (
    "DeadlineExceeded",
    "BackoffLimitExceeded",
    elastic.REASON_RESTARTS_EXCEEDED,
    c.REASON_INVALID_SPEC,
)


@dataclass(frozen=True)
class ChildRef:
    kind: str
    name: str
    uid: str | None = None
    grace_period_seconds: int | None = None


@dataclass(frozen=True)
class EventSpec:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class WorkloadPatch:
    """A write to the job's Kueue Workload: a server-side apply of its status
    under ``field_manager``, or (field_manager None) a merge patch of the object."""

    name: str
    body: dict[str, Any]
    field_manager: str | None = None


@dataclass
class Plan:
    create: list[dict[str, Any]] = field(default_factory=list)
    # Pods the API server checks (server-side dry run) before any pod of a new
    # gang is created: what the CRD schema cannot (a mount naming no volume).
    dry_run: list[dict[str, Any]] = field(default_factory=list)
    delete: list[ChildRef] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[EventSpec] = field(default_factory=list)
    delete_job: bool = False
    requeue_after: float | None = None  # seconds until a time-based decision is due
    gang_restart: str | None = None  # reason, when this pass starts a restart
    workload_patches: list[WorkloadPatch] = field(default_factory=list)  # Kueue
    disruption: str | None = None  # reason, when that restart is a disruption (not counted)
    # Reasons of the elastic workers this pass replaces alone (one per pod).
    worker_replacements: list[str] = field(default_factory=list)

    def wake_in(self, seconds: float | None) -> None:
        if seconds is None:
            return
        seconds = max(seconds, 0.0)
        self.requeue_after = (
            seconds if self.requeue_after is None else min(self.requeue_after, seconds)
        )


def _without(status: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: value for key, value in status.items() if key not in keys}


def _gang_ended(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """This pass ends the gang: a restart, or a running gang suspended or evicted."""
    if int(new.get("restartCount") or 0) > int(old.get("restartCount") or 0):
        return True
    stopped = (c.PHASE_PENDING, c.PHASE_SUSPENDED, c.PHASE_RESTARTING)
    return old.get("phase") == c.PHASE_RUNNING and new.get("phase") in stopped


def validation_problem(body: dict[str, Any]) -> tuple[TrainingJob | None, str | None]:
    """The parsed job, or the problem with it naming the field."""
    try:
        job = parse_training_job(body)
    except InvalidSpecError as exc:
        # Every problem, each with the field path its rule blames.
        return None, str(exc)
    name = job.metadata.name or ""
    problem = names.name_problem(name, job.spec.worker.replicas)
    return (None, problem) if problem else (job, None)


class _Pass:
    """The state of one planning pass; methods are the steps of ``plan``."""

    def __init__(
        self,
        body: dict[str, Any],
        status: dict[str, Any],
        observed: Observed,
        now: datetime,
        config: OperatorConfig,
    ) -> None:
        meta = body["metadata"]
        self.name: str = meta["name"]
        self.namespace: str = meta["namespace"]
        self.uid: str = meta.get("uid", "")
        self.generation = meta.get("generation")
        self.labels: dict[str, str] = dict(meta.get("labels") or {})
        created = meta.get("creationTimestamp")
        self.created = parse_time(created)
        self.old_status = status
        self.status: dict[str, Any] = dict(status)
        self.observed = observed
        self.now = now
        self.stamp = timestamp(now)
        self.config = config
        self.plan = Plan()

    # ---- status helpers ----

    def set_condition(self, type_: str, value: bool, reason: str, message: str) -> None:
        self.status["conditions"] = cond.set_condition(
            self.status.get("conditions"), type_, value, reason, message, self.stamp
        )

    def clear_condition(self, type_: str, reason: str) -> None:
        self.status["conditions"] = cond.clear(
            self.status.get("conditions"), type_, reason, self.stamp
        )

    def finish(self, phase: str, reason: str, message: str) -> None:
        self.status["phase"] = phase
        self.status.setdefault("completionTime", self.stamp)
        self.set_condition(phase, True, reason, message)
        for other in (c.CONDITION_RUNNING, c.CONDITION_RESTARTING):
            self.clear_condition(other, reason)

    def delete_pods(self, pods: list[ObservedPod]) -> None:
        for pod in pods:
            if not pod.deleting:
                # Finished pods hold nothing: drop them at once (not one whose
                # sidecars still run: they get their grace period).
                grace = 0 if pod.finished and not pod.sidecars_running else None
                self.plan.delete.append(ChildRef("Pod", pod.name, pod.uid, grace))

    def finalize(self) -> Plan:
        if self.generation is not None:
            self.status["observedGeneration"] = self.generation
        self._account()
        old_phase = self.old_status.get("phase")
        new_phase = self.status.get("phase")
        if new_phase != old_phase and new_phase:
            self.plan.events.append(self._phase_event(new_phase))
        self.plan.status = self.status
        return self.plan

    def _account(self) -> None:
        """Ends a gang's progress and time accounting when this pass ends the gang,
        and advances the time accounting (status/goodput.py)."""
        old, new = self.old_status, self.status
        ended = _gang_ended(old, new)
        progress = new.get("progress") if isinstance(new.get("progress"), dict) else None
        checkpoint = (new.get("lastCheckpoint") or {}).get("step")
        checkpoint = checkpoint if isinstance(checkpoint, int) else None
        if ended:
            # The next gang resumes from the checkpoint: show that step at once,
            # not the old gang's last until the new master is scraped.
            reset = progress_status.resumed(progress, checkpoint, self.stamp)
            if reset is None:
                new.pop("progress", None)
            else:
                new["progress"] = reset
        accounted = goodput.account(
            old.get(TIME_ACCOUNTING),
            phase_before=old.get("phase"),
            phase_now=new.get("phase"),
            gang_ended=ended,
            progress=progress,
            checkpoint_step=checkpoint,
            now=self.now,
            created=self.created,
            status_changed=_without(new, ACCOUNTING_KEYS) != _without(old, ACCOUNTING_KEYS),
        )
        if accounted is None:
            return
        new[TIME_ACCOUNTING] = accounted
        fraction = goodput.goodput(accounted)
        if fraction is None:
            new.pop("goodput", None)
        else:
            new["goodput"] = fraction

    def _phase_event(self, phase: str) -> EventSpec:
        found = cond.find(self.status.get("conditions"), phase)
        message = (found or {}).get("message") or f"TrainingJob is {phase}"
        reason = (found or {}).get("reason") or phase
        warning = phase in (c.PHASE_FAILED, c.PHASE_RESTARTING)
        return EventSpec("Warning" if warning else "Normal", reason, message)


def plan(
    body: dict[str, Any],
    observed: Observed,
    now: datetime,
    config: OperatorConfig,
    status: dict[str, Any] | None = None,
    default_image: str = "torchfleet/trainer:latest",
    default_shm_size: str | None = None,
) -> Plan:
    """Decides one pass. ``status`` is the freshest known status (default: the body's)."""
    # Pods this operator already deleted count as terminating, even before the
    # watch says so: their names are not free yet, and they are not deleted twice.
    pods = tuple(
        dataclasses.replace(p, deleting=True) if p.uid in observed.expected_deleted else p
        for p in observed.pods
    )
    observed = dataclasses.replace(observed, pods=pods)
    step = _Pass(
        body, status if status is not None else body.get("status") or {}, observed, now, config
    )
    if body["metadata"].get("deletionTimestamp"):
        return Plan()  # the garbage collector takes the children with it
    job, problem = validation_problem(body)
    if job is None:
        raw_spec = body.get("spec")  # the API server's schema says an object; trust nothing
        return _not_understood(
            step, raw_spec if isinstance(raw_spec, dict) else {}, problem or "invalid spec"
        )
    step.clear_condition(CONDITION_SPEC_NOT_UNDERSTOOD, "Understood")
    if step.status.get("phase") in FINISHED:
        return _finished(step, job.spec)
    return _active(step, job.spec, default_image, default_shm_size)


# ---- Kueue: a queued job's pods wait for its Workload's admission (policy/admission.py) ----


def _kueue_gate(
    step: _Pass, spec: TrainingJobSpec, queue: str, pods: list[ObservedPod], image: str
) -> dict[str, admission.PodSetInfo] | None:
    """None: this pass creates no pods (not admitted, evicted, no Workload yet);
    else the admitted placement per role, for the pods about to be created."""
    view = step.observed.kueue or admission.KueueView(installed=False)
    live = [p for p in pods if not p.deleting]
    if not view.installed:
        if live:  # running before Kueue went away: not stopped for that
            return {}
        step.status["phase"] = c.PHASE_PENDING
        step.set_condition(
            admission.ADMITTED,
            False,
            admission.REASON_KUEUE_MISSING,
            admission.kueue_missing_message(queue),
        )
        return None
    workload = view.workload
    if workload is None or workload.deleting:
        if workload is None:
            step.plan.create.append(
                workload_builder.workload(
                    step.name, step.namespace, step.uid, spec, queue, view.priority, image
                )
            )
        _mirror(step, None)
        step.status["phase"] = c.PHASE_PENDING
        return None
    _mirror(step, workload)
    if workload.evicted:
        _evicted(step, workload, pods, live)
        return None
    if not workload.admitted:
        step.delete_pods(live)  # jobframework stops a job that runs unadmitted
        step.status["phase"] = c.PHASE_PENDING
        step.set_condition(
            c.CONDITION_CREATED,
            False,
            "WaitingForAdmission",
            f"waiting for Kueue to admit Workload {workload.name} from LocalQueue {queue}",
        )
        return None
    step.clear_condition(admission.EVICTED, "Admitted")
    missing = admission.missing_flavors(workload, view.flavors)
    if missing:  # the ResourceFlavor informer has not caught up yet
        step.plan.wake_in(1.0)
        return None
    return admission.pod_set_infos(workload, view.flavors)


def _mirror(step: _Pass, workload: admission.ObservedWorkload | None) -> None:
    for type_, value, reason, message in admission.mirrored_conditions(workload):
        step.set_condition(type_, value, reason, message)


def _evicted(
    step: _Pass,
    workload: admission.ObservedWorkload,
    pods: list[ObservedPod],
    live: list[ObservedPod],
) -> None:
    """Stop the gang gracefully (SIGTERM, the trainer saves); once no pod is left,
    hand the quota back so that Kueue requeues the Workload. A disruption: it
    never counts toward backoffLimit."""
    evicted = workload.condition(admission.EVICTED) or {}
    reason = str(evicted.get("reason") or "Evicted")
    message = f"evicted by Kueue: {evicted.get('message') or reason}"
    running = [p for p in live if not p.finished]
    if running and not cond.is_true(step.status.get("conditions"), admission.EVICTED):
        step.status["disruptions"] = int(step.status.get("disruptions") or 0) + 1
    step.set_condition(admission.EVICTED, True, reason, message)
    step.clear_condition(c.CONDITION_RUNNING, reason)
    step.set_condition(c.CONDITION_CREATED, False, reason, message)
    step.status["phase"] = c.PHASE_PENDING
    step.delete_pods(live)
    if not pods and workload.has_reservation:
        step.plan.workload_patches.append(
            WorkloadPatch(
                workload.name,
                admission.clear_reservation(workload, step.stamp),
                admission.ADMISSION_FIELD_MANAGER,
            )
        )


def _place(step: _Pass, placement: dict[str, admission.PodSetInfo]) -> None:
    """Puts the admitted flavors' nodeSelector and tolerations on the pods to create."""
    step.plan.create = [
        admission.apply_pod_set_info(m, placement[role])
        if m["kind"] == "Pod" and (role := m["metadata"]["labels"].get(ROLE_LABEL, "")) in placement
        else m
        for m in step.plan.create
    ]


def _kueue_finished(step: _Pass, spec: TrainingJobSpec) -> None:
    """A finished job's Workload is marked Finished: Kueue releases its quota."""
    view = step.observed.kueue
    if admission.kueue_queue(spec, step.labels) is None or view is None:
        return
    workload = view.workload
    if workload is None or workload.finished or workload.deleting:
        return
    phase = step.status.get("phase")
    found = cond.find(step.status.get("conditions"), str(phase)) or {}
    step.plan.workload_patches.append(
        WorkloadPatch(
            workload.name,
            admission.mark_finished(
                workload,
                phase == c.PHASE_SUCCEEDED,
                str(found.get("message") or f"the TrainingJob {phase}"),
                step.stamp,
            ),
            admission.FINISHED_FIELD_MANAGER,
        )
    )


def _had_gang(step: _Pass) -> bool:
    status = step.status
    return bool(step.observed.pods or status.get("startTime") or status.get("restartCount"))


def _not_understood(step: _Pass, raw_spec: dict[str, Any], problem: str) -> Plan:
    """A stored spec this operator cannot parse.

    Before the first gang it is an invalid spec (Failed). After, the job is
    left as it is: a finished job keeps its phase (and its TTL), a suspended
    one stays without pods, a running one keeps its pods; nothing is created,
    restarted or failed until the spec parses again.
    """
    phase = step.status.get("phase")
    if phase not in FINISHED and not _had_gang(step) and raw_spec.get("suspend") is not True:
        return _invalid(step, problem)
    failed = cond.find(step.status.get("conditions"), c.PHASE_FAILED) or {}
    if failed.get("reason") != c.REASON_INVALID_SPEC:  # that one already says it
        _report_not_understood(step, problem)
    if phase in FINISHED:
        _expire(step, _raw_ttl(raw_spec))
        return step.finalize()
    if raw_spec.get("suspend") is True:
        return _suspend(step, list(step.observed.pods))
    restart = int(step.status.get("restartCount") or 0)
    gang = [p for p in step.observed.pods if p.restart == restart]
    step.status["replicaStatuses"] = replica_statuses(gang)
    return step.finalize()


def _report_not_understood(step: _Pass, problem: str) -> None:
    message = (
        f"the stored spec does not parse under this operator ({problem}); the job "
        f"keeps its pods and phase, and nothing is created or restarted until it parses"
    )
    old = cond.find(step.old_status.get("conditions"), CONDITION_SPEC_NOT_UNDERSTOOD)
    if not old or old.get("status") != "True" or old.get("message") != message:
        step.plan.events.append(EventSpec("Warning", CONDITION_SPEC_NOT_UNDERSTOOD, message))
    step.set_condition(CONDITION_SPEC_NOT_UNDERSTOOD, True, "ParseError", message)


def _raw_ttl(raw_spec: dict[str, Any]) -> int | None:
    """ttlSecondsAfterFinished read without the models: it must fire whatever else changed."""
    run_policy = raw_spec.get("runPolicy")
    value = run_policy.get("ttlSecondsAfterFinished") if isinstance(run_policy, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _invalid(step: _Pass, problem: str) -> Plan:
    """A spec the CRD could not reject: Failed, no pods (and remove any made before)."""
    step.finish(c.PHASE_FAILED, c.REASON_INVALID_SPEC, problem)
    step.delete_pods([p for p in step.observed.pods if not p.finished])
    return step.finalize()


def _pod_refused_as_invalid(step: _Pass) -> str | None:
    """The apiserver's words when the last pass's pods were refused as invalid.

    Permanent, unlike quota or Pod Security (403): the same template fails the
    same way however often it is retried. Only for the generation it was
    refused for: a template fixed since gets its own try.
    """
    found = cond.find(step.status.get("conditions"), CONDITION_CHILDREN) or {}
    if found.get("status") != "True" or found.get("reason") != REASON_POD_INVALID:
        return None
    if step.old_status.get("observedGeneration") != step.generation:
        return None
    return f"the API server refused the pod template: {found.get('message')}"


def _finished(step: _Pass, spec: TrainingJobSpec) -> Plan:
    """Succeeded or Failed: clean the pods, then the TTL."""
    _kueue_finished(step, spec)
    failed = cond.find(step.status.get("conditions"), c.PHASE_FAILED) or {}
    holds_nothing = (
        step.status.get("phase") == c.PHASE_FAILED and failed.get("reason") in HOLDS_NOTHING
    )
    policy = "All" if holds_nothing else spec.run_policy.clean_pod_policy
    cleaned = clean_pod.pods_to_clean(policy, step.observed.pods)
    # A trainer that ended beside native sidecars: the pod would run for ever.
    cleaned += [p for p in step.observed.pods if p.sidecars_running and p not in cleaned]
    step.delete_pods(cleaned)
    _expire(step, spec.run_policy.ttl_seconds_after_finished)
    return step.finalize()


def _expire(step: _Pass, ttl_seconds: int | None) -> None:
    left = ttl.seconds_left(parse_time(step.status.get("completionTime")), ttl_seconds, step.now)
    if left is not None and left <= 0:
        step.plan.delete_job = True
    else:
        step.plan.wake_in(left)


def _active(
    step: _Pass, spec: TrainingJobSpec, default_image: str, default_shm_size: str | None
) -> Plan:
    pods = list(step.observed.pods)
    restart = max([int(step.status.get("restartCount") or 0), *(p.restart for p in pods)])
    step.status["restartCount"] = restart
    gang = [p for p in pods if p.restart == restart]
    stale = [p for p in pods if p.restart < restart]
    # An elastic job resized while it runs: the workers past its size leave.
    surplus = elastic.surplus(spec, gang)
    gang = [p for p in gang if p not in surplus]
    _count(step, gang, spec.nodes)
    _progress(step)

    if spec.suspend:
        return _suspend(step, pods)
    step.clear_condition(c.CONDITION_SUSPENDED, "Resumed")

    placement: dict[str, admission.PodSetInfo] = {}
    queue = admission.kueue_queue(spec, step.labels)
    if queue is not None:
        admitted = _kueue_gate(step, spec, queue, pods, default_image)
        if admitted is None:
            return step.finalize()  # queued: activeDeadlineSeconds does not run yet
        placement = admitted
    desired, spec = spec, _admitted_size(step, spec)
    _start_clock(step)

    left = deadline.seconds_left(
        parse_time(step.status.get("startTime")), spec.run_policy.active_deadline_seconds, step.now
    )
    if left is not None and left <= 0:
        step.finish(
            c.PHASE_FAILED,
            "DeadlineExceeded",
            f"the job ran longer than activeDeadlineSeconds "
            f"({spec.run_policy.active_deadline_seconds}s)",
        )
        return _finished(step, spec)
    step.plan.wake_in(left)

    refused = _pod_refused_as_invalid(step)
    if refused is not None:
        step.finish(c.PHASE_FAILED, c.REASON_INVALID_SPEC, refused)
        return _finished(step, spec)

    if success.succeeded(spec.run_policy.success_policy, gang, spec.nodes):
        step.finish(c.PHASE_SUCCEEDED, "Succeeded", _success_message(spec))
        if spec.runs_trainer:
            _progress_complete(step)
        return _finished(step, spec)

    failures = _failures(step, spec, gang, restart)
    if spec.elastic is not None:
        failures = _replace_lost_workers(step, desired, gang, failures)
        if step.status.get("phase") == c.PHASE_FAILED:
            return _finished(step, spec)
    if failures:
        return _on_failure(step, spec, gang, restart, failures)

    # The old generation must be gone before its names are reused.
    step.delete_pods(stale)
    _resize(step, desired, surplus)
    replaced = [p for p in gang if p.deleting and _replaced_alone(spec, p)]
    _force_delete_on_lost_nodes(step, replaced)
    leaving = replaced + surplus
    terminating = [p for p in pods if p.restart < restart or (p.deleting and p not in leaving)]
    if terminating:
        _waiting(step, restart, _why_waiting(step, terminating))
        return step.finalize()

    if _in_restart_backoff(step, restart):
        return step.finalize()

    try:
        _create_missing(step, spec, gang, restart, default_image, default_shm_size)
        _place(step, placement)
    except admission.ConflictError as exc:
        step.plan.create = []
        return _invalid(step, f"the admitted flavors cannot be applied: {exc}")
    except (TypeError, AttributeError, KeyError, ValueError) as exc:
        # The CRD keeps template.spec open; a shape the merge cannot use is the
        # user's error, reported like any other invalid spec.
        step.plan.create = []
        return _invalid(step, f"spec.master/worker.template.spec is not a usable PodSpec: {exc!r}")
    _phase_from_gang(step, spec, gang, desired.nodes)
    step.status = podgroup_status.mirror(
        step.status,
        spec.scheduling.pod_group,
        gang,
        podgroup.min_members(spec),
        step.observed.pod_group,
        step.stamp,
    )
    return step.finalize()


def _admitted_size(step: _Pass, spec: TrainingJobSpec) -> TrainingJobSpec:
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


def _suspend(step: _Pass, pods: list[ObservedPod]) -> Plan:
    step.delete_pods(suspend.pods_to_remove(True, pods))
    step.status["phase"] = c.PHASE_SUSPENDED
    step.set_condition(c.CONDITION_SUSPENDED, True, "Suspended", "the job is suspended")
    step.clear_condition(c.CONDITION_RUNNING, "Suspended")
    return step.finalize()


def _start_clock(step: _Pass) -> None:
    """startTime: the first unsuspended pass, and again at each resume (as the Job
    controller and PyTorchJob do), so activeDeadlineSeconds counts time allowed
    to run, including time spent unscheduled, but not time spent suspended."""
    if not step.status.get("startTime") or step.old_status.get("phase") == c.PHASE_SUSPENDED:
        step.status["startTime"] = step.stamp


def _count(step: _Pass, gang: list[ObservedPod], nodes: int) -> None:
    step.status["replicaStatuses"] = replica_statuses(gang)
    step.status["nodesReady"] = nodes_ready(gang, nodes)


# ---- elastic jobs: a lost worker is replaced alone (policy/elastic.py) ----


def _resize(step: _Pass, spec: TrainingJobSpec, surplus: list[ObservedPod]) -> None:
    """worker.replicas changed while an elastic job runs. Fewer: the workers past
    the new size are deleted with their grace period (their trainers save, the
    others' agents form a smaller world). More: the new ranks are created like
    any missing pod and join at the next rendezvous round."""
    expected = step.observed.expected_deleted
    leaving = [p for p in surplus if not p.deleting and p.uid not in expected]
    step.delete_pods(leaving)
    if leaving:
        names_ = ", ".join(sorted(p.name for p in leaving))
        step.plan.events.append(
            EventSpec(
                "Normal",
                "ScaledDown",
                f"worker.replicas is {spec.worker.replicas}: deleting {names_}",
            )
        )
    before = _previous_size(step)
    if spec.elastic is not None and before is not None and before < spec.nodes:
        step.plan.events.append(
            EventSpec(
                "Normal",
                "ScaledUp",
                f"worker.replicas is {spec.worker.replicas}: "
                f"{spec.nodes - before} more pods join the running gang",
            )
        )


def _previous_size(step: _Pass) -> int | None:
    """The desired size the last written status recorded (elastic jobs)."""
    shown = step.old_status.get("elastic")
    size = shown.get("desiredNodes") if isinstance(shown, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def _replaced_alone(spec: TrainingJobSpec, pod: ObservedPod) -> bool:
    return spec.elastic is not None and pod.role == names.WORKER_ROLE


def _replace_lost_workers(
    step: _Pass, spec: TrainingJobSpec, gang: list[ObservedPod], failures: list[Failure]
) -> list[Failure]:
    """Deletes (to recreate) the workers lost this pass, counted in status.elastic;
    returns the failures left for the gang (the master's, or not retryable). Past
    elastic.maxRestarts counted replacements the job fails."""
    assert spec.elastic is not None
    shown = step.status.get("elastic")
    shown = shown if isinstance(shown, dict) else {}
    decided = elastic.replace_workers(
        failures,
        names.master_pod_name(step.name),
        gang,
        elastic.still_replacing(_str_map(shown.get("replacing")), gang),
        _count_of(shown.get("replacements")),
        _count_of(shown.get("countedReplacements")),
    )
    step.status["elastic"] = _elastic_status(spec, gang, decided)
    limit = spec.elastic.max_restarts
    counted = [f for f in decided.new if not f.disruption]
    if decided.counted > limit and counted:
        before = decided.counted - len(counted)
        step.finish(
            c.PHASE_FAILED,
            elastic.REASON_RESTARTS_EXCEEDED,
            f"{counted[0].describe()}; elastic.maxRestarts {limit} reached "
            f"({before} worker replacements counted before)",
        )
        return []
    for failure in decided.new:
        step.plan.events.append(
            EventSpec("Warning", "WorkerReplaced", f"replacing it alone: {failure.describe()}")
        )
        step.plan.worker_replacements.append(failure.reason)
    step.delete_pods([p for p in gang if p.name in {f.pod for f in decided.new}])
    return decided.gang


def _elastic_status(
    spec: TrainingJobSpec, gang: list[ObservedPod], decided: elastic.Replacements
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "currentNodes": len(_running(gang)),
        "desiredNodes": spec.nodes,
        "replacements": decided.replacements,
        "countedReplacements": decided.counted,
    }
    if decided.replacing:
        status["replacing"] = decided.replacing
    return status


def _str_map(value: Any) -> dict[str, str]:
    """A status map read without trusting it: only string keys and values."""
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def _count_of(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _progress(step: _Pass) -> None:
    """The latest scrape into status.progress, unless it is the old gang's."""
    observed = step.observed
    shown = step.status.get("progress")
    shown = shown if isinstance(shown, dict) else None
    running = cond.find(step.status.get("conditions"), c.CONDITION_RUNNING) or {}
    since = running.get("lastTransitionTime") if running.get("status") == "True" else None
    if (
        observed.progress is not None
        and step.old_status.get("phase") == c.PHASE_RUNNING  # only a running gang is scraped
    ):
        if progress_status.is_current(observed.progress, shown, since):
            step.status["progress"] = observed.progress
        elif progress_status.waits_for_a_later_second(observed.progress, shown, step.now):
            step.plan.wake_in(1.0)  # by then the poller holds a scrape a second newer
    last = (step.status.get("lastCheckpoint") or {}).get("step")
    if observed.checkpoint_step is not None and observed.checkpoint_step != last:
        step.status["lastCheckpoint"] = {"step": observed.checkpoint_step, "time": step.stamp}


def _progress_complete(step: _Pass) -> None:
    """torchfleet-train exits 0 only after its last step (preempted, it exits
    143), so its success means every step ran, even when the last scrape of
    the master's /metrics came a few steps before the end."""
    progress = step.status.get("progress")
    if not progress or not progress.get("totalSteps"):
        return
    done = {k: v for k, v in progress.items() if k != "etaSeconds"}
    step.status["progress"] = done | {"step": progress["totalSteps"], "percent": 100}


def _success_message(spec: TrainingJobSpec) -> str:
    if spec.run_policy.success_policy == "AllWorkers":
        return "every pod of the gang exited 0"
    return "the master pod exited 0"


def _gang_was_complete(step: _Pass, restart: int) -> bool:
    """True once this generation was seen fully running: a missing pod now means lost."""
    return (
        step.old_status.get("phase") == c.PHASE_RUNNING
        and int(step.old_status.get("restartCount") or 0) == restart
    )


def _failures(
    step: _Pass, spec: TrainingJobSpec, gang: list[ObservedPod], restart: int
) -> list[Failure]:
    found: list[Failure] = []
    for pod in gang:
        if pod.phase == "Failed" or (pod.disrupted and not pod.finished):
            found.append(_pod_failure(pod, spec))
        elif pod.stuck_reason and not pod.deleting:
            _stuck_failure(step, pod, found)
        elif pod.node_name in step.observed.nodes_not_ready and not pod.finished:
            since = step.observed.nodes_not_ready[pod.node_name]
            waited = (step.now - since).total_seconds() if since else math.inf
            if waited >= step.config.node_lost_grace_seconds:
                found.append(
                    Failure(
                        pod.name,
                        "NodeLost",
                        None,
                        True,
                        f"node {pod.node_name} is NotReady",
                        disruption=True,
                    )
                )
            else:
                step.plan.wake_in(step.config.node_lost_grace_seconds - waited)
    if _gang_was_complete(step, restart):
        for pod in gang:
            # Deleted by someone else (a person, an eviction, the taint manager)
            # while the gang ran: it is lost, even before it is gone.
            if pod.deleting and not pod.finished and pod.uid not in step.observed.expected_deleted:
                found.append(
                    Failure(
                        pod.name,
                        "PodDeleted",
                        None,
                        True,
                        "the pod is being deleted while the gang was running",
                        disruption=True,
                    )
                )
        present = {p.name for p in gang} | step.observed.expected_created
        # Ranks an elastic job just grew by are new, not lost.
        known = min(spec.nodes, _previous_size(step) or spec.nodes)
        for rank in range(known):
            name = pod_name_for_rank(step.name, rank)
            if name not in present:
                found.append(
                    Failure(
                        name,
                        "PodDeleted",
                        None,
                        True,
                        "the pod disappeared while the gang was running",
                        disruption=True,
                    )
                )
    return found


def _stuck_failure(step: _Pass, pod: ObservedPod, found: list[Failure]) -> None:
    """A trainer that cannot start (image pull back-off) fails the gang past a bound."""
    bound = step.config.image_pull_bound_seconds
    since = pod.started_at or step.now
    waited = (step.now - since).total_seconds()
    if waited < bound:
        step.plan.wake_in(bound - waited)
        return
    message = f"{pod.stuck_message or 'the trainer container cannot start'} (for {waited:.0f}s)"
    found.append(Failure(pod.name, pod.stuck_reason or "ImagePullBackOff", None, True, message))


def _pod_failure(pod: ObservedPod, spec: TrainingJobSpec) -> Failure:
    """One failed (or taken) pod, classified (see policy/failure.py)."""
    if pod.disrupted:
        reason = pod.reason or "DisruptionTarget"
        return Failure(
            pod.name, reason, pod.exit_code, True, pod.message or "", True, pod.finished_at
        )
    if pod.never_started:
        reason = pod.reason or "NeverStarted"
        message = pod.message or "no container of the pod ever started"
        return Failure(pod.name, reason, None, True, message, finished_at=pod.finished_at)
    policy = spec.run_policy
    retryable = exit_is_retryable(
        policy.restart_policy,
        pod.exit_code,
        policy.retryable_exit_codes or (),
        policy.permanent_exit_codes or (),
    )
    return Failure(
        pod.name, "PodFailed", pod.exit_code, retryable, pod.message or "", False, pod.finished_at
    )


def _on_failure(
    step: _Pass,
    spec: TrainingJobSpec,
    gang: list[ObservedPod],
    restart: int,
    failures: list[Failure],
) -> Plan:
    policy = spec.run_policy
    first = first_failure(failures)
    if not first.retryable:
        left = settle_left(failures, step.now, step.config.failure_settle_seconds)
        if left > 0 and not all(p.finished for p in gang):
            # Ending the job is final: first hear from the peers (the module
            # docstring of policy/failure.py says why).
            step.plan.wake_in(left)
            return step.finalize()
        step.finish(
            c.PHASE_FAILED,
            "PodFailedPermanently",
            f"{first.describe()}; not retryable under restartPolicy {policy.restart_policy}",
        )
        return _finished(step, spec)
    disruptions = int(step.status.get("disruptions") or 0)
    counted = _counted_restarts(step.status, restart)
    if not first.disruption and counted >= policy.backoff_limit:
        step.finish(
            c.PHASE_FAILED,
            "BackoffLimitExceeded",
            f"{first.describe()}; backoffLimit {policy.backoff_limit} reached "
            f"after {counted} counted restarts ({disruptions} disruptions not counted)",
        )
        return _finished(step, spec)
    # Restart the whole gang: bump the generation, delete every pod of this one.
    if first.disruption:
        step.status["disruptions"] = disruptions + 1
        step.plan.disruption = first.reason
        counted_text = "a disruption, not counted toward backoffLimit"
    else:
        counted_text = f"{counted + 1} of backoffLimit {policy.backoff_limit}"
        counted += 1
    step.status["countedRestarts"] = counted
    step.status["restartCount"] = restart + 1
    step.status["phase"] = c.PHASE_RESTARTING
    # A fresh transition time: the back-off of this restart counts from now.
    step.status["conditions"] = [
        x for x in step.status.get("conditions") or () if x.get("type") != c.CONDITION_RESTARTING
    ]
    step.set_condition(
        c.CONDITION_RESTARTING,
        True,
        first.reason,
        f"restart {restart + 1} ({counted_text}): {first.describe()}",
    )
    step.clear_condition(c.CONDITION_RUNNING, first.reason)
    step.delete_pods(gang)
    step.plan.gang_restart = first.reason
    step.plan.wake_in(_backoff(step, restart))
    return step.finalize()


def _counted_restarts(status: dict[str, Any], restart: int) -> int:
    """Restarts that count toward backoffLimit (the program's own failures).

    Stored once known; a status written before the field existed derives it:
    every restart that was not a disruption. A Kueue eviction is a disruption
    that restarts nothing, so the derivation is clamped at 0.
    """
    stored = status.get("countedRestarts")
    if isinstance(stored, int) and not isinstance(stored, bool) and stored >= 0:
        return stored
    return max(0, restart - int(status.get("disruptions") or 0))


def _backoff(step: _Pass, restarts_before: int) -> float:
    return restart_backoff(
        restarts_before,
        step.config.restart_backoff_seconds,
        step.config.restart_backoff_max_seconds,
    )


def _in_restart_backoff(step: _Pass, restart: int) -> bool:
    """While Restarting, gang ``restart`` starts only after the back-off."""
    restarting = cond.find(step.status.get("conditions"), c.CONDITION_RESTARTING)
    if restart == 0 or not restarting or restarting.get("status") != "True":
        return False
    since = parse_time(restarting.get("lastTransitionTime"))
    if since is None:
        return False
    left = _backoff(step, restart - 1) - (step.now - since).total_seconds()
    if left > 0:
        step.status["phase"] = c.PHASE_RESTARTING
        step.plan.wake_in(left)
        return True
    return False


def _lost_for(step: _Pass, pod: ObservedPod) -> float | None:
    """Seconds since ``pod``'s node was lost (inf: out of service); None: it is not."""
    if pod.node_name not in step.observed.nodes_not_ready:
        return None
    since = step.observed.nodes_not_ready[pod.node_name]
    return math.inf if since is None else (step.now - since).total_seconds()


def _force_delete_on_lost_nodes(step: _Pass, terminating: list[ObservedPod]) -> list[ObservedPod]:
    """Force-deletes terminating pods whose node has been lost past the grace (a
    dead kubelet never confirms their deletion); returns those on lost nodes."""
    grace = step.config.node_loss_force_delete_seconds
    on_lost_nodes = []
    for pod in terminating:
        lost = _lost_for(step, pod)
        if lost is None:
            continue
        on_lost_nodes.append(pod)
        if lost >= grace:
            step.plan.delete.append(ChildRef("Pod", pod.name, pod.uid, 0))
        else:
            step.plan.wake_in(grace - lost)
    return on_lost_nodes


def _why_waiting(step: _Pass, terminating: list[ObservedPod]) -> str:
    """Force-deletes terminating pods on lost nodes, and says what the gang waits for."""
    grace = step.config.node_loss_force_delete_seconds
    on_lost_nodes = _force_delete_on_lost_nodes(step, terminating)
    if not on_lost_nodes:
        return "waiting for the previous gang's pods to terminate"
    names = ", ".join(f"{p.name} (node {p.node_name})" for p in on_lost_nodes[:5])
    return (
        f"waiting for the previous gang's pods to terminate; on lost nodes: {names}; "
        f"force-deleted {grace:g}s after the node was lost"
    )


def _waiting(step: _Pass, restart: int, why: str) -> None:
    if step.status.get("phase") not in (c.PHASE_RESTARTING,):
        step.status["phase"] = c.PHASE_RESTARTING if restart else c.PHASE_PENDING
    step.set_condition(c.CONDITION_CREATED, False, "Waiting", why)


def _create_missing(
    step: _Pass,
    spec: TrainingJobSpec,
    gang: list[ObservedPod],
    restart: int,
    image: str,
    shm_size: str | None,
) -> None:
    observed = step.observed
    plan_create = step.plan.create
    if not observed.has_service:
        step.plan.create.append(service.headless_service(step.name, step.namespace, step.uid))
    template = spec.checkpoint.claim_template if spec.checkpoint else None
    if template is not None and not observed.has_checkpoint_claim:
        step.plan.create.append(pvc.checkpoint_claim(step.name, step.namespace, step.uid, template))
    # Pods the apiserver refused a moment ago wait for their back-off.
    skip = {p.name for p in gang} | observed.expected_created | observed.held
    pods = [
        build_pod(step.name, step.namespace, step.uid, spec, rank, restart, image, shm_size)
        for rank in range(spec.nodes)
        if pod_name_for_rank(step.name, rank) not in skip
    ]
    # The PodGroup is not watched (its CRD may not exist): it is posted with
    # every batch of pods that need it, and a 409 means it is there. So a group
    # deleted by hand is back before the next gang is scheduled.
    group = podgroup.pod_group(step.name, step.namespace, step.uid, spec)
    if group is not None and pods:
        plan_create.append(group)
    plan_create.extend(pods)
    # So does a refused service, claim or PodGroup, and the pods with it (they
    # depend on it).
    waiting = [m for m in plan_create if m["metadata"]["name"] in observed.held]
    blocked = any(m["kind"] != "Pod" for m in waiting)
    step.plan.create = [
        m
        for m in plan_create
        if m["metadata"]["name"] not in observed.held and not (blocked and m["kind"] == "Pod")
    ]
    to_create = [m for m in step.plan.create if m["kind"] == "Pod"]
    step.plan.dry_run = _dry_run_for_new_gang(step.name, spec, to_create)


def _dry_run_for_new_gang(
    job: str, spec: TrainingJobSpec, pods: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """What a new gang (its master among ``pods``) has checked before any pod exists.

    The executor creates a new gang's master alone first: the API server's
    verdict on it is the check for its role, and a refusal creates nothing else.
    A worker is dry-run first only when its template is not the master's (the
    rest of a pod is the operator's own, the same for both roles), so the usual
    gang, one template for both, costs no extra request and no extra round trip.
    """
    new_gang = bool(pods) and pods[0]["metadata"]["name"] == pod_name_for_rank(job, 0)
    if not new_gang or len(pods) < 2 or spec.worker.template == spec.master.template:
        return []
    return [pods[1]]


def _running(gang: list[ObservedPod]) -> list[ObservedPod]:
    # Under AllWorkers a pod that already exited 0 still counts as part of a running gang.
    return [p for p in gang if p.phase in ("Running", "Succeeded") and not p.deleting]


def _phase_from_gang(
    step: _Pass, spec: TrainingJobSpec, gang: list[ObservedPod], desired: int
) -> None:
    """Phase and the Created/Running conditions from the gang; ``desired`` is the
    spec's size, more than ``spec.nodes`` when Kueue admitted an elastic job
    partially."""
    nodes = spec.nodes
    running = len(_running(gang))
    created = len({p.name for p in gang} | step.observed.expected_created)
    if created >= nodes:
        step.set_condition(
            c.CONDITION_CREATED,
            True,
            "GangCreated",
            f"all {nodes} pods of gang {step.status['restartCount']} exist",
        )
    _scheduling(step, gang)
    if spec.elastic is not None:
        trains = elastic.runs(
            _running(gang), names.master_pod_name(step.name), spec.elastic.min_nodes
        )
        message = (
            f"{running} of {nodes} pods are running, the master among them "
            f"(elastic: at least {spec.elastic.min_nodes})"
        )
        if desired > nodes:
            message += f"; Kueue admitted {nodes} of the {desired} pods asked for"
        if not trains and cond.is_true(step.status.get("conditions"), c.CONDITION_RUNNING):
            # It shrank below minNodes (or lost its master): the agents wait for
            # enough nodes to rendezvous, nothing trains meanwhile.
            step.set_condition(
                c.CONDITION_RUNNING,
                False,
                "BelowMinNodes",
                f"{running} of {nodes} pods are running; an elastic job trains with at least "
                f"{spec.elastic.min_nodes}, the master among them",
            )
    else:
        trains, message = running == nodes, f"all {nodes} pods are running"
    if trains:
        step.status["phase"] = c.PHASE_RUNNING
        step.set_condition(c.CONDITION_RUNNING, True, "GangRunning", message)
        step.clear_condition(c.CONDITION_RESTARTING, "GangRunning")
    elif step.status.get("phase") not in (c.PHASE_RESTARTING,) or not cond.is_true(
        step.status.get("conditions"), c.CONDITION_RESTARTING
    ):
        step.status["phase"] = c.PHASE_PENDING


def _scheduling(step: _Pass, gang: list[ObservedPod]) -> None:
    """Why a gang waits: the scheduler's words for its first unscheduled pod."""
    waiting = sorted(
        (p for p in gang if p.unschedulable and not p.deleting), key=lambda p: p.node_rank
    )
    if waiting:
        first = waiting[0]
        more = f" (and {len(waiting) - 1} more pods)" if len(waiting) > 1 else ""
        reason, _, message = first.unschedulable.partition(": ")  # type: ignore[union-attr]
        step.set_condition(CONDITION_SCHEDULED, False, reason, f"pod {first.name}: {message}{more}")
    elif cond.find(step.status.get("conditions"), CONDITION_SCHEDULED) is not None:
        step.set_condition(CONDITION_SCHEDULED, True, "GangScheduled", "every pod is scheduled")


def after_execute(
    status: dict[str, Any],
    previous: dict[str, Any],
    rejected: list[tuple[str, str, int, str]],
    still_held: bool,
    now: datetime,
) -> dict[str, Any]:
    """The status once the plan ran: the plan's, plus what the apiserver refused.

    ``rejected`` are this pass's refusals (kind, name, code, message);
    ``still_held`` says whether children refused earlier still wait for their
    back-off, in which case the earlier refusal still stands.
    """
    if rejected or not still_held:
        return with_rejections(status, rejected, now)
    return keep_condition(status, previous, CONDITION_CHILDREN)


def with_rejections(
    status: dict[str, Any], rejected: list[tuple[str, str, int, str]], now: datetime
) -> dict[str, Any]:
    """Adds the apiserver's refusals (kind, name, code, message) as a condition.

    A missing PodGroup CRD gets its own reason so that the fix is obvious.
    """
    status = dict(status)
    stamp = timestamp(now)
    if not rejected:
        status["conditions"] = cond.clear(
            status.get("conditions"), CONDITION_CHILDREN, "Accepted", stamp
        )
        return status
    # An invalid pod first: it decides the job's fate (see _pod_refused_as_invalid).
    rejected = sorted(rejected, key=lambda r: not (r[0] == "Pod" and r[2] in (400, 422)))
    kind, name, code, message = rejected[0]
    reason = "CreateRejected"
    if kind == "Pod" and code in (400, 422):
        reason = REASON_POD_INVALID
    elif code == 409:  # the executor reports only another owner's object as 409
        reason = REASON_NAME_CONFLICT
    elif kind == "PodGroup" and code == 404:
        reason = "PodGroupCRDMissing"
        message = (
            f"the PodGroup CRD for spec.scheduling.podGroup is not installed in this "
            f"cluster ({message}); install the scheduler or set podGroup None"
        )
    refusal = security.describe_refusal(message)
    if refusal is not None:
        reason, message = security.POD_SECURITY_REASON, refusal
    text = f"{kind} {name}: {message}"
    if len(rejected) > 1:
        text += f" (and {len(rejected) - 1} more)"
    status["conditions"] = cond.set_condition(
        status.get("conditions"), CONDITION_CHILDREN, True, reason, text, stamp
    )
    return status


def keep_condition(status: dict[str, Any], previous: dict[str, Any], type_: str) -> dict[str, Any]:
    """``status`` with condition ``type_`` as it was in ``previous`` (or absent)."""
    kept = cond.find(previous.get("conditions"), type_)
    conditions = [c for c in status.get("conditions") or () if c.get("type") != type_]
    if kept is not None:
        conditions = sorted([*conditions, kept], key=lambda c: str(c.get("type")))
    return {**status, "conditions": conditions}
