"""What the operator saw: compact, immutable summaries of pods, nodes, the
job's PodGroup and its Kueue Workload.

The informer caches keep these instead of whole objects (9,000 pods at
scale), and the planner takes them as plain data. Pure: no client imports.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from torchfleet_contract import pod as contract
from torchfleet_operator.api import reasons as r
from torchfleet_operator.api.constants import TRAINER_CONTAINER_NAME
from torchfleet_operator.desired.labels import NODE_RANK_LABEL, RESTART_LABEL, ROLE_LABEL
from torchfleet_operator.desired.podgroup import NATIVE_API
from torchfleet_operator.desired.workload import KUEUE_API

# A termination message (with FallbackToLogsOnError: the log's tail) is cut to
# its last this many characters: enough for the error line, small for a status.
MESSAGE_CHARS = 400


def _int_label(labels: dict[str, str], key: str) -> int | None:
    try:
        return int(labels[key])
    except (KeyError, ValueError):
        return None


def parse_time(raw: Any) -> datetime | None:
    """A Kubernetes timestamp as an aware datetime; None when it is missing or not
    one (never raises: statuses and pods are read, not trusted)."""
    if not isinstance(raw, str) or not raw:
        return None
    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def timestamp(now: datetime) -> str:
    """A status timestamp: RFC 3339, UTC, whole seconds."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class ObservedRuntime:
    """A TrainingRuntime or ClusterTrainingRuntime as the watch saw it."""

    kind: str
    name: str
    generation: int | None
    spec: dict[str, Any]
    # Which object of that name: kopf's index can hold a deleted one beside its
    # namesake made since (a namespace deleted and made again).
    uid: str = ""
    created: str = ""  # creationTimestamp, RFC 3339: sorts as it reads

    @classmethod
    def from_manifest(cls, body: dict[str, Any]) -> ObservedRuntime:
        meta = body.get("metadata") or {}
        generation = meta.get("generation")
        spec = body.get("spec")
        return cls(
            kind=str(body.get("kind") or ""),
            name=str(meta.get("name") or ""),
            generation=generation if isinstance(generation, int) else None,
            spec=copy.deepcopy(spec) if isinstance(spec, dict) else {},
            uid=str(meta.get("uid") or ""),
            created=str(meta.get("creationTimestamp") or ""),
        )


@dataclass(frozen=True)
class ObservedPod:
    name: str
    uid: str
    role: str
    node_rank: int
    restart: int
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    deleting: bool = False
    node_name: str | None = None
    pod_ip: str | None = None
    exit_code: int | None = None
    reason: str | None = None  # why it ended: container reason, Evicted, a disruption
    message: str | None = None
    disrupted: bool = False  # evicted, preempted or taken by a taint: not the code's fault
    owner_uid: str | None = None  # the TrainingJob that controls it
    finished_at: datetime | None = None  # when the judged container terminated
    # Failed before any container ran (kubelet admission: UnexpectedAdmissionError,
    # OutOf<resource>): the node's fault, reported with the kubelet's reason.
    never_started: bool = False
    # The trainer container cannot start: the kubelet's waiting reason
    # (ImagePullBackOff, ErrImagePull, ...) and message, and since when the
    # kubelet has had the pod (its status.startTime).
    stuck_reason: str | None = None
    stuck_message: str | None = None
    started_at: datetime | None = None
    # The trainer ended but the pod still runs (its sidecars): delete it.
    sidecars_running: bool = False
    # The scheduler's PodScheduled=False "reason: message", while unscheduled.
    unschedulable: str | None = None
    # The gang's in-place restarts and the last reason, as its termination
    # message left them (a round that ended before the operator's next scrape).
    in_place_report: tuple[int, str | None] | None = None
    # Rank 0's final figures, as its termination message left them (the master's).
    final_report: FinalReport | None = None
    # Devices its kubelet reports Unhealthy ("resource/device"), from the
    # containers' allocatedResourcesStatus (KEP-4680): a GPU its device plugin
    # gave up on while the pod runs on it.
    unhealthy_devices: tuple[str, ...] = ()

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @classmethod
    def from_manifest(cls, pod: dict[str, Any]) -> ObservedPod | None:
        """Summarises one pod; None for a pod without torchfleet's labels."""
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        rank = _int_label(labels, NODE_RANK_LABEL)
        restart = _int_label(labels, RESTART_LABEL)
        role = labels.get(ROLE_LABEL)
        if rank is None or restart is None or role is None:
            return None
        status = pod.get("status") or {}
        report = trainer_report(pod)
        exit_code, reason, message, finished_at = _termination(status)
        stuck = _stuck(status)
        disruption = _disruption(status)
        never_started = status.get("phase") == "Failed" and finished_at is None
        if status.get("reason") in (r.REASON_EVICTED, r.REASON_PREEMPTED):
            reason, message = status["reason"], status.get("message") or message
        elif disruption is not None:
            reason, message = disruption
        elif never_started and status.get("reason"):
            reason, message = status["reason"], status.get("message") or message
        return cls(
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            role=role,
            node_rank=rank,
            restart=restart,
            phase=_judged_phase(status),
            sidecars_running=status.get("phase") in ("Pending", "Running")
            and _trainer_phase(status) is not None,
            deleting=bool(meta.get("deletionTimestamp")),
            node_name=(pod.get("spec") or {}).get("nodeName"),
            pod_ip=status.get("podIP"),
            exit_code=exit_code,
            reason=reason,
            message=_tail(_failure_text(message, report)),
            disrupted=status.get("reason") in (r.REASON_EVICTED, r.REASON_PREEMPTED)
            or disruption is not None,
            owner_uid=next(
                (
                    ref.get("uid")
                    for ref in meta.get("ownerReferences") or ()
                    if ref.get("controller")
                ),
                None,
            ),
            finished_at=finished_at,
            never_started=never_started and disruption is None,
            unschedulable=_unschedulable(status),
            stuck_reason=stuck[0],
            stuck_message=stuck[1],
            started_at=parse_time(status.get("startTime")),
            in_place_report=contract.reported_in_place_restarts(report),
            unhealthy_devices=_unhealthy_devices(status),
            final_report=FinalReport.from_report(report),
        )


