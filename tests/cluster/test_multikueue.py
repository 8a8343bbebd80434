"""MultiKueue with local clusters, each with the real Kueue: a TrainingJob of
spec.managedBy kueue.x-k8s.io/multikueue applied on the manager is copied to
a worker by the manager's Kueue (dev/cluster/multikueue.py's objects, the
worker's kubeconfig in a Secret), runs there under the worker's operator on
KWOK nodes, and its status comes back; the manager's operator makes only the
Workload. The workers are more local clusters beside the session's (each its
own folder, every port shifted by WORKER_PORT_SHIFTS on top of the session's)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.cluster import Cluster, _external_kubeconfig, audit_events
from tests.fixtures.kueue import KueueObjects
from tests.fixtures.multikueue import connect, multikueue, queues, side_cluster
from tests.fixtures.operator import JobDriver, kwok_job_spec, launch
from tests.fixtures.poll import wait_for
from torchfleet_operator.api.constants import (
    KUEUE_PREBUILT_WORKLOAD_LABEL,
    MANAGED_BY_MULTIKUEUE,
)
from torchfleet_operator.api.reasons import EVENT_DISPATCHED
from torchfleet_operator.status.conditions import find, is_true

pytestmark = pytest.mark.cluster

# Each worker's ports shift from the session's; the e2e tier's cluster is
# +1000 (dev/test-tiers.sh), so the workers take +500 and +1500.
WORKER_PORT_SHIFTS = {"worker-1": 500, "worker-2": 1500}
CHECK = "torchfleet-multikueue"  # worker-1 alone
CHECK_BOTH = "torchfleet-multikueue-both"  # worker-1 and worker-2
WORKER = "worker-1"


@pytest.fixture(scope="module")
def workers(cluster: Cluster, kueue: str) -> Iterator[dict[str, Cluster]]:
    """Both worker clusters, started one after the other."""
    if _external_kubeconfig():
        pytest.skip("MultiKueue's workers are more local clusters")
    if kueue != multikueue.KUEUE_API:
        pytest.skip(f"Kueue serving {kueue} has no MultiKueue adapter for custom jobs (0.15+)")
    with contextlib.ExitStack() as stack:
        yield {
            name: stack.enter_context(side_cluster(name, shift, worker=True))
            for name, shift in WORKER_PORT_SHIFTS.items()
        }


@pytest.fixture(scope="module")
def worker(workers: dict[str, Cluster]) -> Cluster:
    return workers[WORKER]


@pytest.fixture(scope="module")
def worker_operators(
    workers: dict[str, Cluster], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """An operator on each worker (as the cluster's admin: the chart's RBAC is
    the manager's operator's, tested there)."""
    log_dir = tmp_path_factory.mktemp("worker-operators")
    started = {
        name: launch(w.kubeconfig, log_dir / f"{name}-operator.log") for name, w in workers.items()
    }
    try:
        for operator in started.values():
            operator.wait_ready()
        yield started
    finally:
        for operator in started.values():
            operator.stop()


@dataclass
class Dispatch:
    queue: str  # the LocalQueue, of the same name on every cluster
    drivers: dict[str, JobDriver]  # by worker

    @property
    def worker_driver(self) -> JobDriver:
        return self.drivers[WORKER]

    def spec(self, workers: int) -> dict[str, Any]:
        """A KWOK job MultiKueue runs, in ``queue``."""
        return kwok_job_spec(
            workers=workers,
            managedBy=MANAGED_BY_MULTIKUEUE,
            resources={"cpu": 1},
            scheduling={"queueName": self.queue},
        )


@contextlib.contextmanager
def _dispatching(
    manager: Cluster,
    kueue: str,
    namespace: str,
    check: str,
    workers: dict[str, tuple[Cluster, int]],
) -> Iterator[Dispatch]:
    """The manager connected to ``workers`` (each with its CPU quota) through
    ``check``, the test's namespace on each, a queue on every cluster."""
    connect(manager, check, {name: w for name, (w, _) in workers.items()})
    on_manager = KueueObjects(manager, kueue)
    on_workers = {name: KueueObjects(w, kueue) for name, (w, _) in workers.items()}
    try:
        queue = queues(on_manager, namespace, {"cpu": 100}, check)
        for name, (w, cpu) in workers.items():
            w.kubectl("create", "namespace", namespace)
            queues(on_workers[name], namespace, {"cpu": cpu}, None)
        yield Dispatch(queue, {name: JobDriver(w.api_client()) for name, (w, _) in workers.items()})
    finally:
        on_manager.cleanup()
        for name, (w, _) in workers.items():
            on_workers[name].cleanup()
            w.kubectl("delete", "namespace", namespace, "--wait=false", check=False, timeout=20)


