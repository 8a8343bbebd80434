"""The operator's own Prometheus metrics (not the trainer's).

The default registry is used on purpose: it already carries the process
collector (``process_resident_memory_bytes``, ``process_cpu_seconds_total``),
which the benchmark reads to report the operator's RSS and CPU time.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

JOBS = Gauge("torchfleet_operator_jobs", "TrainingJobs known to this operator, by phase", ["phase"])
JOB_PHASE = Gauge(
    "torchfleet_operator_job_phase",
    "1 for each TrainingJob's current phase (kube-state-metrics style), per job",
    # Not "namespace"/"job": Prometheus sets those on every target itself.
    ["job_namespace", "job_name", "phase"],
)
RECONCILE_SECONDS = Histogram(
    "torchfleet_operator_reconcile_duration_seconds",
    "Wall time of one reconcile pass (observe, plan, execute, status write)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
JOB_PASSES = Counter(
    "torchfleet_operator_job_reconcile_passes_total",
    "Per job: reconcile passes run; a job whose count climbs while nothing changes is "
    "hot-looping (and tests wait on it for the pass a change of theirs triggered)",
    ["job_namespace", "job_name"],
)
RECONCILE_ERRORS = Counter(
    "torchfleet_operator_reconcile_errors_total", "Reconcile passes that raised unexpectedly"
)
GANG_RESTARTS = Counter(
    "torchfleet_operator_gang_restarts_total", "Whole-gang restarts started", ["reason"]
)
DISRUPTIONS = Counter(
    "torchfleet_operator_disruptions_total",
    "Gang restarts caused by the platform (preemption, eviction, lost node, deleted pod); "
    "not counted toward backoffLimit",
    ["reason"],
)
IN_PLACE_RESTARTS = Counter(
    "torchfleet_operator_in_place_restarts_total",
    "Restarts of a gang's processes in place (no new pods), as the master reported them",
    ["reason"],
)
ELASTIC_REPLACEMENTS = Counter(
    "torchfleet_operator_elastic_replacements_total",
    "Workers of elastic jobs replaced alone while the rest of the gang kept training",
    ["reason"],
)
PODS_CREATED = Counter("torchfleet_operator_pods_created_total", "Pods created")
PODS_DELETED = Counter("torchfleet_operator_pods_deleted_total", "Pods deleted")
API_ERRORS = Counter(
    "torchfleet_operator_api_errors_total",
    "Kubernetes API calls that failed (409 on create and 404 on delete are not errors)",
    ["verb", "resource", "code"],
)
API_REQUESTS = Counter(
    "torchfleet_operator_api_requests_total",
    "Kubernetes API calls made by the reconciler (kopf's own watches not included)",
    ["verb"],
)
WATCH_RESTARTS = Counter(
    "torchfleet_operator_watch_restarts_total",
    "The operator's own watches started over: after an error (resumed from the last "
    "version seen, with back-off), inactive (silent past the bookmark interval: "
    "resumed) or expired (410 Gone: listed again)",
    ["resource", "reason"],
)
QUEUE_DEPTH = Gauge("torchfleet_operator_workqueue_depth", "Job keys waiting for a worker")
PROGRESS_SCRAPE_ERRORS = Counter(
    "torchfleet_operator_progress_scrape_errors_total",
    "Scrapes of a master's /metrics that gave no progress: unreachable, http (non-2xx), "
    "timeout, too_large, unparseable, or unexpected (a bug; logged)",
    ["reason"],
)
TASK_RESTARTS = Counter(
    "torchfleet_operator_task_restarts_total",
    "Background tasks (the progress poller) that raised and were restarted",
    ["task"],
)

JOB_GOODPUT = Gauge(
    "torchfleet_operator_job_goodput",
    "Per job: the share of the time it was allowed to run (running + restarting) spent on "
    "steps that were kept (status.goodput)",
    ["job_namespace", "job_name"],
)
JOB_TIME_SECONDS = Gauge(
    "torchfleet_operator_job_time_seconds",
    "Per job: where its wall time went (status.timeAccounting). component: wall = queued + "
    "suspended + restarting + running; running = productive + recomputed + checkpoint",
    ["job_namespace", "job_name", "component"],
)
# component label -> status.timeAccounting key
TIME_COMPONENTS = {
    "wall": "wallSeconds",
    "queued": "queuedSeconds",
    "suspended": "suspendedSeconds",
    "restarting": "restartingSeconds",
    "running": "runningSeconds",
    "productive": "productiveSeconds",
    "recomputed": "recomputedSeconds",
    "checkpoint": "checkpointSeconds",
}

JOB_SLOW_WINDOWS = Gauge(
    "torchfleet_operator_job_node_slow_windows",
    "Per job and node of its current gang: log intervals in a row the node's straggler "
    "score was above runPolicy.stragglers.threshold (status.health.nodes[].slowWindows)",
    ["job_namespace", "job_name", "node"],
)
JOB_AVOIDED_NODES = Gauge(
    "torchfleet_operator_job_avoided_nodes",
    "Per job: nodes its pods avoid after a straggler or preflight Replace "
    "(status.health.avoidedNodes)",
    ["job_namespace", "job_name"],
)

LEADER = Gauge(
    "torchfleet_operator_leader",
    "1 while this replica holds the leader Lease (or runs without leader election), else 0",
)


JobKey = tuple[str, str]  # (namespace, name)


class PhaseTracker:
    """Keeps ``torchfleet_operator_jobs{phase}`` and
    ``torchfleet_operator_job_phase{namespace,job,phase}`` equal to the jobs'
    latest phases; a finished or deleted job's old series are removed."""

    def __init__(self) -> None:
        self._phases: dict[JobKey, str] = {}
        self._lock = threading.Lock()

    def set(self, key: JobKey, phase: str) -> None:
        with self._lock:
            old = self._phases.get(key)
            if old == phase:
                return
            if old is not None:
                self._drop(key, old)
            self._phases[key] = phase
            JOBS.labels(phase=phase).inc()
            JOB_PHASE.labels(job_namespace=key[0], job_name=key[1], phase=phase).set(1)

    def with_phase(self, phase: str) -> list[JobKey]:
        with self._lock:
            return [key for key, known in self._phases.items() if known == phase]

    def forget(self, key: JobKey) -> None:
        with self._lock:
            old = self._phases.pop(key, None)
            if old is not None:
                self._drop(key, old)

    @staticmethod
    def _drop(key: JobKey, phase: str) -> None:
        JOBS.labels(phase=phase).dec()
        JOB_PHASE.remove(key[0], key[1], phase)


