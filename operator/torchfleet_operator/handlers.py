"""The kopf shell: informer caches (indices) and triggers. No decisions here.

Every handler is ``async`` and does O(1) work on the event loop: index a
compact summary, or put a job key on the work queue. (A sync handler would
cost a thread hop per event; with 9,000 pods that dominates.) The reconcile itself
(``controller.py``) runs its blocking API calls in worker threads.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from torchfleet_operator.api.constants import GROUP, PLURAL, VERSION
from torchfleet_operator.build.labels import JOB_NAME_LABEL
from torchfleet_operator.controller import Controller
from torchfleet_operator.metrics import JobKey
from torchfleet_operator.observed import ObservedNode, ObservedPod

CHILD = {JOB_NAME_LABEL: kopf.PRESENT}


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
    for plural in ("pods", "services", "persistentvolumeclaims"):
        settings.watching.label_selectors[plural] = JOB_NAME_LABEL
    settings.watching.server_timeout = 300
    settings.persistence.diffbase_storage = NoDiffBase()
    controller = _controller(memo)
    caches = controller.caches
    # kopf passes each index as a kwarg named after its function.
    caches.jobs, caches.pods = indices["tf_jobs"], indices["tf_pods"]
    caches.nodes, caches.services = indices["tf_nodes"], indices["tf_services"]
    caches.claims = indices["tf_claims"]
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
    # A plain dict: kopf's Body is a live view; the planner wants a value.
    return {(namespace, name): {key: body[key] for key in body}}


@kopf.index("pods", labels=CHILD)
async def tf_pods(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    pod = ObservedPod.from_manifest(dict(body))
    return {(namespace, labels[JOB_NAME_LABEL]): pod} if pod else None


@kopf.index("pods", labels=CHILD)
async def tf_pods_by_node(
    namespace: str | None, labels: kopf.Labels, spec: kopf.Spec, **_: Any
) -> Any:
    node = spec.get("nodeName")
    return {node: (namespace, labels[JOB_NAME_LABEL])} if node else None


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


# ---- triggers: every one just queues the job's key ------------------------------


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_changed(
    type: str, namespace: str | None, name: str, uid: str, memo: Any, **_: Any
) -> None:
    controller = _controller(memo)
    if type == "DELETED":
        controller.job_deleted(_key(namespace, name), uid)
    else:
        controller.enqueue(_key(namespace, name))


@kopf.on.event("pods", labels=CHILD)
async def pod_changed(namespace: str | None, labels: kopf.Labels, memo: Any, **_: Any) -> None:
    _controller(memo).pod_changed(_key(namespace, labels[JOB_NAME_LABEL]))


@kopf.on.event("nodes")
async def node_changed(name: str, memo: Any, **indices: Any) -> None:
    # Only jobs with a pod on this node care (a NotReady node loses their pods).
    for key in set(indices["tf_pods_by_node"].get(name, ())):
        _controller(memo).enqueue(key)


@kopf.on.event("services", labels=CHILD)
async def service_changed(namespace: str | None, labels: kopf.Labels, memo: Any, **_: Any) -> None:
    _controller(memo).enqueue(_key(namespace, labels[JOB_NAME_LABEL]))


# Per-object and per-probe INFO lines would dominate the log at scale.
logging.getLogger("kopf.objects").setLevel(logging.WARNING)
logging.getLogger("kopf.activities.probe").setLevel(logging.WARNING)
