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
* admitted by topology-aware scheduling (a podSetAssignment with a
  ``topologyAssignment``): each pod also gets its own domain's node labels
  (see ``topology_domains`` for why the operator places the pods itself);
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

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from torchfleet_operator.api import reasons as r
from torchfleet_operator.api.constants import KUEUE_QUEUE_LABEL
from torchfleet_operator.api.v1alpha1 import TrainingJobSpec
from torchfleet_operator.desired.workload import KUEUE_API
from torchfleet_operator.observed import Flavor, ObservedWorkload

# What Kueue's TAS reads on a pod: the topology annotations make it a TAS pod
# (its usage is the Workload's, not counted again as non-TAS usage of its node);
# the Workload annotation and PodSet label are jobframework's, for Kueue's pod
# lookups (node-failure replacement, its ungater's bookkeeping).
TOPOLOGY_ANNOTATIONS = {
    "required": "kueue.x-k8s.io/podset-required-topology",
    "preferred": "kueue.x-k8s.io/podset-preferred-topology",
}
UNCONSTRAINED_TOPOLOGY_ANNOTATION = "kueue.x-k8s.io/podset-unconstrained-topology"
WORKLOAD_ANNOTATION = "kueue.x-k8s.io/workload"
POD_SET_LABEL = "kueue.x-k8s.io/podset"
# Admission with the topology still to come (a ProvisioningRequest first).
DELAYED_TOPOLOGY_PENDING = "Pending"

# The field manager Kueue writes admission with; a server-side apply under it
# without status.admission removes the admission (as jobframework does).
ADMISSION_FIELD_MANAGER = "kueue-admission"
# Status fields Kueue's admission apply keeps as they are when it drops an
# admission (Kueue v0.17 pkg/workload admissionStatusPatch).
ADMISSION_KEPT_FIELDS = (
    "accumulatedPastExecutionTimeSeconds",
    "schedulingStats",
    "clusterName",
    "nominatedClusterNames",
    "unhealthyNodes",
    "preemptionGates",
)
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
    # TAS: the node labels of each pod's domain, by the pod's index in its PodSet.
    domains: tuple[dict[str, str], ...] = ()


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
        name = str(assignment.get("name"))
        infos[name] = PodSetInfo(selector, tuple(tolerations))
        domains = topology_domains(assignment.get("topologyAssignment"))
        if domains is not None:
            infos[name] = _placed(infos[name], workload, name, domains)
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
                base.domains,
            )
    return infos


def topology_domains(assignment: Any) -> tuple[dict[str, str], ...] | None:
    """The node labels of each pod's domain, in rank order, from a PodSet's
    ``topologyAssignment`` (None: not admitted by TAS; ValueError: unreadable).

    Kueue's own jobs create their pods gated (``kueue.x-k8s.io/topology``) and its
    TopologyUngater writes each one's domain into its nodeSelector. The operator
    creates the pods itself, after admission, so it reads the assignment and
    creates every pod with its domain already set: nothing waits on a second
    controller's patch, no pod sits gated if Kueue's ungater is slow or finds the
    pods by labels it does not expect, and rank 0 (the master) and consecutive
    workers fill the domains in Kueue's order, as the ungater's rank mode would.

    Both API versions: v1beta1 lists ``domains`` ({values, count}); v1beta2
    compresses them into ``slices`` (domainCount; per level a ``universal`` value
    or ``individual`` roots with an optional prefix and suffix; podCounts
    ``universal`` or ``individual``), decoded as Kueue's InternalSeqFrom does."""
    if not isinstance(assignment, dict):
        return None
    levels = assignment.get("levels")
    if not isinstance(levels, list) or not levels:
        raise ValueError(f"topologyAssignment without levels: {assignment!r}")
    placed: list[dict[str, str]] = []
    try:
        for values, count in _assigned_domains(assignment):
            if len(values) != len(levels) or count < 0:
                raise ValueError(f"domain {values!r} does not match the levels {levels!r}")
            placed += [dict(zip(map(str, levels), values, strict=True))] * count
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as exc:
        raise ValueError(f"unreadable topologyAssignment: {exc!r}") from exc
    return tuple(placed)


