"""Kueue admission of a queued TrainingJob: read the Workload, decide. Pure.

torchfleet's operator is TrainingJob's Kueue integration (Kueue knows the kind
as an external framework), so it does what Kueue's jobframework reconciler
does for its built-in jobs:

* no Workload yet: create it, and no pods;
* not admitted: no pods; the job mirrors the Workload's QuotaReserved and
  Admitted conditions (Kueue's own reason and message, e.g. "couldn't assign
  flavors to pod set master: insufficient quota for nvidia.com/gpu ...");
* admitted: the pods get the admitted flavors' nodeLabels as nodeSelector and
  their tolerations (RunWithPodSetsInfo), plus any admission check's
  podSetUpdates, and the gang is created;
* evicted (preemption, deactivation, a pods-ready timeout): stop the gang
  gracefully and, once no pod is left, clear the Workload's quota reservation
  (status.admission and the QuotaReserved/Admitted conditions, as
  jobframework's UnsetQuotaReservationWithCondition); Kueue then requeues it;
* the job finished: mark the Workload Finished so its quota is released.

Which jobs are queued: those with Kueue's ``kueue.x-k8s.io/queue-name`` label,
or with spec.scheduling.queueName unless podGroup is Volcano (there the field
names the Volcano queue of the PodGroup, not a Kueue LocalQueue).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchfleet_operator.api import reasons as r
from torchfleet_operator.api.constants import KUEUE_QUEUE_LABEL
from torchfleet_operator.api.v1alpha1 import TrainingJobSpec
from torchfleet_operator.build.workload import KUEUE_API
from torchfleet_operator.observed import Flavor, ObservedWorkload

# The field manager Kueue writes admission with; a server-side apply under it
# without status.admission removes the admission (as jobframework does).
ADMISSION_FIELD_MANAGER = "kueue-admission"
FINISHED_FIELD_MANAGER = "torchfleet-operator-Finished"


def kueue_queue(spec: TrainingJobSpec, job_labels: dict[str, str] | None) -> str | None:
    """The Kueue LocalQueue a job is submitted to, or None when Kueue does not manage it."""
    label = (job_labels or {}).get(KUEUE_QUEUE_LABEL)
    if label:
        return label
    if spec.scheduling.queue_name and spec.scheduling.pod_group != "Volcano":
        return spec.scheduling.queue_name
    return None


@dataclass(frozen=True)
class PodSetInfo:
    """What admission adds to the pods of one PodSet (Kueue's podset.PodSetInfo)."""

    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


def pod_set_infos(workload: ObservedWorkload, flavors: dict[str, Flavor]) -> dict[str, PodSetInfo]:
    """Per PodSet name: the admitted flavors' node labels and tolerations, then the
    admission checks' podSetUpdates (Kueue's FromAssignment + Merge)."""
    admission = workload.status.get("admission") or {}
    infos: dict[str, PodSetInfo] = {}
    for assignment in admission.get("podSetAssignments") or []:
        selector: dict[str, str] = {}
        tolerations: list[dict[str, Any]] = []
        seen: set[str] = set()
        for flavor_name in (assignment.get("flavors") or {}).values():
            if flavor_name in seen:
                continue
            seen.add(flavor_name)
            flavor = flavors.get(flavor_name, Flavor())
            for key, value in flavor.node_labels.items():
                selector.setdefault(key, value)  # the first flavor wins, as MergeKeepFirst
            tolerations += [t for t in flavor.tolerations if t not in tolerations]
        infos[str(assignment.get("name"))] = PodSetInfo(selector, tuple(tolerations))
    for check in workload.status.get("admissionChecks") or []:
        for update in check.get("podSetUpdates") or []:
            name = str(update.get("name"))
            base = infos.get(name, PodSetInfo())
            infos[name] = PodSetInfo(
                {**(update.get("nodeSelector") or {}), **base.node_selector},
                base.tolerations
                + tuple(t for t in update.get("tolerations") or () if t not in base.tolerations),
                {**(update.get("labels") or {}), **base.labels},
                {**(update.get("annotations") or {}), **base.annotations},
            )
    return infos


def admitted_count(workload: ObservedWorkload, pod_set: str) -> int | None:
    """How many pods of ``pod_set`` the admission grants; None when it does not
    say (Kueue writes a count for each PodSet it admits)."""
    admission = workload.status.get("admission") or {}
    for assignment in admission.get("podSetAssignments") or []:
        if assignment.get("name") == pod_set:
            count = assignment.get("count")
            valid = isinstance(count, int) and not isinstance(count, bool) and count >= 0
            return count if valid else None
    return None


def missing_flavors(workload: ObservedWorkload, flavors: dict[str, Flavor]) -> list[str]:
    """Flavors the admission names that the operator has not seen (yet)."""
    admission = workload.status.get("admission") or {}
    return sorted(
        {
            str(name)
            for assignment in admission.get("podSetAssignments") or []
            for name in (assignment.get("flavors") or {}).values()
            if name not in flavors
        }
    )


class ConflictError(ValueError):
    """The admission asks for a node label the pod template already sets otherwise."""


def apply_pod_set_info(pod: dict[str, Any], info: PodSetInfo) -> dict[str, Any]:
    """The pod with the admission's placement added (RunWithPodSetsInfo)."""
    spec = dict(pod["spec"])
    selector = dict(spec.get("nodeSelector") or {})
    for key, value in info.node_selector.items():
        if key in selector and selector[key] != value:
            raise ConflictError(
                f"nodeSelector {key}={selector[key]} of the pod template conflicts with "
                f"{key}={value} of the admitted flavor"
            )
        selector[key] = value
    if selector:
        spec["nodeSelector"] = selector
    tolerations = list(spec.get("tolerations") or [])
    tolerations += [t for t in info.tolerations if t not in tolerations]
    if tolerations:
        spec["tolerations"] = tolerations
    meta = dict(pod["metadata"])
    meta["labels"] = {**info.labels, **(meta.get("labels") or {})}
    meta["annotations"] = {**info.annotations, **(meta.get("annotations") or {})}
    return {**pod, "metadata": meta, "spec": spec}


def mirrored_conditions(workload: ObservedWorkload | None) -> list[tuple[str, bool, str, str]]:
    """(type, status, reason, message) of the job's QuotaReserved and Admitted,
    copied from the Workload, so ``kubectl describe tj`` says what Kueue says."""
    found = []
    for type_ in (r.WORKLOAD_QUOTA_RESERVED, r.WORKLOAD_ADMITTED):
        cond = workload.condition(type_) if workload else None
        if cond is None:
            reason, message = (
                r.REASON_WORKLOAD_PENDING,
                "waiting for Kueue to consider the Workload",
            )
            if workload is None:
                message = "the Workload is being created"
            found.append((type_, False, reason, message))
        else:
            found.append(
                (
                    type_,
                    cond.get("status") == "True",
                    str(cond.get("reason") or type_),
                    str(cond.get("message") or ""),
                )
            )
    return found


def kueue_missing_message(queue: str) -> str:
    return (
        f"the job is queued for Kueue (LocalQueue {queue!r}) but this cluster does not serve "
        "Kueue's Workload API (kueue.x-k8s.io v1beta1 or v1beta2): install Kueue, or remove "
        "spec.scheduling.queueName and the kueue.x-k8s.io/queue-name label"
    )


def _condition(
    type_: str, status: bool, reason: str, message: str, now: str, generation: Any
) -> dict[str, Any]:
    body = {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": now,
    }
    if generation is not None:
        body["observedGeneration"] = generation
    return body


def _apply_base(workload: ObservedWorkload) -> dict[str, Any]:
    meta = workload.metadata
    return {
        "apiVersion": workload.manifest.get("apiVersion", KUEUE_API),
        "kind": "Workload",
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
        },
    }


