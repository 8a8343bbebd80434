"""The gang policy: create what the current gang misses, and read its phase
and the Created/Running/Scheduled conditions from its pods. Pure.

Children have deterministic names: a pod, Service, claim or PodGroup that
exists already is success, so creating what is missing is the whole job. The
apiserver's refusals wait for their back-off (``Observed.held``); a refused
Service, claim or PodGroup holds back the pods that need it.
"""

from __future__ import annotations

from typing import Any

from torchfleet_operator.api import constants as c
from torchfleet_operator.api import reasons as r
from torchfleet_operator.api.v1alpha1 import TrainingJobSpec
from torchfleet_operator.desired import names, podgroup, pvc, service
from torchfleet_operator.desired.pods import build_pod, pod_name_for_rank
from torchfleet_operator.observed import ObservedPod
from torchfleet_operator.planning import Pass
from torchfleet_operator.policy import elastic
from torchfleet_operator.status import podgroup as podgroup_status
from torchfleet_operator.status import restarts
from torchfleet_operator.status.counts import running


def create_missing(
    step: Pass,
    spec: TrainingJobSpec,
    gang: list[ObservedPod],
    restart: int,
    image: str,
    shm_size: str | None,
) -> None:
    observed = step.observed
    plan_create = step.plan.create
    if not observed.has_service:
        plan_create.append(service.headless_service(step.name, step.namespace, step.uid))
    template = spec.checkpoint.claim_template if spec.checkpoint else None
    if template is not None and not observed.has_checkpoint_claim:
        plan_create.append(pvc.checkpoint_claim(step.name, step.namespace, step.uid, template))
    # Pods the apiserver refused a moment ago wait for their back-off.
    skip = {p.name for p in gang} | observed.expected_created | observed.held
    health = step.status.health
    avoid = (health.avoided_nodes if health is not None else None) or ()
    pods = [
        build_pod(step.name, step.namespace, step.uid, spec, rank, restart, image, shm_size, avoid)
        for rank in range(spec.nodes)
        if pod_name_for_rank(step.name, rank) not in skip
    ]
    # The PodGroup is not watched (its CRD may not exist): it is posted with
    # every batch of pods that need it, and a 409 means it is there. So a group
    # deleted by hand is back before the next gang is scheduled.
    if pods:
        plan_create.extend(
            podgroup.gang_objects(
                step.name, step.namespace, step.uid, spec, restart, observed.native_api
            )
        )
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


def observe(step: Pass, spec: TrainingJobSpec, gang: list[ObservedPod], desired: int) -> None:
    """Phase and the Created/Running/Scheduled/GangScheduled conditions from
    the gang; ``desired`` is the spec's size, more than ``spec.nodes`` when
    Kueue admitted an elastic job partially."""
    _phase_from_gang(step, spec, gang, desired)
    given = {"conditions": step.wire_conditions()}
    mirrored = podgroup_status.mirror(
        given,
        spec.scheduling.pod_group,
        gang,
        podgroup.min_members(spec),
        step.observed.pod_group,
        step.stamp,
    )
    if mirrored is not given:  # the GangScheduled condition was decided
        step.set_wire_conditions(mirrored["conditions"])


def _phase_from_gang(
    step: Pass, spec: TrainingJobSpec, gang: list[ObservedPod], desired: int
) -> None:
    nodes = spec.nodes
    running_now = len(running(gang))
    created = len({p.name for p in gang} | step.observed.expected_created)
    if created >= nodes:
        step.set_condition(
            r.CONDITION_CREATED,
            True,
            r.REASON_GANG_CREATED,
            f"all {nodes} pods of gang {restarts.gang(step.status)} exist",
        )
    _scheduling(step, gang)
    if spec.elastic is not None:
        trains = elastic.runs(
            running(gang), names.master_pod_name(step.name), spec.elastic.min_nodes
        )
        message = (
            f"{running_now} of {nodes} pods are running, the master among them "
            f"(elastic: at least {spec.elastic.min_nodes})"
        )
        if desired > nodes:
            message += f"; Kueue admitted {nodes} of the {desired} pods asked for"
        if not trains and step.is_true(r.CONDITION_RUNNING):
            # It shrank below minNodes (or lost its master): the agents wait for
            # enough nodes to rendezvous, nothing trains meanwhile.
            step.set_condition(
                r.CONDITION_RUNNING,
                False,
                r.REASON_BELOW_MIN_NODES,
                f"{running_now} of {nodes} pods are running; an elastic job trains with at "
                f"least {spec.elastic.min_nodes}, the master among them",
            )
    else:
        trains, message = running_now == nodes, f"all {nodes} pods are running"
    if trains:
        step.set_phase(c.PHASE_RUNNING)
        step.set_condition(r.CONDITION_RUNNING, True, r.REASON_GANG_RUNNING, message)
        step.clear_condition(
            r.CONDITION_RESTARTING,
            r.REASON_GANG_RUNNING,
            f"gang {restarts.gang(step.status)} is running",
        )
    elif step.phase != c.PHASE_RESTARTING or not step.is_true(r.CONDITION_RESTARTING):
        step.set_phase(c.PHASE_PENDING)


def _scheduling(step: Pass, gang: list[ObservedPod]) -> None:
    """Why a gang waits: the scheduler's words for its first unscheduled pod."""
    waiting = sorted(
        (p for p in gang if p.unschedulable and not p.deleting), key=lambda p: p.node_rank
    )
    if waiting:
        first = waiting[0]
        more = f" (and {len(waiting) - 1} more pods)" if len(waiting) > 1 else ""
        reason, _, message = first.unschedulable.partition(": ")  # type: ignore[union-attr]
        step.set_condition(
            r.CONDITION_SCHEDULED, False, reason, f"pod {first.name}: {message}{more}"
        )
    elif step.condition(r.CONDITION_SCHEDULED) is not None:
        step.set_condition(
            r.CONDITION_SCHEDULED, True, r.REASON_GANG_SCHEDULED, "every pod is scheduled"
        )
