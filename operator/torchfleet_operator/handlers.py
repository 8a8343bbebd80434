"""The kopf shell: informer caches (indices) and triggers. No decisions here.

Every handler is ``async`` and does O(1) work on the event loop: index a
compact summary, or put a job key on the work queue. (A sync handler would
cost a thread hop per event; with 9,000 pods that dominates.) The reconcile itself
(``controller.py``) runs its blocking API calls in worker threads. Pods, the
bulk of all events, skip kopf: the controller's own informer (``informer.py``)
keeps them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import kopf

from torchfleet_operator.api.constants import (
    CLUSTER_RUNTIME_KIND,
    CLUSTER_RUNTIME_PLURAL,
    GROUP,
    PLURAL,
    RUNTIME_KIND,
    RUNTIME_PLURAL,
    VERSION,
)
from torchfleet_operator.controller import Controller, cached_job, runtime_key
from torchfleet_operator.desired.labels import JOB_NAME_LABEL
from torchfleet_operator.desired.podgroup import NATIVE_GROUP
from torchfleet_operator.desired.workload import (
    KUEUE_GROUP,
    WORKLOAD_CRD,
    preferred_api_version,
    served_versions,
)
from torchfleet_operator.metrics import JobKey
from torchfleet_operator.observed import (
    Flavor,
    ObservedNode,
    ObservedPodGroup,
    ObservedRuntime,
    ObservedWorkload,
)
from torchfleet_operator.policy import runtime

CHILD = {JOB_NAME_LABEL: kopf.PRESENT}
# Kueue's API. Its CRDs may be absent: kopf serves these handlers once they
# appear (it watches CRDs), and until then the jobs that need Kueue wait.
# Kueue's objects are watched in the version the cluster prefers (no version in
# the selector: kopf takes the preferred one from discovery): v1beta1 on Kueue
# 0.10, v1beta2 on 0.15+. The Workloads it writes use the same (tf_kueue_crd).


class NoDiffBase(kopf.DiffBaseStorage):
    """Keeps no "last handled state": this operator has no on.create/on.update
    handlers, so kopf's per-event diff (two deep copies of every pod body) is
    pure cost; profiled at a third of the event loop's time with 9 pods/job."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return {}

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def _key(namespace: str | None, name: str) -> JobKey:
    return namespace or "", name


def _controller(memo: Any) -> Controller:
    controller: Controller = memo["controller"]
    return controller


@kopf.on.startup()
async def start(
    *,
    settings: kopf.OperatorSettings,
    memo: Any,
    **indices: Any,
) -> None:
    # The operator posts its own Events (one per phase change); kopf would
    # otherwise post one per handler log line.
    settings.posting.enabled = False
    # Server-side filtering: only the children of TrainingJobs reach this process.
    for plural in ("services", "persistentvolumeclaims", "podgroups"):
        settings.watching.label_selectors[plural] = JOB_NAME_LABEL
    settings.watching.server_timeout = 300
    settings.persistence.diffbase_storage = NoDiffBase()
    controller = _controller(memo)
    caches = controller.caches
    # kopf passes each index as a kwarg named after its function.
    caches.jobs = indices["tf_jobs"]
    caches.nodes, caches.services = indices["tf_nodes"], indices["tf_services"]
    caches.claims = indices["tf_claims"]
    caches.workloads, caches.flavors = indices["tf_workloads"], indices["tf_flavors"]
    caches.priorities, caches.kueue_crds = indices["tf_priorities"], indices["tf_kueue_crd"]
    caches.workload_priorities = indices["tf_workload_priorities"]
    caches.pod_groups = _Both(
        indices["tf_coscheduling_groups"],
        indices["tf_volcano_groups"],
        indices["tf_native_groups"],
        indices["tf_native_groups_v1alpha2"],
    )
    caches.runtimes = indices["tf_runtimes"]
    caches.cluster_runtimes = indices["tf_cluster_runtimes"]
    caches.runtime_users = indices["tf_runtime_users"]
    # Before the first pass: which version of Kubernetes' gang objects to write.
    await asyncio.to_thread(controller.discover_native_api)
    controller.start()


@kopf.on.cleanup()
async def stop(memo: Any, **_: Any) -> None:
    await _controller(memo).stop()


@kopf.on.probe(id="queue")
async def queue_depth(memo: Any, **_: Any) -> int:
    return len(_controller(memo).queue)


# ---- caches --------------------------------------------------------------------


@kopf.index(GROUP, VERSION, PLURAL)
async def tf_jobs(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace, name): cached_job(body)}


