"""The Kueue Workload of a queued TrainingJob: what the gang asks the queue for. Pure.

As Kueue's own job integrations do (jobframework): one Workload per job,
controlled by it, named as jobframework names them (``trainingjob-<job>-<hash>``,
the hash over kind, group, name and uid, so a re-created job gets a new one),
with the queue name, the priority and one PodSet per role whose template
carries the pods' real scheduling inputs (resource requests, nodeSelector,
tolerations, affinity), from the same builder that makes the pods. An elastic
job's worker PodSet has a minCount, so that Kueue may admit it partially
(fewer workers, never below minNodes) when the queue has no room for all.
The API version is the one the installed Kueue prefers (``preferred_api_version``
over the served versions of its Workload CRD, read at start): Kueue 0.10 serves
only v1beta1; 0.15+ serve v1beta1 and v1beta2 and store v1beta2. The one field
of ours that differs between them is the priority class: v1beta1's
``priorityClassName`` + ``priorityClassSource`` became v1beta2's
``priorityClassRef`` (group, kind, name). PodSets, admission and podSetAssignments
keep their shapes.

The priority: Kueue's ``kueue.x-k8s.io/priority-class`` label on the job names a
WorkloadPriorityClass, which then orders the queue (its value is the
Workload's priority; the pods keep their own PriorityClass); else the
PriorityClass of spec.scheduling.priorityClassName. ``spec.active`` follows
spec.suspend: a job suspended while queued deactivates its Workload (Kueue
drops it from the queue, or evicts it if admitted) and the Workload stays, so
the job keeps its place (Kueue orders by the Workload's creation time) when
resumed. The annotation ``torchfleet.dev/suspended`` says the job did it, so
only the job's resume reactivates it (not a Workload someone else deactivated).
The PodSets' hash is kept in an annotation: a job whose PodSets change while
its Workload waits (no quota reserved) gets a new Workload, as jobframework
replaces one that no longer matches its job.

spec.scheduling.topology becomes each PodSet's ``topologyRequest`` (Kueue's
topology-aware scheduling, TAS: ``required`` or ``preferred`` is the level's
node label), and master and worker form one PodSet group (``podSetGroupName``,
in 0.17, not in 0.10: a group of exactly two PodSets, one of them a single pod,
placed together in one domain as a LeaderWorkerSet's leader and workers are),
so the whole gang, not each role on its own, is packed. Kueue 0.10 drops the group
(it has no such field) and ignores the request unless its alpha
TopologyAwareScheduling gate is on.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from torchfleet_operator.api.constants import (
    GROUP,
    KIND,
    KUEUE_PRIORITY_CLASS_LABEL,
    KUEUE_QUEUE_LABEL,
)
from torchfleet_operator.api.v1alpha1 import TrainingJobSpec
from torchfleet_operator.desired import labels, names
from torchfleet_operator.desired.pods import build_pod

KUEUE_GROUP = "kueue.x-k8s.io"
WORKLOAD_CRD = f"workloads.{KUEUE_GROUP}"
# The Workload API versions this builder writes, most preferred first.
SUPPORTED_VERSIONS = ("v1beta2", "v1beta1")
# Before discovery has answered (and Kueue 0.10, the oldest supported).
KUEUE_API = f"{KUEUE_GROUP}/v1beta1"
WORKLOAD_KIND = "Workload"
WORKLOAD_PLURAL = "workloads"
# Kueue labels a Workload with its job's uid (jobframework's JobUIDLabel).
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
PRIORITY_CLASS_SOURCE = "scheduling.k8s.io/priorityclass"  # v1beta1
PRIORITY_CLASS_REF = {"group": "scheduling.k8s.io", "kind": "PriorityClass"}  # v1beta2
WORKLOAD_PRIORITY_CLASS_SOURCE = "kueue.x-k8s.io/workloadpriorityclass"  # v1beta1
WORKLOAD_PRIORITY_CLASS_REF = {"group": KUEUE_GROUP, "kind": "WorkloadPriorityClass"}  # v1beta2
# The job deactivated its Workload (spec.suspend); only its resume reactivates it.
SUSPENDED_ANNOTATION = "torchfleet.dev/suspended"
# What the job asked for: a Workload whose PodSets no longer match is replaced.
POD_SETS_HASH_ANNOTATION = "torchfleet.dev/pod-sets-hash"
# The PodSet group of master and workers (topologyRequest.podSetGroupName).
GANG_POD_SET_GROUP = "gang"
# Pod spec fields Kueue reads from a PodSet template: requests (containers,
# init containers, overhead) and where the pods may go (flavor matching).
_SCHEDULING_FIELDS = (
    "nodeSelector",
    "tolerations",
    "affinity",
    "priorityClassName",
    "runtimeClassName",
    "overhead",
    "schedulerName",
)
_CONTAINER_FIELDS = ("name", "image", "resources", "restartPolicy")


def preferred_api_version(served: list[str]) -> str | None:
    """The Workload apiVersion to use, given the versions Kueue's Workload CRD
    serves: the most preferred one this builder knows (None: none of them).
    It is the version the apiserver's discovery prefers as well (beta2 over
    beta1), which is the one the operator's version-less watches receive."""
    for version in SUPPORTED_VERSIONS:
        if version in served:
            return f"{KUEUE_GROUP}/{version}"
    return None


