"""Gang scheduling: the PodGroup (scheduler-plugins, Volcano or kube-scheduler's
own) and how pods join it.

The PodGroup asks for the whole gang: ``minMember`` = every pod and
``minResources`` = the sum of every pod's requests (GPUs, RDMA, CPU, memory,
sidecars included), so the gang scheduler can refuse a gang that cannot fit
before it binds any pod of it. An elastic job's gang is its minNodes: it
trains with that many, so the scheduler binds them without waiting for the rest.

Kubernetes' own gang scheduling (KEP-4671) has two objects: the job's
Workload, whose one podGroupTemplate holds the gang policy (minCount), and a
PodGroup made from that template, which is what kube-scheduler reads. The
operator makes one PodGroup per gang generation (restart count), so a
restarted gang is placed as a whole again by a group that has never seen the
old pods; pods join it with spec.schedulingGroup.podGroupName. It has no
minResources: kube-scheduler tries the whole gang on the nodes at once. Its
API version is the one the cluster serves (``preferred_native_api``, from
discovery): 1.37's scheduling.k8s.io/v1beta1 (beta, feature gate
GenericWorkload) or 1.36's v1alpha2 (alpha, gates GenericWorkload and
GangScheduling), whose PodGroup names its template differently.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

from torchfleet_operator.api.constants import GROUP, KIND
from torchfleet_operator.api.v1alpha1 import TrainingJobSpec, trainer_and_sidecars
from torchfleet_operator.desired import labels, names
from torchfleet_operator.desired.resources import container_resources

COSCHEDULING_API = "scheduling.x-k8s.io/v1alpha1"
VOLCANO_API = "scheduling.volcano.sh/v1beta1"
NATIVE_GROUP = "scheduling.k8s.io"
# The Workload/PodGroup API versions this builder writes, most preferred first:
# 1.37's beta and 1.36's alpha (the oldest supported).
NATIVE_VERSIONS = ("v1beta1", "v1alpha2")
# Before discovery has answered: the newest.
NATIVE_API = f"{NATIVE_GROUP}/{NATIVE_VERSIONS[0]}"
# What a served version must hold (discovery's resource names).
NATIVE_RESOURCES = frozenset({"podgroups", "workloads"})
# The Workload's only podGroupTemplate: the whole gang.
NATIVE_TEMPLATE = "gang"
# How pods name their group, per scheduler.
COSCHEDULING_POD_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_POD_ANNOTATION = "scheduling.k8s.io/group-name"
# How long a Coscheduling gang's pods wait for their siblings at the Permit
# stage before the whole gang is rejected and retried. scheduler-plugins'
# own default (60 s) is short for gangs of hundreds of pods on a busy cluster.
DEFAULT_SCHEDULE_TIMEOUT_SECONDS = 300


def scheduler_name(spec: TrainingJobSpec) -> str | None:
    return spec.scheduling.resolved_scheduler_name


def preferred_native_api(served: Iterable[str]) -> str | None:
    """The Workload/PodGroup apiVersion to use, given the versions of
    scheduling.k8s.io whose discovery lists both resources: the most preferred
    one this builder knows (None: none of them)."""
    served = set(served)
    return next((f"{NATIVE_GROUP}/{v}" for v in NATIVE_VERSIONS if v in served), None)


def serves_gang(resources: Any) -> bool:
    """Whether a discovery document (``/apis/scheduling.k8s.io/<version>``, an
    APIResourceList) lists the Workload and PodGroup resources."""
    listed = resources.get("resources") if isinstance(resources, dict) else None
    plurals = {r.get("name") for r in listed or () if isinstance(r, dict)}
    return plurals >= NATIVE_RESOURCES


def gang_objects(
    job: str,
    namespace: str,
    uid: str,
    spec: TrainingJobSpec,
    restart: int,
    native_api: str = NATIVE_API,
) -> list[dict[str, Any]]:
    """What the scheduler needs before the gang's pods: none, a PodGroup, or
    for Kubernetes the generation's PodGroup and the job's Workload, in
    ``native_api``. The PodGroup comes first: when the API group is not
    served, its 404 is the refusal the job's condition names (PodGroupCRDMissing)."""
    kind = spec.scheduling.pod_group
    if kind == "None":
        return []
    if kind == "Kubernetes":
        return [
            _native_pod_group(job, namespace, uid, spec, restart, native_api),
            native_workload(job, namespace, uid, spec, native_api),
        ]
    return [pod_group(job, namespace, uid, spec)]