Termination = tuple[int | None, str | None, str | None, datetime | None]


def _termination(status: dict[str, Any]) -> Termination:
    """How the trainer container ended (the pod's verdict, whatever its sidecars
    do); without a ``trainer`` status, the first non-zero exit (else the first exit)."""
    containers = status.get("containerStatuses") or []
    trainer = [c for c in containers if c.get("name") == TRAINER_CONTAINER_NAME]
    first: Termination = (None, None, None, None)
    for container in trainer or containers:
        found = _terminated(container)
        if found[0]:
            return found
        if first[0] is None:
            first = found
    return first


def _terminated(container: dict[str, Any]) -> Termination:
    state = container.get("state") or {}
    terminated = state.get("terminated") or (container.get("lastState") or {}).get("terminated")
    if not terminated:
        return (None, None, None, None)
    return (
        terminated.get("exitCode"),
        terminated.get("reason"),
        terminated.get("message"),
        parse_time(terminated.get("finishedAt")) or parse_time(terminated.get("startedAt")),
    )


def _failure_text(message: str | None, report: dict[str, Any] | None) -> str | None:
    """What a failure says: the trainer's report carries the failed rank's last
    log lines (the kubelet gives its own tail only for an empty message)."""
    tail = (report or {}).get(contract.REPORTED_LOG_TAIL)
    return tail if isinstance(tail, str) and tail else message


def _trainer_phase(status: dict[str, Any]) -> str | None:
    """Succeeded/Failed once the trainer container terminated, though native
    sidecars keep the pod Running; None without a terminated trainer."""
    for container in status.get("containerStatuses") or []:
        if container.get("name") != TRAINER_CONTAINER_NAME:
            continue
        terminated = (container.get("state") or {}).get("terminated")
        if terminated:
            return "Succeeded" if terminated.get("exitCode") == 0 else "Failed"
    return None


def _judged_phase(status: dict[str, Any]) -> str:
    phase = status.get("phase") or "Pending"
    if phase in ("Succeeded", "Failed"):
        return str(phase)
    return _trainer_phase(status) or str(phase)


@dataclass(frozen=True)
class SavedCheckpoint:
    """The last save a trainer made as it ended (completed, or preempted and
    saved in its grace period), from its termination message (the pod
    contract's SAVED_CHECKPOINT_*): it may be newer than anything the
    master's /metrics showed."""

    step: int
    time: datetime


