"""The failure policy: which failures restart the gang, which fail the job,
how long to wait, and the restart itself. Pure.

A pod taken away by the platform (evicted, preempted, its node lost, deleted
under a running gang) is never the code's fault: always retryable, and a
*disruption* that does not count toward backoffLimit (JobSet's
RestartJobSetAndIgnoreMaxRestarts, the Job controller's podFailurePolicy
Ignore for DisruptionTarget). A pod that never started (kubelet admission) is
the node's fault: retryable, but counted, since it may recur for ever. A pod
that exited is classified by the job's runPolicy: explicit exit-code lists
first, then restartPolicy (OnFailure: retry; Never: fail; ExitCode: 1-127 are
the program's own errors and fail, 128+ are signals such as OOM kill and retry).

When several pods fail in one batch, the first to fail (by finishedAt) decides:
an OOM-killed rank takes its peers down with exit 1, and those exits are
consequences. torchfleet-train says so itself: a rank whose collective lost
its peer exits 202, and any other exit in the batch is taken before it.
finishedAt has one-second resolution, so within one second a retryable
failure is taken as the cause; pods without a finishedAt (taken away,
not exited) come after those that exited.

Kubelets report on their own schedules, so a batch can arrive in pieces: the
peers' exit 1 first, the OOM kill that caused them a few seconds later. A
failure that would end the job therefore waits (``settle_left``) until the
gang's other pods have ended too, or for a bounded time after it ended; one
that restarts the gang is decided at once, as waiting cannot make it worse.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, replace
from datetime import datetime

from torchfleet_contract import pod as contract
from torchfleet_operator.api import constants as c
from torchfleet_operator.api import reasons as r
from torchfleet_operator.api.v1alpha1 import TrainingJobSpec, TrainingJobStatus
from torchfleet_operator.desired.pods import pod_name_for_rank
from torchfleet_operator.observed import ObservedPod
from torchfleet_operator.planning import ChildRef, Pass, Plan
from torchfleet_operator.policy import finish, kept_logs, reporting
from torchfleet_operator.status import restarts

# Exit codes from 128 up mean "killed by signal (code - 128)": 137 = SIGKILL
# (often the OOM killer), 143 = SIGTERM (preemption, drain). The rule that
# classifies an exit is the pod contract's, shared with the trainer's launcher,
# which applies it to in-place restarts.
FIRST_SIGNAL_EXIT_CODE = contract.FIRST_SIGNAL_EXIT_CODE
exit_is_retryable = contract.exit_is_retryable
# The kubelet's reason for a container the kernel's OOM killer ended.
OOM_KILLED = "OOMKilled"


@dataclass(frozen=True)
class Failure:
    """One reason the current gang cannot go on."""

    pod: str
    reason: str  # PodFailed, Evicted, NodeLost, PodDeleted, ... (api/reasons.py)
    exit_code: int | None
    retryable: bool
    message: str
    disruption: bool = False  # the platform took the pod: not counted toward backoffLimit
    finished_at: datetime | None = None
    node_rank: int | None = None
    logs: str | None = None  # where its ranks' output is kept (policy/kept_logs.py)

    def describe(self) -> str:
        code = f" with exit code {self.exit_code}" if self.exit_code is not None else ""
        detail = f": {self.message}" if self.message else ""
        logs = f"; {self.logs}" if self.logs else ""
        return f"pod {self.pod} {self.reason}{code}{detail}{logs}"


def first_failure(failures: Collection[Failure]) -> Failure:
    """The failure that caused the batch (see the module docstring)."""
    return min(
        failures,
        key=lambda f: (
            f.finished_at is None,
            f.exit_code == contract.EXIT_COLLECTIVE_FAILED,
            f.finished_at or datetime.max.replace(tzinfo=None),
            not f.retryable,
        ),
    )


def settle_left(failures: Collection[Failure], now: datetime, settle_seconds: float) -> float:
    """Seconds to wait before a job-ending decision on ``failures`` (0: decide).

    Counted from the earliest exit among them, so a batch that trickled in is
    judged once its first failure is ``settle_seconds`` old; never more than
    ``settle_seconds`` from now, whatever the kubelet's clock said.
    """
    ended = [f.finished_at for f in failures if f.finished_at is not None]
    if not ended:
        return 0.0
    waited = (now - min(ended)).total_seconds()
    return min(settle_seconds, max(0.0, settle_seconds - waited))


def restart_backoff(restarts_so_far: int, base: float, cap: float) -> float:
    """Seconds to wait before starting gang number ``restarts_so_far + 1``."""
    if base <= 0:
        return 0.0
    # min() before the power keeps huge restart counts from overflowing.
    return min(cap, base * 2 ** min(restarts_so_far, 32))


# ---- finding the failures of the current gang ----


def failures(
    step: Pass, spec: TrainingJobSpec, gang: list[ObservedPod], restart: int
) -> list[Failure]:
    """Every reason gang ``restart`` cannot go on; wakes the pass when a grace
    (a NotReady node, a stuck image pull) runs out later."""
    found: list[Failure] = []
    for pod in gang:
        if pod.phase == "Failed" or (pod.disrupted and not pod.finished):
            found.append(pod_failure(pod, spec))
        elif pod.stuck_reason and not pod.deleting:
            _stuck_failure(step, pod, found)
        elif pod.node_name in step.observed.nodes_not_ready and not pod.finished:
            since = step.observed.nodes_not_ready[pod.node_name]
            waited = (step.now - since).total_seconds() if since else math.inf
            if waited >= step.config.node_lost_grace_seconds:
                found.append(
                    Failure(
                        pod.name,
                        r.REASON_NODE_LOST,
                        None,
                        True,
                        f"node {pod.node_name} is NotReady",
                        disruption=True,
                    )
                )
            else:
                step.plan.wake_in(step.config.node_lost_grace_seconds - waited)
    if _gang_was_complete(step, restart):
        found += _lost_pods(step, spec, gang)
    return found


def _lost_pods(step: Pass, spec: TrainingJobSpec, gang: list[ObservedPod]) -> list[Failure]:
    found = []
    for pod in gang:
        # Deleted by someone else (a person, an eviction, the taint manager)
        # while the gang ran: it is lost, even before it is gone.
        if pod.deleting and not pod.finished and pod.uid not in step.observed.expected_deleted:
            found.append(
                Failure(
                    pod.name,
                    r.REASON_POD_DELETED,
                    None,
                    True,
                    "the pod is being deleted while the gang was running",
                    disruption=True,
                )
            )
    present = {p.name for p in gang} | step.observed.expected_created
    # Ranks an elastic job just grew by are new, not lost.
    known = min(spec.nodes, step.previous_size() or spec.nodes)
    for rank in range(known):
        name = pod_name_for_rank(step.name, rank)
        if name not in present:
            found.append(
                Failure(
                    name,
                    r.REASON_POD_DELETED,
                    None,
                    True,
                    "the pod disappeared while the gang was running",
                    disruption=True,
                )
            )
    return found


def _gang_was_complete(step: Pass, restart: int) -> bool:
    """True once this generation was seen fully running: a missing pod now means lost."""
    return step.old_status.phase == c.PHASE_RUNNING and restarts.gang(step.old_status) == restart


def _stuck_failure(step: Pass, pod: ObservedPod, found: list[Failure]) -> None:
    """A trainer that cannot start (image pull back-off) fails the gang past a bound."""
    bound = step.config.image_pull_bound_seconds
    since = pod.started_at or step.now
    waited = (step.now - since).total_seconds()
    if waited < bound:
        step.plan.wake_in(bound - waited)
        return
    message = f"{pod.stuck_message or 'the trainer container cannot start'} (for {waited:.0f}s)"
    reason = pod.stuck_reason or r.REASON_IMAGE_PULL_BACK_OFF
    found.append(Failure(pod.name, reason, None, True, message))


def pod_failure(pod: ObservedPod, spec: TrainingJobSpec) -> Failure:
    """One failed (or taken) pod, classified (see the module docstring)."""
    if pod.disrupted:
        reason = pod.reason or r.REASON_DISRUPTION_TARGET
        return Failure(
            pod.name, reason, pod.exit_code, True, pod.message or "", True, pod.finished_at
        )
    if pod.never_started:
        reason = pod.reason or r.REASON_NEVER_STARTED
        message = pod.message or "no container of the pod ever started"
        return Failure(pod.name, reason, None, True, message, finished_at=pod.finished_at)
    policy = spec.run_policy
    retryable = exit_is_retryable(
        policy.restart_policy,
        _judged_exit_code(pod),
        policy.retryable_exit_codes or (),
        policy.permanent_exit_codes or (),
    )
    return Failure(
        pod.name,
        r.REASON_POD_FAILED,
        pod.exit_code,
        retryable,
        _with_container_reason(pod),
        False,
        pod.finished_at,
        pod.node_rank,
    )


def _judged_exit_code(pod: ObservedPod) -> int | None:
    """The exit code the policy judges: an OOM kill is a signal (137) whatever the
    container's main process made of it (torchrun exits 1 when the kernel kills
    one of its workers; the kubelet still says OOMKilled)."""
    oom_killed = pod.reason == OOM_KILLED and (pod.exit_code or 0) < FIRST_SIGNAL_EXIT_CODE
    return FIRST_SIGNAL_EXIT_CODE + 9 if oom_killed else pod.exit_code


def _with_container_reason(pod: ObservedPod) -> str:
    """The termination message, after the kubelet's reason when it says more than
    "Error" (OOMKilled: the kernel's OOM killer, not the program, ended it)."""
    message = pod.message or ""
    if not pod.reason or pod.reason in ("Error", "Completed") or pod.reason in message:
        return message
    return f"{pod.reason}: {message}" if message else pod.reason


# ---- deciding: fail the job, or restart the gang ----


def on_failure(
    step: Pass,
    spec: TrainingJobSpec,
    gang: list[ObservedPod],
    restart: int,
    found: list[Failure],
) -> Plan:
    """Fails the job (a permanent failure, a spent backoffLimit) or restarts the gang."""
    policy = spec.run_policy
    first = _with_kept_logs(first_failure(found), spec, step.status, restart)
    if not first.retryable:
        left = settle_left(found, step.now, step.config.failure_settle_seconds)
        if left > 0 and not all(p.finished for p in gang):
            # Ending the job is final: first hear from the peers (the module
            # docstring says why).
            step.plan.wake_in(left)
            return step.finalize()
        step.finish(
            c.PHASE_FAILED,
            r.REASON_POD_FAILED_PERMANENTLY,
            f"{first.describe()}; not retryable under restartPolicy {policy.restart_policy}",
        )
        return _failed(step, spec, gang)
    counted = restarts.counted(step.status)
    if not first.disruption and restarts.limit_reached(counted + 1, policy.backoff_limit):
        step.finish(
            c.PHASE_FAILED,
            r.REASON_BACKOFF_LIMIT_EXCEEDED,
            f"{first.describe()}; backoffLimit {policy.backoff_limit} reached after "
            f"{counted} counted restarts ({step.status.disruptions} disruptions "
            "not counted)",
        )
        return _failed(step, spec, gang)
    _restart(step, gang, restart, first, policy.backoff_limit)
    return step.finalize()


def _failed(step: Pass, spec: TrainingJobSpec, gang: list[ObservedPod]) -> Plan:
    """The failed job's final progress, in the write that fails it, then finished."""
    if spec.runs_trainer:
        reporting.failed_progress(step, gang)
    return finish.finished(step, spec)


def _with_kept_logs(
    first: Failure, spec: TrainingJobSpec, status: TrainingJobStatus, restart: int
) -> Failure:
    """``first`` naming where its pod's ranks kept their output, when a program
    exited (a pod taken before its program ran has nothing to read)."""
    if first.node_rank is None or first.exit_code is None:
        return first
    round_ = restarts.in_place_in_gang(status)
    if first.exit_code == contract.EXIT_COLLECTIVE_FAILED:
        # Its ranks lost a peer: the rank that failed is another pod's, not yet reported.
        return replace(first, logs=kept_logs.round_logs(spec, restart, round_))
    return replace(first, logs=kept_logs.pod_logs(spec, restart, round_, first.node_rank))


def _restart(
    step: Pass,
    gang: list[ObservedPod],
    restart: int,
    first: Failure,
    backoff_limit: int,
) -> None:
    """Restarts the whole gang: bump the generation, delete every pod of this one."""
    counted = restarts.count_failure(step.status, disruption=first.disruption)
    if first.disruption:
        step.plan.disruption = first.reason
        counted_text = "a disruption, not counted toward backoffLimit"
    else:
        counted_text = f"{counted} of backoffLimit {backoff_limit}"
    restarts.next_gang(step.status)
    step.set_phase(c.PHASE_RESTARTING)
    # A fresh transition time: the back-off of this restart counts from now.
    step.drop_condition(r.CONDITION_RESTARTING)
    step.set_condition(
        r.CONDITION_RESTARTING,
        True,
        first.reason,
        f"restart {restart + 1} ({counted_text}): {first.describe()}",
    )
    step.clear_condition(
        r.CONDITION_RUNNING, first.reason, f"gang {restart} ended: {first.describe()}"
    )
    step.delete_pods(gang)
    step.plan.gang_restart = first.reason
    step.plan.wake_in(_backoff(step, restart))


def _backoff(step: Pass, restarts_before: int) -> float:
    return restart_backoff(
        restarts_before,
        step.config.restart_backoff_seconds,
        step.config.restart_backoff_max_seconds,
    )


def in_restart_backoff(step: Pass, restart: int) -> bool:
    """While Restarting, gang ``restart`` starts only after the back-off."""
    restarting = step.condition(r.CONDITION_RESTARTING)
    if restart == 0 or not restarting or restarting.status != "True":
        return False
    since = restarting.last_transition_time
    if since is None:
        return False
    left = _backoff(step, restart - 1) - (step.now - since).total_seconds()
    if left > 0:
        step.set_phase(c.PHASE_RESTARTING)
        step.plan.wake_in(left)
        return True
    return False


# ---- waiting for the old gang's pods to go ----


def _lost_for(step: Pass, pod: ObservedPod) -> float | None:
    """Seconds since ``pod``'s node was lost (inf: out of service); None: it is not."""
    if pod.node_name not in step.observed.nodes_not_ready:
        return None
    since = step.observed.nodes_not_ready[pod.node_name]
    return math.inf if since is None else (step.now - since).total_seconds()


def force_delete_on_lost_nodes(step: Pass, terminating: list[ObservedPod]) -> list[ObservedPod]:
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


def wait_for_terminating(step: Pass, restart: int, terminating: list[ObservedPod]) -> None:
    """The new gang waits for ``terminating``: says so, and force-deletes those
    on lost nodes past the grace."""
    if step.phase != c.PHASE_RESTARTING:
        step.set_phase(c.PHASE_RESTARTING if restart else c.PHASE_PENDING)
    step.set_condition(
        r.CONDITION_CREATED, False, r.REASON_WAITING, _why_waiting(step, terminating)
    )


def _why_waiting(step: Pass, terminating: list[ObservedPod]) -> str:
    grace = step.config.node_loss_force_delete_seconds
    on_lost_nodes = force_delete_on_lost_nodes(step, terminating)
    if not on_lost_nodes:
        return "waiting for the previous gang's pods to terminate"
    names = ", ".join(f"{p.name} (node {p.node_name})" for p in on_lost_nodes[:5])
    return (
        f"waiting for the previous gang's pods to terminate; on lost nodes: {names}; "
        f"force-deleted {grace:g}s after the node was lost"
    )
