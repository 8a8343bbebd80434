"""The GangScheduled condition: the PodGroup's phase and its scheduler's reason.

A gang scheduler (scheduler-plugins Coscheduling, Volcano) binds all pods of
a gang or none. While it binds none, the job's status says so and why, in the
scheduler's own words: Volcano's PodGroup ``Unschedulable`` condition, or the
pods' ``PodScheduled`` message (what Coscheduling and Volcano write when they
refuse a pod). Pure: the PodGroup comes in as an :class:`ObservedPodGroup`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchfleet_operator.status import conditions as cond

if TYPE_CHECKING:
    from torchfleet_operator.observed import ObservedPod

CONDITION_GANG_SCHEDULED = "GangScheduled"
KIND_OF_GROUP = {"scheduling.x-k8s.io": "Coscheduling", "scheduling.volcano.sh": "Volcano"}
# scheduler-plugins' controller never leaves these once a gang ended (it stops
# reconciling the group), so after a gang restart they describe the old pods.
_STALE_COSCHEDULING_PHASES = ("Failed", "Finished")
# Volcano: a Pending group has not been admitted from its queue (the queue's
# capability or the cluster cannot hold its minResources); Inqueue: admitted,
# waiting for nodes.
_VOLCANO_PHASE_MEANING = {
    "Pending": "not admitted from queue {queue}: the queue's capability or the cluster's "
    "free resources cannot hold the gang's minResources",
    "Inqueue": "admitted from queue {queue}, waiting for nodes that hold the whole gang",
}
_MAX_MESSAGE = 1024


@dataclass(frozen=True)
class ObservedPodGroup:
    """What the operator reads of its PodGroup."""

    kind: str  # Coscheduling | Volcano
    phase: str | None = None
    queue: str | None = None
    unschedulable: str | None = None  # Volcano's Unschedulable condition: "reason: message"
    owner_uid: str | None = None

    @classmethod
    def from_manifest(cls, group: dict[str, Any]) -> ObservedPodGroup | None:
        """None for anything that is not a PodGroup of a known scheduler."""
        api_group = str(group.get("apiVersion") or "").split("/")[0]
        kind = KIND_OF_GROUP.get(api_group)
        if kind is None or group.get("kind") != "PodGroup":
            return None
        meta = group.get("metadata") or {}
        status = group.get("status") or {}
        return cls(
            kind=kind,
            phase=_text(status.get("phase")),
            queue=_text((group.get("spec") or {}).get("queue")),
            unschedulable=_unschedulable(status.get("conditions")),
            owner_uid=next(
                (r.get("uid") for r in meta.get("ownerReferences") or () if r.get("controller")),
                None,
            ),
        )


def _text(value: Any) -> str | None:
    return value[:_MAX_MESSAGE] if isinstance(value, str) and value else None


def _unschedulable(conditions: Any) -> str | None:
    for condition in conditions if isinstance(conditions, list) else ():
        if not isinstance(condition, dict):
            continue
        if condition.get("type") == "Unschedulable" and condition.get("status") == "True":
            parts = [_text(condition.get("reason")), _text(condition.get("message"))]
            return ": ".join(p for p in parts if p) or "Unschedulable"
    return None


def mirror(
    status: dict[str, Any],
    pod_group_kind: str,
    gang: list[ObservedPod],
    nodes: int,
    group: ObservedPodGroup | None,
    now: str,
) -> dict[str, Any]:
    """``status`` with the GangScheduled condition decided for the current gang.

    Unchanged without gang scheduling, and until the PodGroup is seen (its CRD
    may be missing: the ChildrenRejected condition says so)."""
    if pod_group_kind == "None" or group is None or group.kind != pod_group_kind:
        return status
    live = [p for p in gang if not p.deleting]
    placed = sum(1 for p in live if p.node_name)
    if placed >= nodes:
        value, reason = True, "GangScheduled"
        message = f"all {nodes} pods of the gang are placed ({group.kind} PodGroup "
        message += f"{group.phase or 'without a phase yet'})"
    else:
        value, reason, message = False, *_waiting(group, live, placed, nodes)
    conditions = cond.set_condition(
        status.get("conditions"), CONDITION_GANG_SCHEDULED, value, reason, message, now
    )
    return {**status, "conditions": conditions}


def _waiting(
    group: ObservedPodGroup, live: list[ObservedPod], placed: int, nodes: int
) -> tuple[str, str]:
    phase = group.phase
    if group.kind == "Coscheduling" and phase in _STALE_COSCHEDULING_PHASES:
        phase = None
    reason = f"PodGroup{phase}" if phase else "GangWaiting"
    message = f"{placed} of {nodes} pods placed; {group.kind} PodGroup phase {phase or 'unset'}"
    meaning = _VOLCANO_PHASE_MEANING.get(phase or "") if group.kind == "Volcano" else None
    if meaning:
        message += f" ({meaning.format(queue=group.queue or 'default')})"
    said = group.unschedulable or next((p.unschedulable for p in live if p.unschedulable), None)
    if said:
        message += f": {said}"
    return reason, message[:_MAX_MESSAGE]