@pytest.fixture
def dispatch(
    cluster: Cluster,
    kueue: str,
    workers: dict[str, Cluster],
    worker_operators: Any,
    namespace: str,
) -> Iterator[Dispatch]:
    """A job of the manager goes to worker-1 alone."""
    with _dispatching(cluster, kueue, namespace, CHECK, {WORKER: (workers[WORKER], 100)}) as found:
        yield found


def _cluster_name(manager: Cluster, namespace: str) -> str | None:
    """The worker the manager's Workload (the namespace's one) was dispatched to."""
    listed = manager.get_json("workloads.kueue.x-k8s.io", "-n", namespace)
    names = [(w.get("status") or {}).get("clusterName") for w in listed["items"]]
    return names[0] if len(names) == 1 else None


def _dispatched_to(driver: JobDriver, namespace: str, name: str) -> list[str]:
    """The worker clusters the operator's events on the manager's job name, in
    the order they were posted (one event per dispatch)."""
    events = driver.wait_events(namespace, name, {EVENT_DISPATCHED}, type="Normal")
    said = sorted(
        (e for e in events if e["reason"] == EVENT_DISPATCHED),
        key=lambda e: (e["firstTimestamp"], e["metadata"]["creationTimestamp"]),
    )
    return [e["message"].split("worker cluster ", 1)[1].split(" ", 1)[0] for e in said]


def _phase(driver: JobDriver, namespace: str, name: str) -> str | None:
    return ((driver.get(namespace, name) or {}).get("status") or {}).get("phase")


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return find(status.get("conditions"), type_)


def test_a_job_on_the_manager_runs_on_the_worker_and_its_status_comes_back(
    cluster, worker, dispatch, shared_operator, job_driver, namespace, chart_identity
):
    worker_driver = dispatch.worker_driver
    job_driver.create(namespace, "far", dispatch.spec(workers=1))

    # The copy on the worker: no managedBy (the worker's operator runs it),
    # under the Workload MultiKueue copied with it, which its operator takes.
    copy = wait_for("the job's copy on the worker", lambda: worker_driver.get(namespace, "far"))
    assert "managedBy" not in copy["spec"]
    prebuilt = copy["metadata"]["labels"][KUEUE_PREBUILT_WORKLOAD_LABEL]
    worker_driver.wait_running_pods(namespace, "far", 2)

    def owned() -> bool:
        wl = worker.get_json("workloads.kueue.x-k8s.io", prebuilt, "-n", namespace)
        return any(
            r.get("uid") == copy["metadata"]["uid"] and r.get("controller")
            for r in wl["metadata"].get("ownerReferences") or ()
        )

    wait_for("the worker's job controls the copied Workload", owned, 30)
    worker_driver.wait_phase(namespace, "far", "Running")
    wait_for(
        "the worker's Running status on the manager's job",
        lambda: _phase(job_driver, namespace, "far") == "Running",
        60,
    )
    manager_wl = cluster.get_json("workloads.kueue.x-k8s.io", prebuilt, "-n", namespace)
    assert manager_wl["status"].get("clusterName") == WORKER
    # The manager's job names the worker (its status, the worker's copy, cannot).
    assert _dispatched_to(job_driver, namespace, "far") == [WORKER]

    for pod in worker_driver.pods(namespace, "far"):
        worker_driver.succeed_pod(namespace, pod["metadata"]["name"])
    worker_driver.wait_phase(namespace, "far", "Succeeded")
    on_worker = worker_driver.status(namespace, "far")
    wait_for(
        "the worker's Succeeded status on the manager's job",
        lambda: _phase(job_driver, namespace, "far") == "Succeeded",
        60,
    )
    final = job_driver.status(namespace, "far")
    assert final["completionTime"] == on_worker["completionTime"]
    assert _condition(final, "Succeeded") == _condition(on_worker, "Succeeded")
    assert final["nodesReady"] == on_worker["nodesReady"]
    # Finished, the manager's Workload is finished and the worker's copy removed.
    wait_for(
        "the worker's copy removed once the job finished",
        lambda: worker_driver.get(namespace, "far") is None,
        60,
    )
    assert job_driver.status(namespace, "far")["phase"] == "Succeeded"
    manager_wl = cluster.get_json("workloads.kueue.x-k8s.io", prebuilt, "-n", namespace)
    assert is_true(manager_wl["status"].get("conditions"), "Finished")

    # The manager's operator made no pod (none exists; the audit log has none).
    assert job_driver.pods(namespace, "far") == []
    created = [
        e
        for e in audit_events(cluster, chart_identity.username)
        if e.get("verb") == "create" and (e.get("objectRef") or {}).get("namespace") == namespace
    ]
    assert {e["objectRef"]["resource"] for e in created} <= {"workloads", "events"}
    assert any(e["objectRef"]["resource"] == "workloads" for e in created)