@kopf.index("nodes")
async def tf_nodes(name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {name: ObservedNode.from_manifest(dict(body))}


@kopf.index("services", labels=CHILD)
async def tf_services(
    namespace: str | None, labels: kopf.Labels, name: str, **_: Any
) -> dict[Any, Any]:
    return {(namespace, labels[JOB_NAME_LABEL]): name}


@kopf.index("persistentvolumeclaims", labels=CHILD)
async def tf_claims(namespace: str | None, name: str, **_: Any) -> dict[Any, Any]:
    return {(namespace, name): name}


# Kueue: the jobs' Workloads, the ResourceFlavors, PriorityClasses and
# WorkloadPriorityClasses they name.


@kopf.index(KUEUE_GROUP, "workloads", labels=CHILD)
async def tf_workloads(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> Any:
    return {(namespace, labels[JOB_NAME_LABEL]): ObservedWorkload(dict(body))}


@kopf.index(KUEUE_GROUP, "resourceflavors")
async def tf_flavors(name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {name: Flavor.from_manifest(dict(body))}


@kopf.index("scheduling.k8s.io", "v1", "priorityclasses")
async def tf_priorities(name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {name: body.get("value")}


@kopf.index(KUEUE_GROUP, "workloadpriorityclasses")
async def tf_workload_priorities(name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {name: body.get("value")}


@kopf.index("apiextensions.k8s.io", "v1", "customresourcedefinitions")
async def tf_kueue_crd(name: str, body: kopf.Body, **_: Any) -> Any:
    established = any(
        c.get("type") == "Established" and c.get("status") == "True"
        for c in (body.get("status") or {}).get("conditions") or ()
    )
    if name != WORKLOAD_CRD or not established:
        return None
    # Discovery of the Workload API version: the most preferred one served.
    api_version = preferred_api_version(served_versions(dict(body)))
    return {name: api_version} if api_version else None


# PodGroups of either gang scheduler. kopf watches a resource only while its
# CRD exists (it follows CRDs coming and going), so a cluster without
# scheduler-plugins or Volcano just leaves these empty.
def _pod_group_entry(namespace: str | None, labels: kopf.Labels, body: kopf.Body) -> Any:
    group = ObservedPodGroup.from_manifest(dict(body))
    return {(namespace, labels[JOB_NAME_LABEL]): group} if group else None


@kopf.index("scheduling.x-k8s.io", "v1alpha1", "podgroups", labels=CHILD)
async def tf_coscheduling_groups(namespace: str | None, labels: kopf.Labels, **kw: Any) -> Any:
    return _pod_group_entry(namespace, labels, kw["body"])


@kopf.index("scheduling.volcano.sh", "v1beta1", "podgroups", labels=CHILD)
async def tf_volcano_groups(namespace: str | None, labels: kopf.Labels, **kw: Any) -> Any:
    return _pod_group_entry(namespace, labels, kw["body"])


# Kubernetes' own, in each version the operator writes (desired/podgroup.py's
# NATIVE_VERSIONS): kopf watches one only where the API server serves it
# (feature gate GenericWorkload). A version-less selector would not do: kopf
# then takes the group's preferred version, scheduling.k8s.io/v1, which has no
# PodGroups.
@kopf.index(NATIVE_GROUP, "v1beta1", "podgroups", labels=CHILD)
async def tf_native_groups(namespace: str | None, labels: kopf.Labels, **kw: Any) -> Any:
    return _pod_group_entry(namespace, labels, kw["body"])


@kopf.index(NATIVE_GROUP, "v1alpha2", "podgroups", labels=CHILD)
async def tf_native_groups_v1alpha2(namespace: str | None, labels: kopf.Labels, **kw: Any) -> Any:
    return _pod_group_entry(namespace, labels, kw["body"])


# Runtimes (spec.runtimeRef), and which jobs name each: a job waiting for its
# runtime is queued when the runtime appears. kopf serves these once the
# runtime CRDs exist, as Kueue's.


@kopf.index(GROUP, VERSION, RUNTIME_PLURAL)
async def tf_runtimes(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> Any:
    return {(namespace, name): ObservedRuntime.from_manifest(dict(body))}


@kopf.index(GROUP, VERSION, CLUSTER_RUNTIME_PLURAL)
async def tf_cluster_runtimes(name: str, body: kopf.Body, **_: Any) -> Any:
    return {name: ObservedRuntime.from_manifest(dict(body))}


@kopf.index(GROUP, VERSION, PLURAL)
async def tf_runtime_users(
    namespace: str | None, name: str, spec: kopf.Spec, **_: Any
) -> dict[Any, Any] | None:
    ref = runtime.reference(dict(spec))
    return {runtime_key(ref, namespace or ""): _key(namespace, name)} if ref else None


class _Both(Mapping[Any, list[Any]]):
    """Indices read as one: a job's PodGroups of any kind."""

    def __init__(self, *indices: Mapping[Any, Any]) -> None:
        self._indices = indices

    def __getitem__(self, key: Any) -> list[Any]:
        found = [value for index in self._indices for value in index.get(key) or ()]
        if not found:
            raise KeyError(key)
        return found

    def __iter__(self) -> Iterator[Any]:
        return iter({key for index in self._indices for key in index})

    def __len__(self) -> int:
        return len({key for index in self._indices for key in index})


# ---- triggers: every one just queues the job's key ------------------------------


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_changed(
    type: str, namespace: str | None, name: str, uid: str, body: kopf.Body, memo: Any, **_: Any
) -> None:
    controller = _controller(memo)
    if type == "DELETED":
        controller.job_deleted(_key(namespace, name), uid)
    else:
        controller.job_changed(_key(namespace, name), body)


async def namespace_changed(type: str, name: str, memo: Any, **_: Any) -> None:
    if type == "DELETED":
        await _controller(memo).namespace_deleted(name)


def watch_namespaces() -> None:
    """Namespaced mode only (``--namespace``; the chart grants reading
    namespaces only then): kopf stops watching a deleted namespace without the
    DELETED events of the jobs that were in it, so the operator hears of the
    namespace's deletion itself and forgets them (Controller.namespace_deleted)."""
    kopf.on.event("", "v1", "namespaces")(namespace_changed)


@kopf.on.event("nodes")
async def node_changed(name: str, memo: Any, **_: Any) -> None:
    # Only jobs with a pod on this node care (a NotReady node loses their pods).
    controller = _controller(memo)
    for key in controller.pod_informer.index.jobs_on_node(name):
        controller.enqueue(key)


@kopf.on.event("services", labels=CHILD)
async def service_changed(namespace: str | None, labels: kopf.Labels, memo: Any, **_: Any) -> None:
    _controller(memo).enqueue(_key(namespace, labels[JOB_NAME_LABEL]))


@kopf.on.event(KUEUE_GROUP, "workloads", labels=CHILD)
async def workload_changed(namespace: str | None, labels: kopf.Labels, memo: Any, **_: Any) -> None:
    _controller(memo).enqueue(_key(namespace, labels[JOB_NAME_LABEL]))


@kopf.on.event("apiextensions.k8s.io", "v1", "customresourcedefinitions")
async def crd_changed(name: str, memo: Any, **_: Any) -> None:
    # Kueue installed (or removed): every job looks again.
    if name == WORKLOAD_CRD:
        controller = _controller(memo)
        for key in list(controller.caches.jobs):
            controller.enqueue(key)


@kopf.on.event("scheduling.x-k8s.io", "v1alpha1", "podgroups", labels=CHILD)
async def coscheduling_group_changed(
    namespace: str | None, labels: kopf.Labels, memo: Any, **_: Any
) -> None:
    _controller(memo).enqueue(_key(namespace, labels[JOB_NAME_LABEL]))


@kopf.on.event("scheduling.volcano.sh", "v1beta1", "podgroups", labels=CHILD)
async def volcano_group_changed(
    namespace: str | None, labels: kopf.Labels, memo: Any, **_: Any
) -> None:
    _controller(memo).enqueue(_key(namespace, labels[JOB_NAME_LABEL]))


@kopf.on.event(NATIVE_GROUP, "v1beta1", "podgroups", labels=CHILD)
async def native_group_changed(
    namespace: str | None, labels: kopf.Labels, memo: Any, **_: Any
) -> None:
    _controller(memo).enqueue(_key(namespace, labels[JOB_NAME_LABEL]))


@kopf.on.event(NATIVE_GROUP, "v1alpha2", "podgroups", labels=CHILD)
async def native_group_changed_v1alpha2(
    namespace: str | None, labels: kopf.Labels, memo: Any, **_: Any
) -> None:
    _controller(memo).enqueue(_key(namespace, labels[JOB_NAME_LABEL]))


async def _runtime_changed(key: tuple[str, ...], memo: Any) -> None:
    controller = _controller(memo)
    for job in controller.caches.runtime_users.get(key) or ():
        controller.enqueue(job)


@kopf.on.event(GROUP, VERSION, RUNTIME_PLURAL)
async def runtime_changed(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    await _runtime_changed(runtime_key((RUNTIME_KIND, name), namespace or ""), memo)


@kopf.on.event(GROUP, VERSION, CLUSTER_RUNTIME_PLURAL)
async def cluster_runtime_changed(name: str, memo: Any, **_: Any) -> None:
    await _runtime_changed(runtime_key((CLUSTER_RUNTIME_KIND, name), ""), memo)


# Per-object and per-probe INFO lines would dominate the log at scale.
logging.getLogger("kopf.objects").setLevel(logging.WARNING)
logging.getLogger("kopf.activities.probe").setLevel(logging.WARNING)
