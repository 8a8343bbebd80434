"""What the operator saw: compact, immutable summaries of pods and nodes.

The informer caches keep these instead of whole objects (9,000 pods at
scale), and the planner takes them as plain data. Pure: no client imports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from torchfleet_operator.build.labels import NODE_RANK_LABEL, RESTART_LABEL, ROLE_LABEL

# Reasons the kubelet or control plane put on a pod it took away.
EVICTED = "Evicted"
PREEMPTED = "Preempted"


def _int_label(labels: dict[str, str], key: str) -> int | None:
    try:
        return int(labels[key])
    except (KeyError, ValueError):
        return None


def parse_time(raw: str | None) -> datetime | None:
    if not raw:
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None


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
        exit_code, reason, message = _termination(status)
        disruption = _disruption(status)
        if status.get("reason") in (EVICTED, PREEMPTED):
            reason, message = status["reason"], status.get("message") or message
        elif disruption is not None:
            reason, message = disruption
        return cls(
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            role=role,
            node_rank=rank,
            restart=restart,
            phase=status.get("phase") or "Pending",
            deleting=bool(meta.get("deletionTimestamp")),
            node_name=(pod.get("spec") or {}).get("nodeName"),
            pod_ip=status.get("podIP"),
            exit_code=exit_code,
            reason=reason,
            message=message,
            disrupted=status.get("reason") in (EVICTED, PREEMPTED) or disruption is not None,
            owner_uid=next(
                (
                    ref.get("uid")
                    for ref in meta.get("ownerReferences") or ()
                    if ref.get("controller")
                ),
                None,
            ),
        )


def _termination(status: dict[str, Any]) -> tuple[int | None, str | None, str | None]:
    """The first non-zero exit among the containers (else the first exit)."""
    first: tuple[int | None, str | None, str | None] = (None, None, None)
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        terminated = state.get("terminated") or (container.get("lastState") or {}).get("terminated")
        if not terminated:
            continue
        found = (terminated.get("exitCode"), terminated.get("reason"), terminated.get("message"))
        if found[0]:
            return found
        if first[0] is None:
            first = found
    return first


def _disruption(status: dict[str, Any]) -> tuple[str, str | None] | None:
    """The DisruptionTarget condition: preemption, taint eviction, API eviction."""
    for condition in status.get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            return condition.get("reason") or "DisruptionTarget", condition.get("message")
    return None


@dataclass(frozen=True)
class ObservedNode:
    name: str
    ready: bool
    since: datetime | None = None  # when Ready last changed

    @classmethod
    def from_manifest(cls, node: dict[str, Any]) -> ObservedNode:
        meta = node.get("metadata") or {}
        for condition in (node.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "Ready":
                return cls(
                    name=meta.get("name", ""),
                    ready=condition.get("status") == "True",
                    since=parse_time(condition.get("lastTransitionTime")),
                )
        return cls(name=meta.get("name", ""), ready=False, since=None)


@dataclass(frozen=True)
class Observed:
    """Everything one reconcile pass knows besides the job itself."""

    pods: tuple[ObservedPod, ...] = ()
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
