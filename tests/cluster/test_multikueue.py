"""MultiKueue with two local clusters, each with the real Kueue: a TrainingJob
of spec.managedBy kueue.x-k8s.io/multikueue applied on the manager is copied
to the worker by the manager's Kueue (dev/cluster/multikueue.py's objects, the
worker's kubeconfig in a Secret), runs there under the worker's operator on
KWOK nodes, and its status comes back; the manager's operator makes only the
Workload. The worker is a second local cluster beside the session's (its own
folder, every port shifted by WORKER_PORT_SHIFT on top of the session's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.cluster import (
    Cluster,
    _external_kubeconfig,
    _load_localcluster,
    audit_events,
)
from tests.fixtures.kueue import KueueObjects
from tests.fixtures.operator import (
    REPO,
    RUNTIME_CRDS,
    JobDriver,
    apply_crd,
    kwok_job_spec,
    launch,
)
from tests.fixtures.poll import wait_for
from torchfleet_operator.api.constants import (
    KUEUE_PREBUILT_WORKLOAD_LABEL,
    MANAGED_BY_MULTIKUEUE,
)
from torchfleet_operator.status.conditions import find, is_true

pytestmark = pytest.mark.cluster

# dev/cluster/multikueue.py, loaded by path as the harness loads its add-ons.
multikueue = _load_localcluster().load_addon("multikueue")

# The e2e tier's cluster is +1000 (dev/test-tiers.sh): the worker sits between.
WORKER_PORT_SHIFT = 500
CHECK = "torchfleet-multikueue"
WORKER = "worker-1"


def _worker_env() -> dict[str, str]:
    manager = _load_localcluster().LocalCluster()
    offset = int(os.environ.get("TORCHFLEET_CLUSTER_PORT_OFFSET", "0")) + WORKER_PORT_SHIFT
    return {
        **os.environ,
        "TORCHFLEET_CLUSTER_DIR": f"{manager.root}-mk-{WORKER}",
        "TORCHFLEET_CLUSTER_PORT_OFFSET": str(offset),
    }


def _localcluster(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, str(REPO / "dev" / "cluster" / "localcluster.py"), *args],
        env=_worker_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, f"localcluster {' '.join(args)} (worker): {out.stderr[-3000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def worker(cluster: Cluster, kueue: str) -> Iterator[Cluster]:
    """The worker cluster with its Kueue, the CRDs, and the manager's access."""
    if _external_kubeconfig():
        pytest.skip("MultiKueue's worker is a second local cluster")
    if kueue != multikueue.KUEUE_API:
        pytest.skip(f"Kueue serving {kueue} has no MultiKueue adapter for custom jobs (0.15+)")
    root = Path(_worker_env()["TORCHFLEET_CLUSTER_DIR"])
    started = Cluster(kubeconfig=str(root / "kubeconfig"), bin_dir=root / "bin")
    # One started by hand (the same command) is left running, as the session's.
    already_running = (root / "kubeconfig").exists() and not started.kubectl(
        "get", "--raw", "/readyz", check=False, timeout=10
    ).returncode
    _localcluster("up", "--with", "kueue")
    try:
        apply_crd(started.kubectl)
        for name in RUNTIME_CRDS:
            started.kubectl("apply", "--server-side", "-f", str(REPO / "crds" / f"{name}.yaml"))
        started.kubectl("apply", "-f", "-", input=multikueue.as_list(multikueue.worker_access()))
        yield started
    finally:
        if not already_running:
            _localcluster("down")


def _connect(manager: Cluster, worker: Cluster) -> None:
    """The manager's Kueue reaches the worker as the worker's ServiceAccount."""
    token = worker.kubectl(
        "create",
        "token",
        multikueue.WORKER_ACCOUNT,
        "-n",
        multikueue.KUEUE_NAMESPACE,
        "--duration=2h",
    ).stdout.strip()
    admin = json.loads(Path(worker.kubeconfig).read_text())
    server = admin["clusters"][0]["cluster"]["server"]
    ca = (Path(worker.kubeconfig).parent / "pki" / "ca.crt").read_bytes()
    kubeconfig = multikueue.worker_kubeconfig(WORKER, server, ca, token)
    objects = multikueue.manager_objects(CHECK, {WORKER: kubeconfig})
    manager.kubectl("apply", "-f", "-", input=multikueue.as_list(objects))

    def active() -> bool:
        found = manager.get_json("multikueuecluster", WORKER)
        return any(
            c["type"] == "Active" and c["status"] == "True"
            for c in (found.get("status") or {}).get("conditions") or ()
        )

    wait_for(f"MultiKueueCluster {WORKER} Active", active, 90)


@pytest.fixture(scope="module")
def worker_operator(worker: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    log_dir = tmp_path_factory.mktemp("worker-operator")
    operator = launch(worker.kubeconfig, log_dir / "operator.log")
    try:
        operator.wait_ready()
        yield operator
    finally:
        operator.stop()


def _queues(objects: KueueObjects, namespace: str, check: str | None) -> str:
    flavor = objects.flavor("default")
    cq = objects.cluster_queue("mk", [(flavor, {"cpu": 100})])
    if check:
        objects.cluster.kubectl(
            "patch",
            "clusterqueue",
            cq,
            "--type=merge",
            "-p",
            json.dumps(
                {"spec": {"admissionChecksStrategy": {"admissionChecks": [{"name": check}]}}}
            ),
        )
    return objects.local_queue(namespace, "team", cq)


@dataclass
class Dispatch:
    queue: str  # the LocalQueue, of the same name on both clusters
    worker_driver: JobDriver

    def spec(self, workers: int) -> dict[str, Any]:
        """A KWOK job MultiKueue runs, in ``queue``."""
        return kwok_job_spec(
            workers=workers,
            managedBy=MANAGED_BY_MULTIKUEUE,
            resources={"cpu": 1},
            scheduling={"queueName": self.queue},
        )


@pytest.fixture
def dispatch(
    cluster: Cluster, kueue: str, worker: Cluster, worker_operator: Any, namespace: str
) -> Iterator[Dispatch]:
    """The manager connected to the worker, the test's namespace on both, a
    queue on both (the manager's through the MultiKueue check)."""
    _connect(cluster, worker)
    worker.kubectl("create", "namespace", namespace)
    on_manager, on_worker = KueueObjects(cluster, kueue), KueueObjects(worker, kueue)
    try:
        queue = _queues(on_manager, namespace, CHECK)
        _queues(on_worker, namespace, None)
        yield Dispatch(queue, JobDriver(worker.api_client()))
    finally:
        on_manager.cleanup()
        on_worker.cleanup()
        worker.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


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
