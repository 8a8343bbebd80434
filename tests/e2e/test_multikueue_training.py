"""MultiKueue with real training (issue 45): a TrainingJob applied on a
manager cluster is dispatched by the manager's Kueue to this (the e2e)
cluster, whose operator and node agent train it to Succeeded as any job; the
manager's job ends with the worker's final status (its completion time,
Succeeded condition and last step), names the worker in an event, and has no
pod. The manager is another local cluster with its own Kueue and operator,
every port +1000 from the e2e cluster's (tests/fixtures/multikueue.py); the
cluster tier's tests/cluster/test_multikueue.py covers the rest of the
lifecycle with KWOK workers."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.test_training import (
    SHAKESPEARE,
    VAL_LOSS_THRESHOLD,
    events,
    get_job,
    wait_job,
    write_corpus,
)
from tests.fixtures.cluster import Cluster, _external_kubeconfig
from tests.fixtures.kueue import KueueObjects
from tests.fixtures.multikueue import allow_manager, connect, multikueue, queues, side_cluster
from tests.fixtures.operator import JobDriver, OperatorProcess, launch
from tests.fixtures.poll import wait_for
from torchfleet_operator.api.constants import MANAGED_BY_MULTIKUEUE
from torchfleet_operator.api.reasons import EVENT_DISPATCHED
from torchfleet_operator.status.conditions import find

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.timeout(900)]

# The manager's ports, from this cluster's (+1000 of the session's): +2000 in
# all, clear of the cluster tier's workers (+500, +1500) running beside it.
MANAGER_SHIFT = 1000
CHECK = "torchfleet-multikueue-e2e"
WORKER = "e2e-worker"
# Enough to learn (the example's threshold holds by then), few enough to be quick.
STEPS = 100


@pytest.fixture(scope="module")
def manager(cluster: Cluster, kueue: str) -> Iterator[Cluster]:
    if _external_kubeconfig():
        pytest.skip("the MultiKueue manager is another local cluster")
    if kueue != multikueue.KUEUE_API:
        pytest.skip(f"Kueue serving {kueue} has no MultiKueue adapter for custom jobs (0.15+)")
    allow_manager(cluster)
    with side_cluster("manager", MANAGER_SHIFT, worker=False) as started:
        yield started


@pytest.fixture(scope="module")
def manager_operator(
    manager: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """The manager's operator: it makes the job's Workload there, and nothing else."""
    operator = launch(manager.kubeconfig, tmp_path_factory.mktemp("manager") / "operator.log")
    try:
        operator.wait_ready()
        yield operator
    finally:
        operator.stop()


def dispatched_job(queue: str) -> dict[str, Any]:
    job = copy.deepcopy(SHAKESPEARE)
    job["metadata"] = {"name": "far"}
    job["spec"]["managedBy"] = MANAGED_BY_MULTIKUEUE
    job["spec"]["scheduling"] = {"queueName": queue}
    job["spec"]["trainer"]["training"]["steps"] = STEPS
    return job


def test_a_job_dispatched_from_a_manager_trains_here_and_its_final_status_goes_back(
    cluster, kueue, node_agent, e2e_operator, e2e_namespace, manager, manager_operator
):
    namespace = e2e_namespace
    connect(manager, CHECK, {WORKER: cluster})
    on_manager, on_worker = KueueObjects(manager, kueue), KueueObjects(cluster, kueue)
    manager.kubectl("create", "namespace", namespace)
    try:
        queue = queues(on_manager, namespace, {"cpu": 100, "memory": "100Gi"}, CHECK)
        # Room for the job's two pods (1 CPU, 2Gi each) on this cluster.
        queues(on_worker, namespace, {"cpu": 2, "memory": "4Gi"}, None)
        write_corpus(cluster, namespace, node_agent)
        manager.kubectl(
            "apply", "-n", namespace, "-f", "-", input=json.dumps(dispatched_job(queue))
        )

        here_driver = JobDriver(cluster.api_client())
        copied = wait_for("the job's copy here", lambda: here_driver.get(namespace, "far"), 120)
        assert "managedBy" not in copied["spec"]
        here = wait_job(cluster, namespace, "far", {"Succeeded", "Failed"}, 600)
        assert here["status"]["phase"] == "Succeeded", here["status"]
        master = node_agent.logs(namespace, "far-master-0", "trainer")[-1]
        evals = events(master, "eval")
        assert evals and evals[-1]["step"] == STEPS
        assert evals[-1]["val_loss"] < VAL_LOSS_THRESHOLD

        there = wait_for(
            "the worker's Succeeded status on the manager's job",
            lambda: (
                (job := get_job(manager, namespace, "far")).get("status", {}).get("phase")
                == "Succeeded"
                and job
            ),
            120,
            explain=lambda: str(get_job(manager, namespace, "far").get("status")),
        )
        final, done = there["status"], here["status"]
        assert final["completionTime"] == done["completionTime"]
        assert find(final["conditions"], "Succeeded") == find(done["conditions"], "Succeeded")
        assert final["progress"]["step"] == done["progress"]["step"] == STEPS
        said = JobDriver(manager.api_client()).wait_events(namespace, "far", {EVENT_DISPATCHED})
        assert any(f"worker cluster {WORKER} " in e["message"] for e in said), said
        assert manager.get_json("pods", "-n", namespace)["items"] == []
    finally:
        on_manager.cleanup()
        on_worker.cleanup()
        manager.kubectl("delete", "namespace", namespace, "--wait=false", check=False, timeout=20)