def clear_reservation(workload: ObservedWorkload, now: str) -> dict[str, Any]:
    """Server-side apply body (field manager ``kueue-admission``) that drops the
    admission of an evicted Workload whose pods are gone: QuotaReserved False
    (Pending), Admitted False (NoReservation), Requeued True after a
    preemption, as jobframework's eviction step does. resourceVersion makes it
    fail rather than undo a newer change of Kueue's."""
    evicted = workload.condition(r.WORKLOAD_EVICTED) or {}
    message = str(evicted.get("message") or "the Workload was evicted")
    generation = workload.metadata.get("generation")
    managed = (
        r.WORKLOAD_QUOTA_RESERVED,
        r.WORKLOAD_EVICTED,
        r.WORKLOAD_ADMITTED,
        r.WORKLOAD_PREEMPTED,
        r.WORKLOAD_REQUEUED,
        r.WORKLOAD_DEACTIVATION_TARGET,
    )
    conditions = {
        c["type"]: c for c in workload.status.get("conditions") or () if c.get("type") in managed
    }
    conditions[r.WORKLOAD_QUOTA_RESERVED] = _condition(
        r.WORKLOAD_QUOTA_RESERVED, False, r.WORKLOAD_REASON_PENDING, message, now, generation
    )
    if r.WORKLOAD_ADMITTED in conditions or workload.is_true(r.WORKLOAD_ADMITTED):
        conditions[r.WORKLOAD_ADMITTED] = _condition(
            r.WORKLOAD_ADMITTED,
            False,
            r.WORKLOAD_REASON_NO_RESERVATION,
            "The workload has no reservation",
            now,
            generation,
        )
    requeued = evicted.get("reason") == r.WORKLOAD_PREEMPTED
    conditions[r.WORKLOAD_REQUEUED] = _condition(
        r.WORKLOAD_REQUEUED,
        requeued,
        str(evicted.get("reason") or r.WORKLOAD_EVICTED),
        message,
        now,
        generation,
    )
    for type_, cond in conditions.items():  # unchanged ones keep their transition time
        old = workload.condition(type_)
        if old and old.get("status") == cond["status"] and old.get("lastTransitionTime"):
            cond["lastTransitionTime"] = old["lastTransitionTime"]
    body = _apply_base(workload)
    body["metadata"]["resourceVersion"] = workload.metadata.get("resourceVersion")
    status: dict[str, Any] = {"conditions": list(conditions.values())}
    if workload.status.get("requeueState"):
        status["requeueState"] = workload.status["requeueState"]
    if workload.status.get("resourceRequests"):
        status["resourceRequests"] = workload.status["resourceRequests"]
    body["status"] = status
    return body


def mark_finished(
    workload: ObservedWorkload, succeeded: bool, message: str, now: str
) -> dict[str, Any]:
    """Server-side apply body that sets the Workload's Finished condition (quota released)."""
    body = _apply_base(workload)
    reason = r.REASON_SUCCEEDED if succeeded else r.REASON_FAILED
    generation = workload.metadata.get("generation")
    body["status"] = {
        "conditions": [_condition(r.WORKLOAD_FINISHED, True, reason, message, now, generation)]
    }
    return body
