"""plan = f(job, observed, now): what to create, delete and report. Pure.

One pass of the operator for one TrainingJob. The same function runs for
every trigger, and running it again on the same input gives the same plan,
which the executor turns into no-ops (409 on create, 404 on delete).

The gang's *generation* is the restart count: pods carry it in the
``torchfleet.dev/restart`` label. A restart bumps the generation in the status
and deletes the old generation's pods; the new generation is created once the
old pods are gone and the back-off has passed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from torchfleet_operator.api import constants as c
from torchfleet_operator.api.parse import InvalidSpecError, parse_training_job
from torchfleet_operator.api.v1alpha1 import TrainingJob, TrainingJobSpec
from torchfleet_operator.build import names, podgroup, pvc, service
from torchfleet_operator.build.pods import build_pod, pod_name_for_rank
from torchfleet_operator.config import OperatorConfig
from torchfleet_operator.observed import Observed, ObservedPod, parse_time
from torchfleet_operator.policy import clean_pod, deadline, success, suspend, ttl
from torchfleet_operator.policy.failure import Failure, exit_is_retryable, restart_backoff
from torchfleet_operator.status import conditions as cond
from torchfleet_operator.status.counts import nodes_ready, replica_statuses

FINISHED = (c.PHASE_SUCCEEDED, c.PHASE_FAILED)
# Condition types beyond the API's lifecycle ones.
CONDITION_CHILDREN = "ChildrenRejected"  # the apiserver refused a child; message is its own


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


@dataclass
class Plan:
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[ChildRef] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[EventSpec] = field(default_factory=list)
    delete_job: bool = False
    requeue_after: float | None = None  # seconds until a time-based decision is due
    gang_restart: str | None = None  # reason, when this pass starts a restart

    def wake_in(self, seconds: float | None) -> None:
        if seconds is None:
            return
        seconds = max(seconds, 0.0)
        self.requeue_after = (
            seconds if self.requeue_after is None else min(self.requeue_after, seconds)
        )


def timestamp(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
                # Finished pods hold nothing: drop them at once.
                grace = 0 if pod.finished else None
                self.plan.delete.append(ChildRef("Pod", pod.name, pod.uid, grace))

    def finalize(self) -> Plan:
        if self.generation is not None:
            self.status["observedGeneration"] = self.generation
        old_phase = self.old_status.get("phase")
        new_phase = self.status.get("phase")
        if new_phase != old_phase and new_phase:
            self.plan.events.append(self._phase_event(new_phase))
        self.plan.status = self.status
        return self.plan

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
    step = _Pass(
        body, status if status is not None else body.get("status") or {}, observed, now, config
    )
    if body["metadata"].get("deletionTimestamp"):
        return Plan()  # the garbage collector takes the children with it
    job, problem = validation_problem(body)
    if job is None:
        return _invalid(step, problem or "invalid spec")
    if step.status.get("phase") in FINISHED:
        return _finished(step, job.spec)
    return _active(step, job.spec, default_image, default_shm_size)


def _invalid(step: _Pass, problem: str) -> Plan:
    """A spec the CRD could not reject: Failed, no pods (and remove any made before)."""
    step.finish(c.PHASE_FAILED, c.REASON_INVALID_SPEC, problem)
    step.delete_pods([p for p in step.observed.pods if not p.finished])
    return step.finalize()


def _finished(step: _Pass, spec: TrainingJobSpec) -> Plan:
    """Succeeded or Failed: apply cleanPodPolicy, then the TTL."""
    step.delete_pods(clean_pod.pods_to_clean(spec.run_policy.clean_pod_policy, step.observed.pods))
    left = ttl.seconds_left(
        parse_time(step.status.get("completionTime")),
        spec.run_policy.ttl_seconds_after_finished,
        step.now,
    )
    if left is not None and left <= 0:
        step.plan.delete_job = True
    else:
        step.plan.wake_in(left)
    return step.finalize()


def _active(
    step: _Pass, spec: TrainingJobSpec, default_image: str, default_shm_size: str | None
) -> Plan:
    # Pods this operator already deleted count as terminating, even before the
    # watch says so: their names are not free yet.
    pods = [
        dataclasses.replace(p, deleting=True) if p.uid in step.observed.expected_deleted else p
        for p in step.observed.pods
    ]
    restart = max([int(step.status.get("restartCount") or 0), *(p.restart for p in pods)])
    step.status["restartCount"] = restart
    gang = [p for p in pods if p.restart == restart]
    stale = [p for p in pods if p.restart < restart]
    _count(step, gang, spec.nodes)
    _progress(step)

    if spec.suspend:
        step.delete_pods(suspend.pods_to_remove(True, pods))
        step.status["phase"] = c.PHASE_SUSPENDED
        step.set_condition(c.CONDITION_SUSPENDED, True, "Suspended", "the job is suspended")
        step.clear_condition(c.CONDITION_RUNNING, "Suspended")
        return step.finalize()
    step.clear_condition(c.CONDITION_SUSPENDED, "Resumed")

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

    if success.succeeded(spec.run_policy.success_policy, gang, spec.nodes):
        step.finish(c.PHASE_SUCCEEDED, "Succeeded", _success_message(spec))
        if spec.runs_trainer:
            _progress_complete(step)
        return _finished(step, spec)

    failures = _failures(step, spec, gang, restart)
    if failures:
        return _on_failure(step, spec, gang, restart, failures)

    # The old generation must be gone before its names are reused.
    step.delete_pods(stale)
    if any(p for p in pods if p.restart < restart or p.deleting):
        _waiting(step, restart, "waiting for the previous gang's pods to terminate")
        return step.finalize()

    if _in_restart_backoff(step, restart):
        return step.finalize()

    try:
        _create_missing(step, spec, gang, restart, default_image, default_shm_size)
    except (TypeError, AttributeError, KeyError, ValueError) as exc:
        # The CRD keeps template.spec open; a shape the merge cannot use is the
        # user's error, reported like any other invalid spec.
        step.plan.create = []
        return _invalid(step, f"spec.master/worker.template.spec is not a usable PodSpec: {exc!r}")
    _phase_from_gang(step, gang, spec.nodes)
    return step.finalize()


def _count(step: _Pass, gang: list[ObservedPod], nodes: int) -> None:
    step.status["replicaStatuses"] = replica_statuses(gang)
    step.status["nodesReady"] = nodes_ready(gang, nodes)


def _progress(step: _Pass) -> None:
    observed = step.observed
    if observed.progress is not None:
        step.status["progress"] = observed.progress
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
    policy = spec.run_policy
    found: list[Failure] = []
    for pod in gang:
        if pod.phase == "Failed" or (pod.disrupted and not pod.finished):
            retryable = pod.disrupted or exit_is_retryable(
                policy.restart_policy,
                pod.exit_code,
                policy.retryable_exit_codes or (),
                policy.permanent_exit_codes or (),
            )
            reason = pod.reason if pod.disrupted and pod.reason else "PodFailed"
            found.append(Failure(pod.name, reason, pod.exit_code, retryable, pod.message or ""))
        elif pod.node_name in step.observed.nodes_not_ready and not pod.finished:
            since = step.observed.nodes_not_ready[pod.node_name]
            waited = (step.now - since).total_seconds() if since else math.inf
            if waited >= step.config.node_lost_grace_seconds:
                found.append(
                    Failure(pod.name, "NodeLost", None, True, f"node {pod.node_name} is NotReady")
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
                    )
                )
        present = {p.name for p in gang} | step.observed.expected_created
        for rank in range(spec.nodes):
            name = pod_name_for_rank(step.name, rank)
            if name not in present:
                found.append(
                    Failure(
                        name,
                        "PodDeleted",
                        None,
                        True,
                        "the pod disappeared while the gang was running",
                    )
                )
    return found


def _on_failure(
    step: _Pass,
    spec: TrainingJobSpec,
    gang: list[ObservedPod],
    restart: int,
    failures: list[Failure],
) -> Plan:
    policy = spec.run_policy
    permanent = next((f for f in failures if not f.retryable), None)
    if permanent is not None:
        step.finish(
            c.PHASE_FAILED,
            "PodFailedPermanently",
            f"{permanent.describe()}; not retryable under restartPolicy {policy.restart_policy}",
        )
        return _finished(step, spec)
    first = failures[0]
    if restart >= policy.backoff_limit:
        step.finish(
            c.PHASE_FAILED,
            "BackoffLimitExceeded",
            f"{first.describe()}; backoffLimit {policy.backoff_limit} reached "
            f"after {restart} restarts",
        )
        return _finished(step, spec)
    # Restart the whole gang: bump the generation, delete every pod of this one.
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
        f"restart {restart + 1} of {policy.backoff_limit}: {first.describe()}",
    )
    step.clear_condition(c.CONDITION_RUNNING, first.reason)
    step.delete_pods(gang)
    step.plan.gang_restart = first.reason
    step.plan.wake_in(_backoff(step, restart))
    return step.finalize()


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


def _phase_from_gang(step: _Pass, gang: list[ObservedPod], nodes: int) -> None:
    # Under AllWorkers a pod that already exited 0 still counts as part of a running gang.
    running = sum(1 for p in gang if p.phase in ("Running", "Succeeded") and not p.deleting)
    created = len({p.name for p in gang} | step.observed.expected_created)
    if created >= nodes:
        step.set_condition(
            c.CONDITION_CREATED,
            True,
            "GangCreated",
            f"all {nodes} pods of gang {step.status['restartCount']} exist",
        )
    if running == nodes:
        step.status["phase"] = c.PHASE_RUNNING
        step.status.setdefault("startTime", step.stamp)
        step.set_condition(
            c.CONDITION_RUNNING, True, "GangRunning", f"all {nodes} pods are running"
        )
        step.clear_condition(c.CONDITION_RESTARTING, "GangRunning")
    elif step.status.get("phase") not in (c.PHASE_RESTARTING,) or not cond.is_true(
        step.status.get("conditions"), c.CONDITION_RESTARTING
    ):
        step.status["phase"] = c.PHASE_PENDING


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
    kind, name, code, message = rejected[0]
    reason = "CreateRejected"
    if kind == "PodGroup" and code == 404:
        reason = "PodGroupCRDMissing"
        message = (
            f"the PodGroup CRD for spec.scheduling.podGroup is not installed in this "
            f"cluster ({message}); install the scheduler or set podGroup None"
        )
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
