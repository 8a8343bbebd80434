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
keep their shapes. The Workload is built once: a spec changed while the job waits suspended is
not carried into it (jobframework would replace a Workload that no longer
matches; not done here yet).

spec.scheduling.topology becomes each PodSet's ``topologyRequest`` (Kueue's
topology-aware scheduling, TAS: ``required`` or ``preferred`` is the level's
node label), and master and worker form one PodSet group (``podSetGroupName``,
Kueue 0.13+: a group of exactly two PodSets, one of them a single pod, placed
together in one domain as a LeaderWorkerSet's leader and workers are), so the
whole gang, not each role on its own, is packed. Kueue 0.10 drops the group
(it has no such field) and ignores the request unless its alpha
TopologyAwareScheduling gate is on.
"""

from __future__ import annotations

import hashlib
from typing import Any

from torchfleet_operator.api.constants import GROUP, KIND, KUEUE_QUEUE_LABEL
from torchfleet_operator.api.v1alpha1 import TrainingJobSpec
from torchfleet_operator.build import labels, names
from torchfleet_operator.build.pods import build_pod

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


def workload(
    job: str,
    namespace: str,
    uid: str,
    spec: TrainingJobSpec,
    queue: str,
    priority: int | None,
    image: str,
    api_version: str = KUEUE_API,
) -> dict[str, Any]:
    """The Workload manifest in ``api_version``; ``priority`` is the value of
    the job's PriorityClass."""
    body: dict[str, Any] = {
        "queueName": queue,
        "podSets": pod_sets(job, namespace, uid, spec, image),
    }
    priority_class = spec.scheduling.priority_class_name
    if priority_class and api_version == KUEUE_API:
        body["priorityClassName"] = priority_class
        body["priorityClassSource"] = PRIORITY_CLASS_SOURCE
    elif priority_class:
        body["priorityClassRef"] = {**PRIORITY_CLASS_REF, "name": priority_class}
    # Kueue's webhook requires a priority with a class; without one it is 0.
    body["priority"] = priority or 0
    return {
        "apiVersion": api_version,
        "kind": WORKLOAD_KIND,
        "metadata": {
            "name": workload_name(job, uid),
            "namespace": namespace,
            "labels": {**labels.common_labels(job), JOB_UID_LABEL: uid},
            "ownerReferences": [labels.owner_reference(job, uid)],
        },
        "spec": body,
    }