class GoodputTracker:
    """Keeps ``torchfleet_operator_job_goodput`` and ``torchfleet_operator_job_time_seconds``
    equal to each job's status; a deleted job's series are removed."""

    def __init__(self) -> None:
        self._known: set[JobKey] = set()
        self._lock = threading.Lock()

    def set(self, key: JobKey, status: dict[str, Any]) -> None:
        account = status.get("timeAccounting")
        if not isinstance(account, dict):
            return
        with self._lock:
            self._known.add(key)
            for component, field in TIME_COMPONENTS.items():
                value = account.get(field)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    JOB_TIME_SECONDS.labels(*key, component).set(value)
            fraction = status.get("goodput")
            if isinstance(fraction, int | float) and not isinstance(fraction, bool):
                JOB_GOODPUT.labels(*key).set(fraction)
            else:
                _remove(JOB_GOODPUT, *key)

    def forget(self, key: JobKey) -> None:
        with self._lock:
            if key not in self._known:
                return
            self._known.discard(key)
            _remove(JOB_GOODPUT, *key)
            for component in TIME_COMPONENTS:
                _remove(JOB_TIME_SECONDS, *key, component)


class HealthTracker:
    """Keeps ``torchfleet_operator_job_node_slow_windows`` and
    ``torchfleet_operator_job_avoided_nodes`` equal to each job's status.health;
    the series of a node that left the gang, or of a deleted job, are removed."""

    def __init__(self) -> None:
        self._nodes: dict[JobKey, set[str]] = {}
        self._lock = threading.Lock()

    def set(self, key: JobKey, status: dict[str, Any]) -> None:
        health = status.get("health")
        if not isinstance(health, dict):
            return
        slow = {
            n["node"]: n.get("slowWindows") or 0
            for n in health.get("nodes") or ()
            if isinstance(n, dict) and isinstance(n.get("node"), str)
        }
        with self._lock:
            for gone in self._nodes.get(key, set()) - set(slow):
                _remove(JOB_SLOW_WINDOWS, *key, gone)
            self._nodes[key] = set(slow)
            for node, windows in slow.items():
                JOB_SLOW_WINDOWS.labels(*key, node).set(windows)
            JOB_AVOIDED_NODES.labels(*key).set(len(health.get("avoidedNodes") or ()))

    def forget(self, key: JobKey) -> None:
        with self._lock:
            for node in self._nodes.pop(key, set()):
                _remove(JOB_SLOW_WINDOWS, *key, node)
            _remove(JOB_AVOIDED_NODES, *key)


def _remove(series: Gauge | Counter, *labels: str) -> None:
    with contextlib.suppress(KeyError):  # never set
        series.remove(*labels)


def forget_job_passes(key: JobKey) -> None:
    _remove(JOB_PASSES, *key)


def serve(port: int, address: str = "0.0.0.0") -> None:
    """Serves ``/metrics`` from a daemon thread."""
    start_http_server(port, addr=address)