def _metadata(name: str, job: str, namespace: str, uid: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": labels.common_labels(job),
        "ownerReferences": [labels.owner_reference(job, uid)],
    }


def native_workload(
    job: str, namespace: str, uid: str, spec: TrainingJobSpec, api_version: str = NATIVE_API
) -> dict[str, Any]:
    """The job's scheduling.k8s.io Workload: one gang template of min_members
    (the same shape in both versions)."""
    template = {"name": NATIVE_TEMPLATE, "schedulingPolicy": _gang_policy(spec)}
    return {
        "apiVersion": api_version,
        "kind": "Workload",
        "metadata": _metadata(names.podgroup_name(job), job, namespace, uid),
        "spec": {
            "controllerRef": {"apiGroup": GROUP, "kind": KIND, "name": job},
            "podGroupTemplates": [{**template, **_native_priority(spec, api_version)}],
        },
    }


def _native_priority(spec: TrainingJobSpec, api_version: str) -> dict[str, str]:
    """The job's priority class, as its pods have it (the API server's Priority
    admission resolves a PodGroup's priority from it). v1alpha2 (1.36) accepts
    the field only with the alpha gate WorkloadAwarePreemption, which the
    operator cannot see: there the group has none."""
    name = spec.scheduling.priority_class_name
    if not name or api_version == f"{NATIVE_GROUP}/v1alpha2":
        return {}
    return {"priorityClassName": name}


def native_pod_group_name(job: str, restart: int) -> str:
    """The PodGroup of gang generation ``restart`` (a DNS subdomain: the job's
    name already is one, and fits in a pod's 63-character hostname)."""
    return f"{names.podgroup_name(job)}-gen-{restart}"


def _native_pod_group(
    job: str, namespace: str, uid: str, spec: TrainingJobSpec, restart: int, api_version: str
) -> dict[str, Any]:
    workload = names.podgroup_name(job)
    reference: dict[str, Any]
    if api_version == f"{NATIVE_GROUP}/v1alpha2":
        template = {"workloadName": workload, "podGroupTemplateName": NATIVE_TEMPLATE}
        reference = {"podGroupTemplateRef": {"workload": template}}
    else:  # v1beta1: spec.workloadRef
        reference = {"workloadRef": {"workloadName": workload, "templateName": NATIVE_TEMPLATE}}
    return {
        "apiVersion": api_version,
        "kind": "PodGroup",
        "metadata": {
            **_metadata(native_pod_group_name(job, restart), job, namespace, uid),
            # Which gang generation it holds: the operator reads the newest.
            "labels": {**labels.common_labels(job), labels.RESTART_LABEL: str(restart)},
        },
        "spec": {
            **reference,
            "schedulingPolicy": _gang_policy(spec),
            **_native_priority(spec, api_version),
        },
    }


def _gang_policy(spec: TrainingJobSpec) -> dict[str, Any]:
    return {"gang": {"minCount": min_members(spec)}}


def scheduling_group(job: str, spec: TrainingJobSpec, restart: int) -> dict[str, str] | None:
    """A pod's spec.schedulingGroup: Kubernetes' gang of this generation."""
    if spec.scheduling.pod_group != "Kubernetes":
        return None
    return {"podGroupName": native_pod_group_name(job, restart)}