def test_a_job_deleted_on_the_manager_is_deleted_on_the_worker(
    dispatch, shared_operator, job_driver, namespace
):
    job_driver.create(namespace, "gone", dispatch.spec(workers=0))
    dispatch.worker_driver.wait_running_pods(namespace, "gone", 1)
    job_driver.delete(namespace, "gone")
    wait_for(
        "the worker's copy deleted",
        lambda: dispatch.worker_driver.get(namespace, "gone") is None,
        90,
    )


def _manager_workload(manager: Cluster, namespace: str) -> dict[str, Any] | None:
    listed = manager.get_json("workloads.kueue.x-k8s.io", "-n", namespace)["items"]
    return listed[0] if len(listed) == 1 else None


def test_a_job_suspended_on_the_manager_leaves_the_worker_and_comes_back_on_resume(
    cluster, dispatch, shared_operator, job_driver, namespace
):
    """spec.suspend on the manager, as on one cluster: the operator deactivates
    the manager's Workload, Kueue evicts it, the operator hands its quota back
    and MultiKueue removes the worker's copy; resumed, the Workload is active
    again, admitted and dispatched anew: a new copy runs on the worker."""
    worker_driver = dispatch.worker_driver
    job_driver.create(namespace, "pause", dispatch.spec(workers=0))
    worker_driver.wait_running_pods(namespace, "pause", 1)
    first = worker_driver.get(namespace, "pause")["metadata"]["uid"]
    # Suspended only once the manager's operator has said the first dispatch: a
    # pass sees the Workload as it is then, and under load the first pass after
    # the admission can already find it deactivated (CI-like run, 2026-11-29).
    wait_for(
        "the first dispatch said on the manager's job",
        lambda: _dispatched_to(job_driver, namespace, "pause") == [WORKER],
        60,
        explain=lambda: str(_dispatched_to(job_driver, namespace, "pause")),
    )

    job_driver.patch(namespace, "pause", {"spec": {"suspend": True}})
    wait_for(
        "the worker's copy removed",
        lambda: worker_driver.get(namespace, "pause") is None,
        90,
        explain=lambda: json.dumps(_manager_workload(cluster, namespace), indent=1)[-3000:],
    )
    wait_for(
        "the manager's Workload inactive, its quota handed back",
        lambda: (
            (wl := _manager_workload(cluster, namespace))
            and wl["spec"].get("active") is False
            and not (wl.get("status") or {}).get("admission")
        ),
        60,
    )
    assert worker_driver.pods(namespace, "pause") == []

    job_driver.patch(namespace, "pause", {"spec": {"suspend": False}})
    again = wait_for(
        "a new copy on the worker",
        lambda: (
            (found := worker_driver.get(namespace, "pause"))
            and found["metadata"]["uid"] != first
            and found
        ),
        120,
        explain=lambda: json.dumps(_manager_workload(cluster, namespace), indent=1)[-3000:],
    )
    assert "suspend" not in again["spec"] or again["spec"]["suspend"] is False
    worker_driver.wait_running_pods(namespace, "pause", 1)
    wait_for(
        "both dispatches said on the manager's job",
        lambda: _dispatched_to(job_driver, namespace, "pause") == [WORKER, WORKER],
        30,
        explain=lambda: str(_dispatched_to(job_driver, namespace, "pause")),
    )
    assert job_driver.pods(namespace, "pause") == []


