"""plan = f(job, observed, now): what to create, delete and report. Pure.

One pass of the operator for one TrainingJob. The same function runs for
every trigger, and running it again on the same input gives the same plan,
which the executor turns into no-ops (409 on create, 404 on delete).

This module only dispatches: each decision is its policy's, whole
(``policy/``), written into the pass (``planning.Pass``) in this order:

* run by another controller (spec.managedBy): left alone (managed.py);
* spec.runtimeRef: resolved once, or waited for (runtime.py);
* the spec (merged over its runtime's): invalid or no longer understood (invalid.py);
* finished: clean up, release Kueue's quota, the TTL (finish.py, ttl.py);
* suspended (suspend.py); queued for Kueue (kueue.py);
* the deadline (deadline.py); a pod template refused as invalid (invalid.py);
* success (success.py); failures: an elastic worker replaced alone
  (elastic.py), else a gang restart or the job's failure (failure.py);
* in-place restarts the gang reported, counted toward backoffLimit (in_place.py);
* node health: stragglers, preflight, a stalled step, and the restarts
  they ask for (health.py);
* the old gang's pods still terminating, the restart back-off (failure.py);
* create what the gang misses, and read its phase (gang.py).

The gang's *generation* is the restart count: pods carry it in the
``torchfleet.dev/restart`` label (policy/failure.py says how a restart runs).
What the apiserver refused is folded into the status afterwards
(status/rejections.py).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from datetime import datetime
from typing import Any

from torchfleet_operator.api import constants as c
from torchfleet_operator.api.parse import InvalidSpecError, parse_training_job
from torchfleet_operator.api.v1alpha1 import TrainingJob, TrainingJobSpec
from torchfleet_operator.config import OperatorConfig
from torchfleet_operator.desired import names
from torchfleet_operator.observed import Observed, ObservedPod
from torchfleet_operator.planning import FINISHED, Pass, Plan
from torchfleet_operator.policy import (
    admission,
    deadline,
    elastic,
    failure,
    finish,
    gang,
    health,
    in_place,
    invalid,
    kueue,
    managed,
    reporting,
    runtime,
    success,
    suspend,
)
from torchfleet_operator.status import restarts


def validation_problem(
    body: dict[str, Any], source: Callable[[str], str] | None = None
) -> tuple[TrainingJob | None, str | None]:
    """The parsed job, or the problem with it naming the field (and, for a job
    merged over a runtime, ``source``'s word on which side set it)."""
    try:
        job = parse_training_job(body)
    except InvalidSpecError as exc:
        # Every problem, each with the field path its rule blames.
        if source is None:
            return None, str(exc)
        return None, "; ".join(
            f"{path} (from {source(path)}): {message}" for path, message in exc.problems
        )
    name = job.metadata.name or ""
    problem = names.name_problem(name, job.spec.worker.replicas)
    return (None, problem) if problem else (job, None)


def _multikueue_workload(
    manager: str, body: dict[str, Any], observed: Observed, now: datetime, config: OperatorConfig
) -> managed.ManagerSide:
    """What this operator does with the Workload of a job MultiKueue
    dispatches (on the manager cluster: policy/managed.py), from its spec as a
    pass of its own would plan it; nothing for any other manager, a deleted
    job, or a spec that does not resolve or parse (the worker's operator would
    say why)."""
    if manager != c.MANAGED_BY_MULTIKUEUE or body["metadata"].get("deletionTimestamp"):
        return managed.ManagerSide()
    step = Pass(body, {}, observed, now, config)
    resolved = runtime.resolve(step, body)
    if isinstance(resolved, Plan):
        return managed.ManagerSide()
    job, _ = validation_problem(resolved.body, resolved.source)
    return managed.ManagerSide() if job is None else managed.multikueue_workload(step, job.spec)


def plan(
    body: dict[str, Any],
    observed: Observed,
    now: datetime,
    config: OperatorConfig,
    status: dict[str, Any] | None = None,
) -> Plan:
    """Decides one pass. ``status`` is the freshest known status (default: the body's)."""
    manager = managed.manager_elsewhere(body.get("spec"))
    if manager is not None:  # not even a deleted job's status is this operator's
        return managed.left_alone(
            manager, _multikueue_workload(manager, body, observed, now, config)
        )
    if body["metadata"].get("deletionTimestamp"):
        # The garbage collector takes the children with it. The status stays
        # as it is: a job held by another's finalizer is still read (kubectl,
        # a CI system, the finalizer's owner) until it goes, and an empty plan
        # would have written its status away.
        kept = body.get("status") if status is None else status
        return Plan(status=copy.deepcopy(dict(kept or {})))
    # Pods this operator already deleted count as terminating, even before the
    # watch says so: their names are not free yet, and they are not deleted twice.
    pods = tuple(
        dataclasses.replace(p, deleting=True) if p.uid in observed.expected_deleted else p
        for p in observed.pods
    )
    observed = dataclasses.replace(observed, pods=pods)
    step = Pass(
        body, status if status is not None else body.get("status") or {}, observed, now, config
    )
    resolved = runtime.resolve(step, body)
    if isinstance(resolved, Plan):  # its runtime is not there yet
        return resolved
    body = resolved.body
    job, problem = validation_problem(body, resolved.source)
    if job is None:
        raw_spec = body.get("spec")  # the API server's schema says an object; trust nothing
        return invalid.not_understood(
            step, raw_spec if isinstance(raw_spec, dict) else {}, problem or "invalid spec"
        )
    invalid.understood(step)
    if step.phase in FINISHED:
        return finish.finished(step, job.spec)
    return _active(step, job.spec)


def _active(step: Pass, spec: TrainingJobSpec) -> Plan:
    pods = list(step.observed.pods)
    restart = restarts.adopt_gang(step.status, max((p.restart for p in pods), default=0))
    current = [p for p in pods if p.restart == restart]
    stale = [p for p in pods if p.restart < restart]
    # An elastic job resized while it runs: the workers past its size leave.
    surplus = elastic.surplus(spec, current)
    current = [p for p in current if p not in surplus]
    reporting.count(step, current, spec.nodes)
    reporting.record_progress(step)

    queue = admission.kueue_queue(spec, step.labels)
    if spec.suspend:
        if queue is not None:  # the Workload deactivated, kept in its place
            kueue.suspended(step, spec, queue, pods, step.config.trainer_image)
        return suspend.suspend(step, pods)
    suspend.resumed(step)

    placement: dict[str, admission.PodSetInfo] = {}
    if queue is not None:
        admitted = kueue.gate(step, spec, queue, pods, step.config.trainer_image)
        if admitted is None:
            return step.finalize()  # queued: activeDeadlineSeconds does not run yet
        placement = admitted
    desired, spec = spec, kueue.admitted_size(step, spec)
    deadline.start_clock(step)
    if deadline.exceeded(step, spec):
        return finish.finished(step, spec)
    if invalid.fail_if_pods_refused(step):
        return finish.finished(step, spec)
    # Counted first: a round that ended within the scrape interval is only in
    # the finished pods' termination messages.
    done = success.succeeded(spec.run_policy.success_policy, current, spec.nodes)
    if in_place.record(step, spec, current, may_fail=not done):  # past backoffLimit
        return finish.finished(step, spec)
    if success.finish_if_succeeded(step, spec, current):
        return finish.finished(step, spec)

    found = failure.failures(step, spec, current, restart)
    if spec.elastic is not None:
        found = elastic.replace_lost_workers(step, desired, current, found)
        if step.phase == c.PHASE_FAILED:
            return finish.finished(step, spec)
    if found:
        health.collectives_failed(step, found, current)
        return failure.on_failure(step, spec, current, restart, found)
    found = health.judge(step, spec, current)
    if found:  # a slow node replaced, a stalled gang restarted
        return failure.on_failure(step, spec, current, restart, found)
    return _next_gang(step, spec, desired, pods, current, stale, surplus, placement)


def _next_gang(
    step: Pass,
    spec: TrainingJobSpec,
    desired: TrainingJobSpec,
    pods: list[ObservedPod],
    current: list[ObservedPod],
    stale: list[ObservedPod],
    surplus: list[ObservedPod],
    placement: dict[str, admission.PodSetInfo],
) -> Plan:
    """No failure: clear the old gang away, then create what this one misses."""
    restart = restarts.gang(step.status)
    # The old generation must be gone before its names are reused.
    step.delete_pods(stale)
    finish.release_finished_groups(step, restart)
    elastic.resize(step, desired, surplus)
    replaced = [p for p in current if p.deleting and elastic.replaced_alone(spec, p)]
    failure.force_delete_on_lost_nodes(step, replaced)
    leaving = replaced + surplus
    terminating = [p for p in pods if p.restart < restart or (p.deleting and p not in leaving)]
    if terminating:
        failure.wait_for_terminating(step, restart, terminating)
        return step.finalize()
    if failure.in_restart_backoff(step, restart):
        return step.finalize()
    config = step.config
    try:
        gang.create_missing(
            step, spec, current, restart, config.trainer_image, config.default_shm_size or None
        )
        kueue.place(step, placement)
    except admission.ConflictError as exc:
        step.plan.create = []
        return invalid.invalid(step, f"the admitted flavors cannot be applied: {exc}")
    except (TypeError, AttributeError, KeyError, ValueError) as exc:
        # The CRD keeps template.spec open; a shape the merge cannot use is the
        # user's error, reported like any other invalid spec.
        step.plan.create = []
        return invalid.invalid(
            step, f"spec.master/worker.template.spec is not a usable PodSpec: {exc!r}"
        )
    gang.observe(step, spec, current, desired.nodes)
    return step.finalize()
