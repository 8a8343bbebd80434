"""The control loop: informer caches in, plans out, on worker tasks.

kopf (``handlers.py``) feeds the caches (its indices) and calls ``enqueue``;
pods come from the operator's own informer (``informer.py``), started here.
This module owns the work queue, the in-memory expectations and the last
status written, and runs each pass's blocking API calls in a thread so that
kopf's event loop never blocks. It imports no kopf: the caches are mappings.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from torchfleet_operator import metrics
from torchfleet_operator.api.constants import (
    KUEUE_PREBUILT_WORKLOAD_LABEL,
    PLURAL,
    RUNTIME_KIND,
    RUNTIME_PLURAL,
)
from torchfleet_operator.api.parse import read_status
from torchfleet_operator.config import OperatorConfig
from torchfleet_operator.desired.names import checkpoint_claim_name
from torchfleet_operator.desired.podgroup import NATIVE_API, NATIVE_GROUP
from torchfleet_operator.desired.workload import KUEUE_API, WORKLOAD_CRD, workload_priority_class
from torchfleet_operator.informer import PodInformer
from torchfleet_operator.kube import ApiFailure, ExecutionResult, Executor, RawApi
from torchfleet_operator.leader import LeaderElector
from torchfleet_operator.metrics import JobKey
from torchfleet_operator.observed import (
    KueueView,
    Observed,
    ObservedNode,
    ObservedPod,
    ObservedRuntime,
    current_pod_group,
    jobs_pod_groups,
)
from torchfleet_operator.planning import Plan
from torchfleet_operator.policy import runtime
from torchfleet_operator.reconcile import plan
from torchfleet_operator.scraper import ProgressPoller
from torchfleet_operator.status import restarts
from torchfleet_operator.status.pacing import wait_before_writing
from torchfleet_operator.status.patch import with_removals
from torchfleet_operator.status.progress import without_scraped
from torchfleet_operator.status.rejections import after_execute
from torchfleet_operator.workqueue import WorkQueue

log = logging.getLogger(__name__)

# How long a create/delete may go unseen by the watch before it is forgotten.
EXPECTATION_SECONDS = 60.0
# Kinds whose 404 on create may mean the served scheduling.k8s.io version
# changed (a gang scheduler's PodGroup too: discovery costs two GETs).
NATIVE_KINDS = ("PodGroup", "Workload")


@dataclass
class Caches:
    """kopf indices (mapping key -> collection of values) the loop reads."""

    jobs: Mapping[Any, Iterable[Any]] = field(default_factory=dict)
    pods: Mapping[Any, Iterable[Any]] = field(default_factory=dict)
    nodes: Mapping[Any, Iterable[Any]] = field(default_factory=dict)
    services: Mapping[Any, Iterable[Any]] = field(default_factory=dict)
    claims: Mapping[Any, Iterable[Any]] = field(default_factory=dict)
    # Kueue (empty while its CRDs are absent).
    workloads: Mapping[Any, Iterable[Any]] = field(default_factory=dict)
    flavors: Mapping[Any, Iterable[Any]] = field(default_factory=dict)
    priorities: Mapping[Any, Iterable[Any]] = field(default_factory=dict)
    workload_priorities: Mapping[Any, Iterable[Any]] = field(default_factory=dict)
    kueue_crds: Mapping[Any, Iterable[Any]] = field(default_factory=dict)
    pod_groups: Mapping[Any, Iterable[Any]] = field(default_factory=dict)
    # Runtimes (spec.runtimeRef): TrainingRuntimes by (namespace, name),
    # ClusterTrainingRuntimes by name; the jobs naming each, by runtime_key.
    runtimes: Mapping[Any, Iterable[Any]] = field(default_factory=dict)
    cluster_runtimes: Mapping[Any, Iterable[Any]] = field(default_factory=dict)
    runtime_users: Mapping[Any, Iterable[Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    body: dict[str, Any]
    observed: Observed


@dataclass
class _Expectations:
    created: dict[str, float] = field(default_factory=dict)  # pod name -> deadline
    deleted: dict[str, float] = field(default_factory=dict)  # pod uid -> deadline
    held: dict[str, float] = field(default_factory=dict)  # refused child name -> retry time


def _abdicate() -> None:
    """Lost the lease: stop at once, as controller-runtime does. A pass in flight
    could otherwise still write after another replica took over."""
    logging.shutdown()
    os._exit(1)


def _controller_other_than(workload: Any, uid: str) -> bool:
    """The Workload has a controller, and it is not the object of ``uid``."""
    return any(
        r.get("controller") and r.get("uid") != uid
        for r in workload.metadata.get("ownerReferences") or ()
    )


def _first(collection: Iterable[Any] | None) -> Any:
    return next(iter(collection or ()), None)


def _is_int(value: Any) -> bool:
    """A priority class's value as read (untrusted: no bool, no string)."""
    return isinstance(value, int) and not isinstance(value, bool)