def _assigned_domains(assignment: dict[str, Any]) -> Iterator[tuple[list[str], int]]:
    for domain in assignment.get("domains") or ():  # v1beta1
        yield [str(v) for v in domain["values"]], int(domain["count"])
    for piece in assignment.get("slices") or ():  # v1beta2
        counts = piece["podCounts"]
        for i in range(int(piece["domainCount"])):
            count = counts["universal"] if "universal" in counts else counts["individual"][i]
            yield [_level_value(level, i) for level in piece["valuesPerLevel"]], int(count)


def _level_value(level: dict[str, Any], index: int) -> str:
    if "universal" in level:
        return str(level["universal"])
    values = level["individual"]
    return f"{values.get('prefix') or ''}{values['roots'][index]}{values.get('suffix') or ''}"


def _placed(
    info: PodSetInfo, workload: ObservedWorkload, pod_set: str, domains: tuple[dict[str, str], ...]
) -> PodSetInfo:
    """A TAS-admitted PodSet's pods: their domains, and the marks Kueue reads
    (jobframework's getPodSetsInfoFromStatus + podset.FromAssignment)."""
    request = next(
        (
            p.get("topologyRequest") or {}
            for p in workload.spec.get("podSets") or ()
            if p.get("name") == pod_set
        ),
        {},
    )
    annotations = {
        TOPOLOGY_ANNOTATIONS[kind]: str(request[kind])
        for kind in TOPOLOGY_ANNOTATIONS
        if request.get(kind)
    } or {UNCONSTRAINED_TOPOLOGY_ANNOTATION: "true"}  # a TAS flavor, no request of ours
    annotations[WORKLOAD_ANNOTATION] = workload.name
    return PodSetInfo(
        info.node_selector,
        info.tolerations,
        {**info.labels, POD_SET_LABEL: pod_set},
        {**info.annotations, **annotations},
        domains,
    )


def topology_pending(workload: ObservedWorkload) -> bool:
    """Admitted, but a PodSet's topology is still to be assigned (delayed
    topology request): no pod can be placed yet."""
    admission = workload.status.get("admission") or {}
    return any(
        a.get("delayedTopologyRequest") == DELAYED_TOPOLOGY_PENDING
        and not a.get("topologyAssignment")
        for a in admission.get("podSetAssignments") or ()
    )


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


def apply_pod_set_info(pod: dict[str, Any], info: PodSetInfo, index: int = 0) -> dict[str, Any]:
    """The pod with the admission's placement added (RunWithPodSetsInfo); ``index``
    is the pod's place in its PodSet (its TAS domain)."""
    spec = dict(pod["spec"])
    selector = dict(spec.get("nodeSelector") or {})
    wanted = dict(info.node_selector)
    if info.domains:
        if index >= len(info.domains):
            raise ConflictError(
                f"pod {index} of its PodSet has no domain in the topology assignment "
                f"({len(info.domains)} pods placed)"
            )
        wanted.update(info.domains[index])
    for key, value in wanted.items():
        if key in selector and selector[key] != value:
            raise ConflictError(
                f"nodeSelector {key}={selector[key]} of the pod template conflicts with "
                f"{key}={value} of the admission (flavor or topology domain)"
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
    # Kept as they are: Kueue writes its admission checks' states under this
    # field manager too, and an apply without them would drop their required
    # state and message (the API server refuses that: 422).
    if workload.status.get("admissionChecks"):
        status["admissionChecks"] = workload.status["admissionChecks"]
    # And what else Kueue's own admission apply carries over (workload.go's
    # admissionStatusPatch): left out, the apply would drop them, Kueue's
    # eviction counts (schedulingStats) among them.
    for kept in ADMISSION_KEPT_FIELDS:
        if workload.status.get(kept) is not None:
            status[kept] = workload.status[kept]
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