def served_versions(crd: dict[str, Any]) -> list[str]:
    """The served versions of a CustomResourceDefinition manifest."""
    return [
        str(v.get("name"))
        for v in (crd.get("spec") or {}).get("versions") or []
        if isinstance(v, dict) and v.get("served")
    ]


def workload_name(job: str, uid: str) -> str:
    """jobframework's GetWorkloadNameForOwnerWithGVK, for TrainingJob."""
    digest = hashlib.sha1(f"{KIND}\n{GROUP}\n{job}\n{uid}".encode()).hexdigest()
    return f"{KIND.lower()}-{job}-{digest[:5]}"


def queue_name(spec: TrainingJobSpec, job_labels: dict[str, str] | None) -> str | None:
    """spec.scheduling.queueName, else Kueue's queue-name label on the job."""
    return spec.scheduling.queue_name or (job_labels or {}).get(KUEUE_QUEUE_LABEL) or None


def _template(pod: dict[str, Any]) -> dict[str, Any]:
    spec = pod["spec"]
    template_spec: dict[str, Any] = {k: spec[k] for k in _SCHEDULING_FIELDS if k in spec}
    for key in ("containers", "initContainers"):
        if spec.get(key):
            template_spec[key] = [{k: c[k] for k in _CONTAINER_FIELDS if k in c} for c in spec[key]]
    return {
        "metadata": {"labels": dict(pod["metadata"].get("labels") or {})},
        "spec": template_spec,
    }


def topology_request(spec: TrainingJobSpec, grouped: bool) -> dict[str, str] | None:
    """The PodSet's topologyRequest for spec.scheduling.topology (None: no request).
    ``grouped``: master and workers are one PodSet group, packed together."""
    topology = spec.scheduling.topology
    if topology is None:
        return None
    request = {topology.mode.lower(): topology.key}
    if grouped:
        request["podSetGroupName"] = GANG_POD_SET_GROUP
    return request


def pod_sets(
    job: str, namespace: str, uid: str, spec: TrainingJobSpec, image: str
) -> list[dict[str, Any]]:
    """One PodSet per role: master (count 1) and, when there are any, worker
    (count N); each with the topology request, when the job makes one."""
    sets = [
        {
            "name": names.MASTER_ROLE,
            "count": 1,
            "template": _template(build_pod(job, namespace, uid, spec, 0, 0, image)),
        }
    ]
    if spec.worker.replicas:
        workers: dict[str, Any] = {
            "name": names.WORKER_ROLE,
            "count": spec.worker.replicas,
            "template": _template(build_pod(job, namespace, uid, spec, 1, 0, image)),
        }
        least = min_workers(spec)
        if least < spec.worker.replicas:
            workers["minCount"] = least
        sets.append(workers)
    request = topology_request(spec, grouped=len(sets) == 2)
    if request is not None:
        for pod_set in sets:
            pod_set["topologyRequest"] = dict(request)
    return sets