class Controller:
    def __init__(
        self,
        config: OperatorConfig,
        executor: Executor,
        default_image: str | None = None,
        default_shm_size: str | None = None,
        leader: LeaderElector | None = None,
        namespaces: Sequence[str] = (),
    ) -> None:
        """``default_image`` and ``default_shm_size``, when given, replace the config's."""
        if default_image is not None:
            config = dataclasses.replace(config, trainer_image=default_image)
        if default_shm_size is not None:
            config = dataclasses.replace(config, default_shm_size=default_shm_size)
        self.config = config
        # Without an elector this replica leads from the start (one replica).
        self.leader = leader
        self.leading = asyncio.Event()
        self.executor = executor
        self.caches = Caches()
        # The scheduling.k8s.io version of Kubernetes' gang objects the API
        # server serves (discover_native_api), until discovery has answered.
        self.native_api = NATIVE_API
        # Its list calls are not the reconciler's: not in api_requests_total.
        uncounted = RawApi(executor.raw.api, counted=False)
        self.pod_informer = PodInformer(uncounted, namespaces, self.pod_changed)
        self.caches.pods = self.pod_informer.index
        self.queue: WorkQueue[JobKey] = WorkQueue()
        self.phases = metrics.PhaseTracker()
        self.goodput = metrics.GoodputTracker()
        self.health = metrics.HealthTracker()
        # One thread per worker. (asyncio.to_thread's shared default pool has
        # cpu_count + 4 threads: 6 on a 2-core node, silently capping `workers`.)
        self._passes = ThreadPoolExecutor(config.workers, thread_name_prefix="reconcile")
        self._expectations: dict[JobKey, _Expectations] = {}
        self._last_status: dict[str, dict[str, Any]] = {}  # by job uid
        # By job uid: the job as the pass that last wrote its status saw it
        # (status and bookkeeping aside), to recognise that write's own event.
        self._written_over: dict[str, dict[str, Any]] = {}
        self._written_at: dict[str, float] = {}  # by job uid: last status write (monotonic)
        # The events posted for each job another controller runs (by uid; each
        # a reason and key): no pass of theirs writes a status to remember them
        # by (policy/managed.py), and each is posted once.
        self._left_alone: dict[str, set[tuple[str, str]]] = {}
        # Uids of jobs the API server says are gone while kopf's index still holds
        # them (_forget_vanished): passed over by snapshot(), forgotten by the loop.
        self._gone: set[str] = set()
        # The same for TrainingRuntimes of a deleted namespace: never resolved.
        self._gone_runtimes: set[str] = set()
        self._api_failures: dict[JobKey, int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.progress: ProgressPoller[JobKey] = ProgressPoller(
            config.progress_interval_seconds, self._masters, self.enqueue, config.progress_port
        )

    # ---- triggers (called on the event loop) ----

    def enqueue(self, key: JobKey) -> None:
        self.queue.add(key)
        metrics.QUEUE_DEPTH.set(len(self.queue))

    def job_changed(self, key: JobKey, body: Mapping[str, Any]) -> None:
        """A job's event queues it, unless all it brings is the status this
        operator just wrote: every write comes back as an event, and a pass for
        it would find nothing to do (a third of all passes at scale)."""
        uid = (body.get("metadata") or {}).get("uid", "")
        written = self._last_status.get(uid)
        echo = (
            written is not None
            and body.get("status") == written
            and self._written_over.get(uid) == _identity(body)
        )
        if not echo:
            self.enqueue(key)

    def pod_changed(self, key: JobKey) -> None:
        self.queue.add_after(key, self.config.pod_event_batch_seconds)

    def job_deleted(self, key: JobKey, uid: str | None) -> None:
        self.queue.forget(key)
        self._expectations.pop(key, None)
        self._api_failures.pop(key, None)
        self.phases.forget(key)
        self.goodput.forget(key)
        self.health.forget(key)
        self.progress.forget(key)
        metrics.forget_job_passes(key)
        self.pod_informer.index.forget(key)
        if uid:
            self._forget_uid(uid)

    def _forget_uid(self, uid: str) -> None:
        self._last_status.pop(uid, None)
        self._written_over.pop(uid, None)
        self._written_at.pop(uid, None)
        self._left_alone.pop(uid, None)

    def _forget_vanished(self, key: JobKey, uid: str) -> None:
        """A job the API server says is gone, though kopf's index still holds it:
        kopf stops watching a deleted namespace (one it found by pattern) without
        the DELETED events of what was in it, and never drops those objects from
        its indices. Forgotten as if deleted; where a namesake made since lives
        under the same key, only the gone one's records go."""
        self._gone.add(uid)
        log.info("%s/%s: gone from the API server (uid %s); forgotten", *key, uid)
        if self._live_job(key) is None:
            self.job_deleted(key, uid)
        else:
            self._forget_uid(uid)
            self.enqueue(key)

    async def namespace_deleted(self, namespace: str) -> None:
        """A watched namespace is gone (kopf's event, namespaced mode only): its
        jobs and TrainingRuntimes the index still holds are checked against one
        list of the namespace's, and those not in it forgotten (jobs) or never
        resolved again (runtimes: a job of the namespace made again must wait for
        its own runtime, not take the deleted one). A list, not the namespace's
        name alone: it may already have been made again, with new objects."""
        cached = [
            (key, body["metadata"].get("uid", ""))
            for key in list(self.caches.jobs)
            if key[0] == namespace
            for body in self.caches.jobs.get(key) or ()
        ]
        # A list that fails (None) forgets nothing: the passes' own refusals tell
        # of a gone job, and the next deletion event of a gone runtime.
        listed = await self._listed(PLURAL, namespace) if cached else None
        if listed is not None:
            for key, uid in cached:
                if uid and uid not in listed and uid not in self._gone:
                    self._forget_vanished(key, uid)
        runtimes = [
            found.uid
            for key in list(self.caches.runtimes)
            if key[0] == namespace
            for found in self.caches.runtimes.get(key) or ()
        ]
        listed = await self._listed(RUNTIME_PLURAL, namespace) if runtimes else None
        if listed is not None:
            self._gone_runtimes.update(uid for uid in runtimes if uid not in listed)

    async def _listed(self, plural: str, namespace: str) -> set[str] | None:
        return await asyncio.to_thread(self.executor.uids, plural, namespace)

    def discover_native_api(self) -> None:
        """Asks the API server which scheduling.k8s.io version of Kubernetes'
        own gang objects it serves (blocking: at start-up, and after the API
        server answered 404 for them, as across an upgrade from 1.36 to 1.37).
        Served by none, or unanswered: the version in use stays, and the job's
        condition names the refusal (PodGroupCRDMissing)."""
        try:
            found = self.executor.native_api()
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("discovery of %s failed: %s", NATIVE_GROUP, exc)
            return
        if found is None:
            log.info("%s serves no Workload API this operator writes", NATIVE_GROUP)
        elif found != self.native_api:
            log.info("Kubernetes' gang scheduling: %s", found)
            self.native_api = found

    def start(self) -> None:
        """Workers start at once but pass nothing until this replica leads; kopf's
        caches fill either way, so a standby that takes over starts warm."""
        self.pod_informer.start()
        for number in range(self.config.workers):
            self._tasks.append(asyncio.create_task(self._work(), name=f"reconciler-{number}"))
        if self.leader is None:
            self._lead()
        else:
            self._tasks.append(
                asyncio.create_task(self.leader.run(self._lead, _abdicate), name="leader")
            )

    def _lead(self) -> None:
        metrics.LEADER.set(1)
        self.leading.set()
        for key in list(self.caches.jobs):  # whatever happened while standing by
            self.enqueue(key)
        if self.config.resync_seconds > 0:
            self._tasks.append(asyncio.create_task(self._resync(), name="resync"))
        if self.config.progress_interval_seconds > 0:
            self._tasks.append(
                asyncio.create_task(supervise("progress", self.progress.run), name="progress")
            )

    async def stop(self) -> None:
        self.pod_informer.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.queue.shutdown()
        if self.leader is None:
            self._passes.shutdown(wait=False, cancel_futures=True)
        else:  # hand over only once no pass of ours can still write
            await asyncio.to_thread(self._passes.shutdown, True, cancel_futures=True)
            await asyncio.to_thread(self.leader.release)
        self.executor.close()

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.config.resync_seconds)
            held: set[str] = set()
            for key in list(self.caches.jobs):
                held.update(b["metadata"].get("uid", "") for b in self.caches.jobs.get(key) or ())
                self.enqueue(key)
            self._gone &= held  # gone from the index too: nothing left to pass over
            self._gone_runtimes &= {
                found.uid
                for key in list(self.caches.runtimes)
                for found in self.caches.runtimes[key]
            }

    async def _work(self) -> None:
        await self.leading.wait()
        # As client-go's WaitForCacheSync: a pass before the pods are listed
        # would see none and create them again.
        await self.pod_informer.synced.wait()
        while True:
            key = await self.queue.get()
            metrics.QUEUE_DEPTH.set(len(self.queue))
            delay: float | None = None
            try:
                snapshot = self.snapshot(key)
                if snapshot is not None:
                    delay = await asyncio.get_running_loop().run_in_executor(
                        self._passes, self.reconcile, key, snapshot
                    )
                    uid = snapshot.body["metadata"].get("uid", "")
                    if uid in self._gone:  # the pass was refused as gone
                        self._forget_vanished(key, uid)
                        delay = None
                    elif key in self.caches.jobs:  # else job_deleted dropped its series
                        metrics.JOB_PASSES.labels(*key).inc()
            except Exception:  # a bug or an unreachable apiserver: never kill the loop
                log.exception("reconcile of %s/%s failed", *key)
                metrics.RECONCILE_ERRORS.inc()
                delay = self._api_backoff(key)
            finally:
                self.queue.done(key)
            if delay is not None:
                self.queue.add_after(key, delay)

    # ---- observe (on the event loop: the caches are not thread-safe) ----

    def _masters(self) -> list[tuple[JobKey, str]]:
        """(job, master pod IP) for every Running job, for the progress poller."""
        found: list[tuple[JobKey, str]] = []
        for key in self.phases.with_phase("Running"):
            pods = list(self.caches.pods.get(key) or ())
            newest = max((p.restart for p in pods), default=0)
            master = next(
                (
                    p
                    for p in pods
                    if p.role == "master"
                    and p.restart == newest
                    and p.phase == "Running"
                    and p.pod_ip
                ),
                None,
            )
            if master is not None and master.pod_ip:
                found.append((key, master.pod_ip))
        return found

    def _live_job(self, key: JobKey) -> dict[str, Any] | None:
        """The job under ``key`` in kopf's index, passing over those known gone.
        Of two, the newer: two objects of one name never exist at once, so the
        older was deleted and its DELETED event lost (_forget_vanished). Made in
        the same second, either; the first refusal sorts them out."""
        bodies = [
            b for b in self.caches.jobs.get(key) or () if b["metadata"].get("uid") not in self._gone
        ]
        return max(bodies, key=lambda b: b["metadata"].get("creationTimestamp") or "", default=None)

    def snapshot(self, key: JobKey) -> Snapshot | None:
        body = self._live_job(key)
        if body is None:
            return None
        uid = body["metadata"].get("uid", "")
        # Pods are adopted by controller owner UID, never by label alone: an
        # orphan of an earlier job of the same name (still being garbage-
        # collected) or a pod made by hand with the job's labels is not its pod.
        pods: tuple[ObservedPod, ...] = tuple(
            p for p in self.caches.pods.get(key) or () if p.owner_uid == uid
        )
        not_ready: dict[str, datetime | None] = {}
        for node_name in {p.node_name for p in pods if p.node_name}:
            node: ObservedNode | None = _first(self.caches.nodes.get(node_name))
            if node is not None and node.out_of_service:
                not_ready[node_name] = None
            elif node is not None and not node.ready:
                not_ready[node_name] = node.since
        expected = self._prune_expectations(key, pods)
        found_runtime = self._runtime(key, body)
        progress, checkpoint_step = self.progress.latest.get(key, (None, None))
        observed = Observed(
            pods=pods,
            nodes_not_ready=not_ready,
            has_service=key in self.caches.services,
            has_checkpoint_claim=_claim_key(body) in self.caches.claims,
            expected_created=frozenset(expected.created),
            expected_deleted=frozenset(expected.deleted),
            held=frozenset(expected.held),
            progress=progress,
            checkpoint_step=checkpoint_step,
            health=self.progress.health.get(key),
            saved_checkpoint=self.pod_informer.index.saved.get(key),
            kueue=self._kueue_view(key, body, uid, found_runtime),
            pod_group=current_pod_group(self.caches.pod_groups.get(key) or (), uid),
            pod_groups=jobs_pod_groups(self.caches.pod_groups.get(key) or (), uid),
            native_api=self.native_api,
            runtime=found_runtime,
        )
        return Snapshot(body=body, observed=observed)

    def _runtime(self, key: JobKey, body: dict[str, Any]) -> ObservedRuntime | None:
        """The runtime the job's spec.runtimeRef names, if the watch has it: of
        two of that name in the index, the newer that is not known gone (as
        _live_job picks a job)."""
        ref = runtime.reference(body.get("spec"))
        if ref is None:
            return None
        kind, name = ref
        if kind == RUNTIME_KIND:
            held: Iterable[ObservedRuntime] = self.caches.runtimes.get((key[0], name)) or ()
        else:
            held = self.caches.cluster_runtimes.get(name) or ()
        live = [found for found in held if found.uid not in self._gone_runtimes]
        return max(live, key=lambda found: found.created, default=None)

    def _kueue_view(
        self, key: JobKey, body: dict[str, Any], uid: str, found: ObservedRuntime | None
    ) -> KueueView:
        caches = self.caches
        # MultiKueue's copy of a job runs under the Workload copied with it
        # (named by the job's label, owned by nobody until the job takes it).
        prebuilt = ((body.get("metadata") or {}).get("labels") or {}).get(
            KUEUE_PREBUILT_WORKLOAD_LABEL
        )
        workload = next(
            (
                w
                for w in caches.workloads.get(key) or ()
                if any(r.get("uid") == uid for r in w.metadata.get("ownerReferences") or ())
                or (prebuilt and w.name == prebuilt and not _controller_other_than(w, uid))
            ),
            None,
        )
        # The class a runtime gives counts as the job's own (as its queue does).
        scheduling = runtime.merged_spec(body, found).get("scheduling") or {}
        priority_class = scheduling.get("priorityClassName")
        priority = _first(caches.priorities.get(priority_class)) if priority_class else None
        workload_class = workload_priority_class((body.get("metadata") or {}).get("labels"))
        workload_priority = (
            _first(caches.workload_priorities.get(workload_class)) if workload_class else None
        )
        api_version = _first(caches.kueue_crds.get(WORKLOAD_CRD))
        return KueueView(
            installed=bool(caches.kueue_crds),
            api_version=api_version if isinstance(api_version, str) else KUEUE_API,
            workload=workload,
            flavors={name: _first(caches.flavors.get(name)) for name in caches.flavors},
            priority=priority if _is_int(priority) else None,
            workload_priority_class=workload_class,
            workload_priority=workload_priority if _is_int(workload_priority) else None,
        )

    def _prune_expectations(self, key: JobKey, pods: tuple[ObservedPod, ...]) -> _Expectations:
        expected = self._expectations.setdefault(key, _Expectations())
        now = time.monotonic()
        seen_names = {p.name for p in pods if not p.deleting}
        seen_uids = {p.uid for p in pods}
        expected.created = {
            n: t for n, t in expected.created.items() if n not in seen_names and t > now
        }
        expected.deleted = {u: t for u, t in expected.deleted.items() if u in seen_uids and t > now}
        expected.held = {n: t for n, t in expected.held.items() if t > now}
        return expected

    # ---- one pass (in a worker thread) ----

    def reconcile(self, key: JobKey, snapshot: Snapshot) -> float | None:
        started = time.perf_counter()
        try:
            return self._reconcile(key, snapshot)
        finally:
            metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)

    def _reconcile(self, key: JobKey, snapshot: Snapshot) -> float | None:
        """One pass: plan, execute, write the status once, then post the events.

        When nothing the plan does can change its status (it creates nothing, so
        nothing can be refused), the status is written first and the plan runs
        once it landed. A gang restart is such a pass: the bump is recorded
        before the old gang is deleted (as JobSet does), and should the
        operator crash in between, the next pass finds the old gang's pods a
        generation behind and deletes them; the restart is neither lost nor
        counted twice. Otherwise the plan runs first and what the API server
        refused goes into the one write (status/rejections.py).
        """
        body = snapshot.body
        uid = body["metadata"].get("uid", "")
        current = self._last_status.get(uid, body.get("status") or {})
        now = datetime.now(UTC)
        decided = plan(body, snapshot.observed, now, self.config, current)
        if decided.managed_by is not None:
            return self._leave_alone(key, snapshot, decided)
        held = self._expectations.setdefault(key, _Expectations()).held
        still_held = bool(held)
        if _status_known_before_executing(decided):
            status = after_execute(decided.status, current, [], still_held, now)
            landed, delay = self._write_once(key, body, current, status, decided)
            if uid in self._gone:
                return None
            if not landed and decided.gang_restart:
                return delay  # nothing is deleted before the restart is recorded
            result = self.executor.execute(key[0], body, decided)
            delay = _sooner(delay, self._executed(key, decided, result, snapshot))
            if self._refused_as_gone(uid, result.failures):
                return None
        else:
            result = self.executor.execute(key[0], body, decided)
            delay = self._executed(key, decided, result, snapshot)
            if result.job_deleted or self._refused_as_gone(uid, result.failures):
                return None
            rejected = [
                (f.kind, f.name, f.code, f.message) for f in result.failures if f.verb == "create"
            ]
            status = after_execute(decided.status, current, rejected, still_held, now)
            landed, written_delay = self._write_once(key, body, current, status, decided)
            delay = _sooner(delay, written_delay)
            if uid in self._gone:
                return None
        if landed:  # else the next pass plans them again
            self.executor.post_events(key[0], body, decided.events)
        self.phases.set(key, status.get("phase") or "Pending")
        self.goodput.set(key, status)
        self.health.set(key, status)
        log.debug(
            "%s/%s: %s, created %d, deleted %d, %d refused, next pass in %s",
            *key,
            status.get("phase"),
            result.created,
            result.deleted,
            len(result.failures),
            delay,
        )
        return _sooner(delay, self.config.resync_seconds or None)

    def _refused_as_gone(self, uid: str, failures: Iterable[ApiFailure]) -> bool:
        """Whether a refusal proved the job gone; recorded for the loop
        (_forget_vanished runs on the event loop, which owns the caches)."""
        if any(f.job_gone for f in failures):
            self._gone.add(uid)
        return uid in self._gone

    def _leave_alone(self, key: JobKey, snapshot: Snapshot, decided: Plan) -> float | None:
        """A job another controller runs (spec.managedBy): no status written;
        nothing executed but the Workload MultiKueue needs (policy/managed.py),
        retried after a refusal; each of its events posted once (the API server
        refuses it again after a restart of this operator: EventSpec.once)."""
        body, delay = snapshot.body, None
        if decided.create or decided.workload_patches:
            result = self.executor.execute(key[0], body, decided)
            delay = self._executed(key, decided, result, snapshot)
        posted = self._left_alone.setdefault(body["metadata"].get("uid", ""), set())
        new = [e for e in decided.events if (e.reason, e.key) not in posted]
        if new:
            posted.update((e.reason, e.key) for e in new)
            self.executor.post_events(key[0], body, new)
        return delay

    def _executed(
        self, key: JobKey, decided: Plan, result: ExecutionResult, snapshot: Snapshot
    ) -> float | None:
        """Records what the plan did; the delay its refusals ask for, if any."""
        self._remember(key, decided, result.created_pods)
        held = self._expectations.setdefault(key, _Expectations()).held
        delay = decided.requeue_after
        if held:  # wake up when the first refused child may be retried
            delay = _sooner(delay, max(0.0, min(held.values()) - time.monotonic()) + 0.05)
        if any(f.kind in NATIVE_KINDS and f.code == 404 for f in result.failures):
            self.discover_native_api()  # the server no longer serves the version in use
        if result.failures:
            backoff = self._api_backoff(key)
            delay = _sooner(delay, backoff)
            # Until then, events about this job do not retry what was refused.
            for refused in result.failures:
                held[refused.name] = time.monotonic() + backoff
        elif not snapshot.observed.held:
            # Only a pass that retried everything and succeeded resets the back-off.
            self._api_failures.pop(key, None)
        return delay

    def _write_once(
        self,
        key: JobKey,
        body: dict[str, Any],
        current: dict[str, Any],
        status: dict[str, Any],
        decided: Plan,
    ) -> tuple[bool, float | None]:
        """The pass's one status write, if it is due: (landed or not needed, the
        delay it asks for: the pacing's hold, or the back-off of a refusal)."""
        uid = body["metadata"].get("uid", "")
        written_at = self._written_at.get(uid)
        hold = wait_before_writing(
            current,
            status,
            None if written_at is None else time.monotonic() - written_at,
            self.config.status_counts_interval_seconds,
        )
        if hold is not None:  # counts alone: shown with the next write, at the latest then
            return True, _sooner(decided.requeue_after, hold)
        if status == current:
            return True, decided.requeue_after
        if self._write_status(key, uid, current, status, decided):
            self._written_over[uid] = _identity(body)
            return True, decided.requeue_after
        return False, _sooner(decided.requeue_after, self._api_backoff(key))

    def _write_status(
        self,
        key: JobKey,
        uid: str,
        current: dict[str, Any],
        status: dict[str, Any],
        decided: Plan,
    ) -> bool:
        """Writes the status over ``current`` (keys it dropped are removed); counts
        the restart it records. False when refused.

        A 422 may be a figure scraped from a pod: the write goes once more
        without the scraped part (what is stored of it stays), so phase,
        restartCount and completionTime still persist.
        """
        namespace, name = key
        patch = with_removals(current, status)
        refused = self.executor.write_status(namespace, name, patch)
        if refused is not None and self._refused_as_gone(uid, [refused]):
            return False
        if refused is not None:
            retry = without_scraped(patch, refused.code)
            if retry is None or self.executor.write_status(namespace, name, retry) is not None:
                return False
            log.warning("%s/%s: status written without its progress (422)", namespace, name)
            status = without_scraped(status, refused.code) or status
        previous = self._last_status.get(uid)
        self._last_status[uid] = status
        self._written_at[uid] = time.monotonic()
        if decided.gang_restart and restarts.gang(read_status(previous)) != restarts.gang(
            read_status(status)
        ):
            metrics.GANG_RESTARTS.labels(reason=decided.gang_restart).inc()
            if decided.disruption:
                metrics.DISRUPTIONS.labels(reason=decided.disruption).inc()
        # Counted once the write that records them in status.elastic landed: a
        # refused write is planned again by the next pass, and counted then.
        for reason in decided.worker_replacements:
            metrics.ELASTIC_REPLACEMENTS.labels(reason=reason).inc()
        for reason in decided.in_place_reasons:
            metrics.IN_PLACE_RESTARTS.labels(reason=reason).inc()
        return True

    def _remember(self, key: JobKey, decided: Any, created_pods: list[str]) -> None:
        """Records creates/deletes so the next pass does not redo them before the watch
        shows them (the job controller's 'expectations')."""
        expected = self._expectations.setdefault(key, _Expectations())
        deadline = time.monotonic() + EXPECTATION_SECONDS
        for name in created_pods:
            expected.created[name] = deadline
        for ref in decided.delete:
            if ref.uid:
                expected.deleted[ref.uid] = deadline

    def _api_backoff(self, key: JobKey) -> float:
        """Exponential back-off for a job whose API calls fail (no hot loop)."""
        failures = self._api_failures.get(key, 0)
        self._api_failures[key] = failures + 1
        return min(
            self.config.apply_backoff_max_seconds,
            self.config.apply_backoff_seconds * 2 ** min(failures, 20),
        )