# The kubelet caps a termination message at 4 KiB; a longer one is not ours.
_MESSAGE_LIMIT = 4096
_STEP_LIMIT = 2**63 - 1  # the status's int64


def trainer_report(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The trainer container's termination message as the trainer writes it (one
    JSON object: contract.TERMINATION_MESSAGE_PATH); None for any other message
    (a log tail, a script's own) or none."""
    for container in (pod.get("status") or {}).get("containerStatuses") or ():
        if not isinstance(container, dict) or container.get("name") != TRAINER_CONTAINER_NAME:
            continue
        message = _terminated(container)[2]
        if not isinstance(message, str) or len(message) > _MESSAGE_LIMIT:
            return None
        try:
            report = json.loads(message)
        except ValueError:
            return None
        return report if isinstance(report, dict) else None
    return None


def saved_checkpoint(pod: dict[str, Any]) -> SavedCheckpoint | None:
    """The trainer container's report of its last save; None without one."""
    report = trainer_report(pod)
    if report is None:
        return None
    step = _report_step(report.get(contract.SAVED_CHECKPOINT_STEP))
    when = parse_time(report.get(contract.SAVED_CHECKPOINT_TIME))
    return None if step is None or when is None else SavedCheckpoint(step, when)


def _report_step(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _STEP_LIMIT
    return value if ok else None


def _report_figure(value: Any) -> float | None:
    """A finite JSON number; None for anything else (the status schema's own
    bounds are status/progress.py's to apply)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


@dataclass(frozen=True)
class FinalReport:
    """Rank 0's figures as its run ended (every step done, or stopped by SIGTERM
    with a save), from its termination message (the pod contract's REPORTED_*):
    the run may end within a scrape interval of its last steps, so these, not
    the last scrape, are the final status's."""

    step: int
    time: datetime  # when the trainer wrote them (the pod's clock)
    total_steps: int | None = None
    loss: float | None = None
    validation_loss: float | None = None
    tokens_per_second: float | None = None
    mfu: float | None = None

    @classmethod
    def from_report(cls, report: dict[str, Any] | None) -> FinalReport | None:
        """None without a step and a time (a preemption report of an older
        trainer, an in-place count alone, or nothing of ours)."""
        if report is None:
            return None
        step = _report_step(report.get(contract.REPORTED_STEP))
        when = parse_time(report.get(contract.REPORTED_TIME))
        if step is None or when is None:
            return None
        return cls(
            step=step,
            time=when,
            total_steps=_report_step(report.get(contract.REPORTED_TOTAL_STEPS)),
            loss=_report_figure(report.get(contract.REPORTED_LOSS)),
            validation_loss=_report_figure(report.get(contract.REPORTED_VAL_LOSS)),
            tokens_per_second=_report_figure(report.get(contract.REPORTED_TOKENS_PER_SECOND)),
            mfu=_report_figure(report.get(contract.REPORTED_MFU)),
        )


# Waiting reasons of a container that will not start without a change elsewhere.
STUCK_REASONS = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName"})


def _stuck(status: dict[str, Any]) -> tuple[str | None, str | None]:
    for container in status.get("containerStatuses") or []:
        if container.get("name") != TRAINER_CONTAINER_NAME:
            continue
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_REASONS:
            return waiting["reason"], waiting.get("message")
    return None, None


def _unhealthy_devices(status: dict[str, Any]) -> tuple[str, ...]:
    """Every device the kubelet reports Unhealthy for any container of the pod,
    once each, as "resource/device" (Unknown is no finding: a plugin that has
    not said yet)."""
    found: dict[str, None] = {}
    for kind in ("initContainerStatuses", "containerStatuses"):
        for container in _dicts(status.get(kind)):
            for resource in _dicts(container.get("allocatedResourcesStatus")):
                for device in _dicts(resource.get("resources")):
                    if device.get("health") == "Unhealthy":
                        found[f"{resource.get('name')}/{device.get('resourceID')}"] = None
    return tuple(found)


def _dicts(value: Any) -> list[dict[str, Any]]:
    """The objects of a list the operator reads, skipping anything else in it."""
    return [x for x in value if isinstance(x, dict)] if isinstance(value, list) else []


def _tail(message: str | None) -> str | None:
    if not message or len(message) <= MESSAGE_CHARS:
        return message
    return "..." + message[-MESSAGE_CHARS:]


def _unschedulable(status: dict[str, Any]) -> str | None:
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            reason = condition.get("reason") or "Unschedulable"
            return f"{reason}: {condition.get('message') or 'not scheduled yet'}"
    return None


def _disruption(status: dict[str, Any]) -> tuple[str, str | None] | None:
    """The DisruptionTarget condition: preemption, taint eviction, API eviction."""
    for condition in status.get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            return condition.get("reason") or "DisruptionTarget", condition.get("message")
    return None


# The taint an administrator sets on a node known to be shut down (non-graceful
# node shutdown): its pods may go at once.
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"


@dataclass(frozen=True)
class ObservedNode:
    name: str
    ready: bool
    since: datetime | None = None  # when Ready last changed
    out_of_service: bool = False

    @classmethod
    def from_manifest(cls, node: dict[str, Any]) -> ObservedNode:
        meta = node.get("metadata") or {}
        out_of_service = any(
            taint.get("key") == OUT_OF_SERVICE_TAINT
            for taint in (node.get("spec") or {}).get("taints") or ()
        )
        for condition in (node.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "Ready":
                return cls(
                    name=meta.get("name", ""),
                    ready=condition.get("status") == "True",
                    since=parse_time(condition.get("lastTransitionTime")),
                    out_of_service=out_of_service,
                )
        return cls(
            name=meta.get("name", ""), ready=False, since=None, out_of_service=out_of_service
        )


# ---- gang scheduling: the job's PodGroup ----

KIND_OF_GROUP = {
    "scheduling.x-k8s.io": "Coscheduling",
    "scheduling.volcano.sh": "Volcano",
    "scheduling.k8s.io": "Kubernetes",
}
# kube-scheduler's verdict on a whole gang: its condition type in
# scheduling.k8s.io/v1beta1 (1.37; True once, and then for good) and v1alpha2.
NATIVE_SCHEDULED_CONDITIONS = ("PodGroupInitiallyScheduled", "PodGroupScheduled")
_POD_GROUP_TEXT_CHARS = 1024


@dataclass(frozen=True)
class ObservedPodGroup:
    """What the operator reads of its PodGroup."""

    kind: str  # Coscheduling | Volcano | Kubernetes
    # Kubernetes' PodGroup has no phase: its PodGroupScheduled condition's
    # reason (Scheduled, Unschedulable, SchedulerError) stands in for one.
    phase: str | None = None
    queue: str | None = None
    # The scheduler's refusal, "reason: message": Volcano's Unschedulable
    # condition, or Kubernetes' PodGroupScheduled=False.
    unschedulable: str | None = None
    owner_uid: str | None = None
    # Kubernetes: the gang generation the group is for (one group per generation).
    generation: int = 0
    # Kubernetes: which object it is (to delete a finished generation's
    # group), and whether its deletion has begun (PodGroup protection holds it while pods
    # of its gang are active).
    name: str | None = None
    api_version: str | None = None
    uid: str | None = None
    deleting: bool = False

    @classmethod
    def from_manifest(cls, group: dict[str, Any]) -> ObservedPodGroup | None:
        """None for anything that is not a PodGroup of a known scheduler."""
        api_group = str(group.get("apiVersion") or "").split("/")[0]
        kind = KIND_OF_GROUP.get(api_group)
        if kind is None or group.get("kind") != "PodGroup":
            return None
        meta = group.get("metadata") or {}
        status = group.get("status") or {}
        conditions = status.get("conditions")
        native = kind == "Kubernetes"
        scheduled = _native_scheduled(conditions) if native else None
        generation = _int_label(meta.get("labels") or {}, RESTART_LABEL)
        return cls(
            kind=kind,
            phase=_group_text(scheduled.get("reason") if scheduled else status.get("phase")),
            queue=_group_text((group.get("spec") or {}).get("queue")),
            unschedulable=_native_refusal(scheduled)
            if native
            else _group_unschedulable(conditions),
            generation=generation if generation and generation > 0 else 0,
            name=_group_text(meta.get("name")) if native else None,
            api_version=str(group.get("apiVersion")) if native else None,
            uid=_group_text(meta.get("uid")) if native else None,
            deleting=native and bool(meta.get("deletionTimestamp")),
            owner_uid=next(
                (r.get("uid") for r in meta.get("ownerReferences") or () if r.get("controller")),
                None,
            ),
        )


def _group_text(value: Any) -> str | None:
    return value[:_POD_GROUP_TEXT_CHARS] if isinstance(value, str) and value else None


def current_pod_group(groups: Iterable[ObservedPodGroup], job_uid: str) -> ObservedPodGroup | None:
    """The job's PodGroup: one it controls (or that names no controller), and
    of Kubernetes' groups, one per gang generation, the newest."""
    return max(jobs_pod_groups(groups, job_uid), key=lambda g: g.generation, default=None)


def jobs_pod_groups(
    groups: Iterable[ObservedPodGroup], job_uid: str
) -> tuple[ObservedPodGroup, ...]:
    """The job's PodGroups: those it controls, or that name no controller."""
    return tuple(g for g in groups if g.owner_uid in (job_uid, None))


def _native_scheduled(conditions: Any) -> dict[str, Any] | None:
    return next(
        (
            c
            for c in (conditions if isinstance(conditions, list) else ())
            if isinstance(c, dict) and c.get("type") in NATIVE_SCHEDULED_CONDITIONS
        ),
        None,
    )


def _native_refusal(condition: dict[str, Any] | None) -> str | None:
    if condition is None or condition.get("status") != "False":
        return None
    parts = [_group_text(condition.get("reason")), _group_text(condition.get("message"))]
    return ": ".join(p for p in parts if p) or str(condition.get("type"))


def _group_unschedulable(conditions: Any) -> str | None:
    for condition in conditions if isinstance(conditions, list) else ():
        if not isinstance(condition, dict):
            continue
        if condition.get("type") == "Unschedulable" and condition.get("status") == "True":
            parts = [_group_text(condition.get("reason")), _group_text(condition.get("message"))]
            return ": ".join(p for p in parts if p) or "Unschedulable"
    return None


# ---- Kueue: the job's Workload and the flavors it may name ----


@dataclass(frozen=True)
class Flavor:
    """What a ResourceFlavor puts on the pods it admits."""

    node_labels: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_manifest(cls, flavor: dict[str, Any]) -> Flavor:
        spec = flavor.get("spec") or {}
        labels = spec.get("nodeLabels") or {}
        tolerations = spec.get("tolerations") or []
        return cls(
            node_labels={str(k): str(v) for k, v in labels.items()}
            if isinstance(labels, dict)
            else {},
            tolerations=tuple(t for t in tolerations if isinstance(t, dict))
            if isinstance(tolerations, list)
            else (),
        )


@dataclass(frozen=True)
class ObservedWorkload:
    """The job's Workload as the planner needs it (the whole manifest is kept:
    clearing a reservation re-applies its admission-managed conditions)."""

    manifest: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.metadata.get("name") or "")

    @property
    def metadata(self) -> dict[str, Any]:
        return dict(self.manifest.get("metadata") or {})

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.manifest.get("status") or {})

    @property
    def spec(self) -> dict[str, Any]:
        return dict(self.manifest.get("spec") or {})

    @property
    def deleting(self) -> bool:
        return bool(self.metadata.get("deletionTimestamp"))

    def condition(self, type_: str) -> dict[str, Any] | None:
        return next(
            (c for c in self.status.get("conditions") or () if c.get("type") == type_), None
        )

    def is_true(self, type_: str) -> bool:
        found = self.condition(type_)
        return found is not None and found.get("status") == "True"

    @property
    def has_reservation(self) -> bool:
        return self.status.get("admission") is not None and self.is_true(r.WORKLOAD_QUOTA_RESERVED)

    @property
    def admitted(self) -> bool:
        return self.has_reservation and self.is_true(r.WORKLOAD_ADMITTED)

    @property
    def evicted(self) -> bool:
        return self.is_true(r.WORKLOAD_EVICTED)

    @property
    def evictions(self) -> int:
        """How often Kueue has evicted it, for any reason (its schedulingStats)."""
        stats = self.status.get("schedulingStats")
        listed = stats.get("evictions") if isinstance(stats, dict) else None
        counts = [e.get("count") for e in listed or () if isinstance(e, dict)]
        return sum(c for c in counts if isinstance(c, int) and c > 0)

    @property
    def cluster_name(self) -> str | None:
        """The worker cluster MultiKueue dispatched it to (a manager cluster's
        Workload; None elsewhere, and while it is dispatched nowhere)."""
        name = self.status.get("clusterName")
        return name if isinstance(name, str) and name else None

    @property
    def finished(self) -> bool:
        return self.is_true(r.WORKLOAD_FINISHED)

    @property
    def active(self) -> bool:
        return self.spec.get("active") is not False

    def annotation(self, key: str) -> str | None:
        found = (self.metadata.get("annotations") or {}).get(key)
        return found if isinstance(found, str) else None


@dataclass(frozen=True)
class KueueView:
    """Everything about Kueue one pass needs (observed.Observed.kueue)."""

    installed: bool = True  # Kueue's Workload CRD is served
    api_version: str = KUEUE_API  # the Workload apiVersion it prefers (discovered)
    workload: ObservedWorkload | None = None
    flavors: dict[str, Flavor] = field(default_factory=dict)  # ResourceFlavors by name
    priority: int | None = None  # value of the job's PriorityClass, when known
    # The WorkloadPriorityClass the job's label names, and its value when known.
    workload_priority_class: str | None = None
    workload_priority: int | None = None


@dataclass(frozen=True)
class NodeFigures:
    """One node of the gang, as rank 0 exported it."""

    node: str
    node_rank: int | None = None
    compute_seconds: float | None = None
    straggler_score: float | None = None
    preflight_ratio: float | None = None
    preflight_passed: bool | None = None


@dataclass(frozen=True)
class GangHealth:
    """What one scrape says about the gang's nodes and phase."""

    nodes: tuple[NodeFigures, ...] = ()
    phase: str | None = None  # one of contract.PHASES; None: not exported
    phase_started: float | None = None  # Unix time the phase began
    step_seconds: float | None = None  # this gang's mean step time
    # This gang's restarts of its processes in place, and the last one's reason.
    restarts_in_gang: int | None = None
    in_place_reason: str | None = None

    @property
    def window(self) -> tuple[tuple[str, float | None], ...]:
        """What identifies one log interval's figures: they change every interval."""
        return tuple((n.node, n.compute_seconds) for n in self.nodes)


@dataclass(frozen=True)
class Observed:
    """Everything one reconcile pass knows besides the job itself."""

    pods: tuple[ObservedPod, ...] = ()
    # Nodes of this job's pods that are NotReady/Unknown, with since when (None:
    # out of service, or unknown since when: the grace is over).
    nodes_not_ready: dict[str, datetime | None] = field(default_factory=dict)
    has_service: bool = False
    has_checkpoint_claim: bool = False
    # Child pods the operator created or deleted whose watch events have not
    # arrived yet (created: names, deleted: uids): treated as present / absent.
    expected_created: frozenset[str] = frozenset()
    expected_deleted: frozenset[str] = frozenset()  # uids
    # Children the apiserver refused recently: not retried before their back-off.
    held: frozenset[str] = frozenset()
    # The trainer's latest figures from the master's /metrics (status.progress)
    # and the step of its newest complete checkpoint.
    progress: dict[str, Any] | None = None
    checkpoint_step: int | None = None
    # The gang's node health and phase from the same scrape (policy/health.py).
    health: GangHealth | None = None
    # The newest save a trainer of this job reported as it ended (its
    # master's termination message), kept after the pod itself is gone.
    saved_checkpoint: SavedCheckpoint | None = None
    # Kueue's Workload of the job, its flavors and priority (None: Kueue not served).
    kueue: KueueView | None = None
    # The job's PodGroup (gang scheduling), when its CRD exists and it was seen.
    pod_group: ObservedPodGroup | None = None
    # All of the job's PodGroups seen: Kubernetes' has one per gang generation.
    pod_groups: tuple[ObservedPodGroup, ...] = ()
    # The scheduling.k8s.io version of Kubernetes' own gang objects the cluster
    # serves (discovery; podGroup: Kubernetes).
    native_api: str = NATIVE_API
    # The runtime the job's spec.runtimeRef names, as the watch last saw it
    # (None: not found, or no runtimeRef). Read only until status records it.
    runtime: ObservedRuntime | None = None
