"""The GangScheduled condition: the PodGroup's phase and its scheduler's reason.

A gang scheduler (scheduler-plugins Coscheduling, Volcano, kube-scheduler's
own GangScheduling) binds all pods of a gang or none. While it binds none, the
job's status says so and why, in the scheduler's own words: Volcano's PodGroup
``Unschedulable`` condition, Kubernetes' ``PodGroupScheduled=False``, or the
pods' ``PodScheduled`` message (what each writes when it refuses a pod).
Pure: the PodGroup comes in as an ``observed.ObservedPodGroup``.
"""

from __future__ import annotations

from typing import Any

from torchfleet_operator.api import reasons as r
from torchfleet_operator.observed import ObservedPod, ObservedPodGroup
from torchfleet_operator.status import conditions as cond

# scheduler-plugins' controller never leaves these once a gang ended (it stops
# reconciling the group), so after a gang restart they describe the old pods.
# Kubernetes' "Scheduled" with pods unplaced is the last generation's group,
# seen before the new generation's group.
_STALE_PHASES = {"Coscheduling": ("Failed", "Finished"), "Kubernetes": ("Scheduled",)}
# Volcano: a Pending group has not been admitted from its queue (the queue's
# capability or the cluster cannot hold its minResources); Inqueue: admitted,
# waiting for nodes.
_VOLCANO_PHASE_MEANING = {
    "Pending": "not admitted from queue {queue}: the queue's capability or the cluster's "
    "free resources cannot hold the gang's minResources",
    "Inqueue": "admitted from queue {queue}, waiting for nodes that hold the whole gang",
}
_MAX_MESSAGE = 1024


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
        value, reason = True, r.REASON_GANG_SCHEDULED
        message = f"all {nodes} pods of the gang are placed ({group.kind} PodGroup "
        message += f"{group.phase or 'without a phase yet'})"
    else:
        value, reason, message = False, *_waiting(group, live, placed, nodes)
    conditions = cond.set_condition(
        status.get("conditions"), r.CONDITION_GANG_SCHEDULED, value, reason, message, now
    )
    return {**status, "conditions": conditions}


def _waiting(
    group: ObservedPodGroup, live: list[ObservedPod], placed: int, nodes: int
) -> tuple[str, str]:
    phase = group.phase
    if phase in _STALE_PHASES.get(group.kind, ()):
        phase = None
    reason = f"PodGroup{phase}" if phase else r.REASON_GANG_WAITING
    message = f"{placed} of {nodes} pods placed; {group.kind} PodGroup phase {phase or 'unset'}"
    meaning = _VOLCANO_PHASE_MEANING.get(phase or "") if group.kind == "Volcano" else None
    if meaning:
        message += f" ({meaning.format(queue=group.queue or 'default')})"
    said = group.unschedulable or next((p.unschedulable for p in live if p.unschedulable), None)
    if said:
        message += f": {said}"
    return reason, message[:_MAX_MESSAGE]