def min_workers(spec: TrainingJobSpec) -> int:
    """The fewest workers an elastic job can start with (Kueue's partial
    admission: the worker PodSet's minCount, which must be at least 1); a fixed
    gang needs them all."""
    if spec.elastic is None:
        return spec.worker.replicas
    return max(1, spec.elastic.min_nodes - 1)


def workload_priority_class(job_labels: dict[str, str] | None) -> str | None:
    """The WorkloadPriorityClass the job's Kueue label names, if any."""
    return (job_labels or {}).get(KUEUE_PRIORITY_CLASS_LABEL) or None


def pod_sets_hash(sets: list[dict[str, Any]]) -> str:
    """A digest of what Kueue admits by: counts, requests, placement. Not the
    image nor the template's labels (an operator upgrade with a new default
    image or label must not requeue every waiting job at the back of its queue)."""
    kept = json.loads(json.dumps(sets))
    for pod_set in kept:
        pod_set["template"].pop("metadata", None)
        template_spec = pod_set["template"]["spec"]
        for key in ("containers", "initContainers"):
            for container in template_spec.get(key) or ():
                container.pop("image", None)
    encoded = json.dumps(kept, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


def workload(
    job: str,
    namespace: str,
    uid: str,
    spec: TrainingJobSpec,
    queue: str,
    priority: int | None,
    image: str,
    api_version: str = KUEUE_API,
    workload_priority_class: str | None = None,
) -> dict[str, Any]:
    """The Workload manifest in ``api_version``; ``priority`` is the value of
    the job's WorkloadPriorityClass (when it names one) or else PriorityClass."""
    sets = pod_sets(job, namespace, uid, spec, image)
    body: dict[str, Any] = {"queueName": queue, "podSets": sets}
    body.update(_priority_class(spec, api_version, workload_priority_class))
    # Kueue's webhook requires a priority with a class; without one it is 0.
    body["priority"] = priority or 0
    annotations = {POD_SETS_HASH_ANNOTATION: pod_sets_hash(sets)}
    if spec.suspend:
        body["active"] = False
        annotations[SUSPENDED_ANNOTATION] = "true"
    return {
        "apiVersion": api_version,
        "kind": WORKLOAD_KIND,
        "metadata": {
            "name": workload_name(job, uid),
            "namespace": namespace,
            "labels": {**labels.common_labels(job), JOB_UID_LABEL: uid},
            "annotations": annotations,
            "ownerReferences": [labels.owner_reference(job, uid)],
        },
        "spec": body,
    }


def _priority_class(
    spec: TrainingJobSpec, api_version: str, workload_class: str | None
) -> dict[str, Any]:
    """The priority class fields as ``api_version`` spells them."""
    if workload_class:
        if api_version == KUEUE_API:
            return {
                "priorityClassName": workload_class,
                "priorityClassSource": WORKLOAD_PRIORITY_CLASS_SOURCE,
            }
        return {"priorityClassRef": {**WORKLOAD_PRIORITY_CLASS_REF, "name": workload_class}}
    priority_class = spec.scheduling.priority_class_name
    if not priority_class:
        return {}
    if api_version == KUEUE_API:
        return {"priorityClassName": priority_class, "priorityClassSource": PRIORITY_CLASS_SOURCE}
    return {"priorityClassRef": {**PRIORITY_CLASS_REF, "name": priority_class}}


def activation(workload_manifest: dict[str, Any], active: bool) -> dict[str, Any]:
    """Merge patch of ``spec.active`` for the job's spec.suspend, with the mark
    that the job did it (removed again on resume)."""
    return {
        "apiVersion": workload_manifest.get("apiVersion", KUEUE_API),
        "metadata": {"annotations": {SUSPENDED_ANNOTATION: None if active else "true"}},
        "spec": {"active": active},
    }


def adoption(job: str, uid: str, api_version: str = KUEUE_API) -> dict[str, Any]:
    """Merge patch making the job the controller of a Workload it did not
    create (MultiKueue's copy on a worker), as jobframework's
    EnsurePrebuiltWorkloadOwnership does: owner reference and job uid label."""
    return {
        "apiVersion": api_version,
        "metadata": {
            "labels": {JOB_UID_LABEL: uid},
            "ownerReferences": [labels.owner_reference(job, uid)],
        },
    }