def test_of_two_workers_the_job_goes_to_the_one_with_room(
    cluster, kueue, workers, worker_operators, shared_operator, job_driver, namespace
):
    full, roomy = "worker-1", "worker-2"
    quotas = {full: (workers[full], 0), roomy: (workers[roomy], 100)}
    with _dispatching(cluster, kueue, namespace, CHECK_BOTH, quotas) as dispatch:
        job_driver.create(namespace, "fits", dispatch.spec(workers=1))
        dispatch.drivers[roomy].wait_running_pods(namespace, "fits", 2)
        wait_for(
            f"the manager's Workload dispatched to {roomy}",
            lambda: _cluster_name(cluster, namespace) == roomy,
            60,
        )
        wait_for(
            "the worker's Running status on the manager's job",
            lambda: _phase(job_driver, namespace, "fits") == "Running",
            60,
        )
        # The job was never copied to the full worker (only its Workload, tried there).
        assert dispatch.drivers[full].get(namespace, "fits") is None
        assert dispatch.drivers[full].pods(namespace, "fits") == []


def test_a_job_whose_worker_stops_is_dispatched_to_the_other(
    cluster, kueue, workers, worker_operators, shared_operator, job_driver, namespace
):
    """Last in the module: it stops a worker's API server (the fixture's
    teardown stops the rest of that cluster)."""
    quotas = {name: (w, 100) for name, w in workers.items()}
    with _dispatching(cluster, kueue, namespace, CHECK_BOTH, quotas) as dispatch:
        job_driver.create(namespace, "moves", dispatch.spec(workers=0))
        first = wait_for("the job dispatched", lambda: _cluster_name(cluster, namespace), 60)
        [other] = [name for name in workers if name != first]
        dispatch.drivers[first].wait_running_pods(namespace, "moves", 1)
        root = Path(workers[first].kubeconfig).parent
        pid = int((root / "run" / "kube-apiserver.pid").read_text())
        os.kill(pid, signal.SIGTERM)
        wait_for(
            f"{first}'s API server gone",
            lambda: (
                workers[first].kubectl("get", "--raw", "/readyz", check=False, timeout=5).returncode
            ),
            60,
        )
        # Kueue keeps the Workload on the lost worker for workerLostTimeout
        # (dev/cluster/kueue.py: 20 s) once its client gives up on the worker
        # (its retries back off: about 80 s here), then admits it again, and the
        # other worker gets the job.
        wait_for(
            f"the job copied to {other}",
            lambda: dispatch.drivers[other].get(namespace, "moves"),
            240,
        )
        # Its first copy there may be one MultiKueue deactivates (the Workload
        # the manager evicted when the worker was lost) and then replaces.
        dispatch.drivers[other].wait_running_pods(namespace, "moves", 1, timeout=240)
        dispatch.drivers[other].wait_phase(namespace, "moves", "Running")
        wait_for(
            f"the manager's Workload names {other}",
            lambda: _cluster_name(cluster, namespace) == other,
            60,
        )
        wait_for(
            f"{other}'s Running status on the manager's job",
            lambda: _phase(job_driver, namespace, "moves") == "Running",
            60,
        )
        assert job_driver.pods(namespace, "moves") == []
        wait_for(
            f"the manager's job saying it went to {first}, then to {other}",
            lambda: _dispatched_to(job_driver, namespace, "moves") == [first, other],
            30,
            explain=lambda: str(_dispatched_to(job_driver, namespace, "moves")),
        )