async def supervise(
    name: str,
    run: Callable[[], Awaitable[None]],
    backoff: float = 1.0,
    max_backoff: float = 30.0,
) -> None:
    """Runs a background task for the operator's lifetime: if it raises (or returns),
    it is logged, counted in torchfleet_operator_task_restarts_total and started
    again after a growing back-off; the operator keeps running."""
    failures = 0
    while True:
        started = time.monotonic()
        try:
            await run()
            log.error("background task %s returned; restarting it", name)
        except Exception:
            log.exception("background task %s failed; restarting it", name)
        metrics.TASK_RESTARTS.labels(task=name).inc()
        # A task that ran well for a while before failing starts over at the short delay.
        failures = 1 if time.monotonic() - started > max_backoff else failures + 1
        await asyncio.sleep(min(max_backoff, backoff * 2 ** min(failures - 1, 16)))


def _identity(body: Mapping[str, Any]) -> dict[str, Any]:
    """What a status write leaves unchanged: the job's metadata less the
    apiserver's bookkeeping. The spec needs no copy: with the status
    subresource, every change to it bumps ``metadata.generation``, and a copy
    of the whole job, kept per job to compare, costs memory at scale."""
    return {
        k: v
        for k, v in (body.get("metadata") or {}).items()
        if k not in ("resourceVersion", "managedFields")
    }


def cached_job(body: Mapping[str, Any]) -> dict[str, Any]:
    """A job as the jobs cache keeps it: a plain dict (kopf's Body is a live
    view; the planner wants a value) without ``managedFields``: nothing here
    reads it, and each manager that writes the job (the operator's status
    writes included) adds its field set to it."""
    job = dict(body)
    meta = job.get("metadata")
    if isinstance(meta, Mapping) and "managedFields" in meta:
        job["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return job


def _status_known_before_executing(decided: Plan) -> bool:
    """Nothing the plan does can change its status: it creates nothing (no
    refusal to report) and does not delete the job (no status to write)."""
    return not decided.create and not decided.dry_run and not decided.delete_job


def runtime_key(ref: tuple[str, str], namespace: str) -> tuple[str, ...]:
    """How the runtime caches key a runtime: (kind, namespace, name) for a
    TrainingRuntime, (kind, name) for a ClusterTrainingRuntime."""
    kind, name = ref
    return (kind, namespace, name) if kind == RUNTIME_KIND else (kind, name)


def _claim_key(body: dict[str, Any]) -> tuple[str, str]:
    meta = body["metadata"]
    return meta["namespace"], checkpoint_claim_name(meta["name"])


def _sooner(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)