def pod_group(job: str, namespace: str, uid: str, spec: TrainingJobSpec) -> dict[str, Any]:
    """The Coscheduling or Volcano PodGroup: one per job, every generation."""
    kind = spec.scheduling.pod_group
    body: dict[str, Any] = {"minMember": min_members(spec)}
    min_resources = gang_requests(spec)
    if min_resources:
        body["minResources"] = min_resources
    if kind == "Coscheduling":
        api_version = COSCHEDULING_API
        body["scheduleTimeoutSeconds"] = (
            spec.scheduling.schedule_timeout_seconds or DEFAULT_SCHEDULE_TIMEOUT_SECONDS
        )
    else:
        api_version = VOLCANO_API
        if spec.scheduling.queue_name:
            body["queue"] = spec.scheduling.queue_name
        if spec.scheduling.priority_class_name:
            body["priorityClassName"] = spec.scheduling.priority_class_name
    return {
        "apiVersion": api_version,
        "kind": "PodGroup",
        "metadata": _metadata(names.podgroup_name(job), job, namespace, uid),
        "spec": body,
    }


def min_members(spec: TrainingJobSpec) -> int:
    """Pods that must be scheduled together: every pod, or an elastic job's minNodes."""
    return spec.elastic.min_nodes if spec.elastic is not None else spec.nodes


def pod_membership(job: str, spec: TrainingJobSpec) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) that put a pod into the job's PodGroup."""
    kind = spec.scheduling.pod_group
    if kind == "Coscheduling":
        return {COSCHEDULING_POD_LABEL: names.podgroup_name(job)}, {}
    if kind == "Volcano":
        return {}, {VOLCANO_POD_ANNOTATION: names.podgroup_name(job)}
    return {}, {}


# ---- the gang's summed requests ---------------------------------------------------


def gang_requests(spec: TrainingJobSpec) -> dict[str, str]:
    """The gang's requests added up: the master plus its workers (min_members - 1)."""
    total = _pod_requests(spec, master=True)
    worker = _pod_requests(spec, master=False)
    workers = min_members(spec) - 1
    for name, amount in worker.items():
        total[name] = total.get(name, Fraction(0)) + amount * workers
    return {name: format_quantity(amount) for name, amount in sorted(total.items()) if amount}


def _pod_requests(spec: TrainingJobSpec, master: bool) -> dict[str, Fraction]:
    """A pod's requests as the scheduler counts them: the sum over its
    containers (the trainer's resources, a template's own winning, plus
    sidecars), at least the largest init container; a limit without a request
    requests the limit."""
    template = spec.master.template if master else spec.worker.template
    pod_spec = (template.spec if template else None) or {}
    trainer, sidecars = trainer_and_sidecars(list(pod_spec.get("containers") or []))
    ours = trainer.get("resources") or container_resources(spec)
    total = _add(
        _container_requests(ours), *(_container_requests(c.get("resources")) for c in sidecars)
    )
    for init in pod_spec.get("initContainers") or []:
        for name, amount in _container_requests(init.get("resources")).items():
            total[name] = max(total.get(name, Fraction(0)), amount)
    return total


def _container_requests(resources: Any) -> dict[str, Fraction]:
    if not isinstance(resources, dict):
        return {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {str(name): parse_quantity(value) for name, value in merged.items()}


def _add(*parts: dict[str, Fraction]) -> dict[str, Fraction]:
    total: dict[str, Fraction] = {}
    for part in parts:
        for name, amount in part.items():
            total[name] = total.get(name, Fraction(0)) + amount
    return total


_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$")
_SUFFIX = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    **{s: Fraction(1024**i) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), 1)},
}


def parse_quantity(value: Any) -> Fraction:
    """A Kubernetes quantity (``8``, ``7500m``, ``64Gi``, ``1e3``) as an exact number.

    Raises ValueError for anything else; the API server rejects such a pod too."""
    match = _QUANTITY.match(str(value).strip())
    if not match:
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    number, suffix = Fraction(match.group(1)), match.group(2) or ""
    if suffix[:1] in ("e", "E"):
        return number * Fraction(10) ** int(suffix[1:])
    return number * _SUFFIX.get(suffix, Fraction(1))


def format_quantity(amount: Fraction) -> str:
    """Whole units where exact (``24``, ``1649267441664``), else milli-units
    rounded up (``7500m``): a gang must never be asked for less than it needs."""
    if amount.denominator == 1:
        return str(amount.numerator)
    milli = -(-amount.numerator * 1000 // amount.denominator)
    return f"{milli}m"
