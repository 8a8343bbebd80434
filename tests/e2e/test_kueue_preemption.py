"""Kueue preemption with real training: the preempted trainer saves at the step it
reached, and the re-admitted job resumes at exactly that step.

A low-priority Shakespeare job (examples/shakespeare-ddp.yaml, here trained for
150 steps with no periodic checkpoint before the end) trains in a ClusterQueue
with room for one job's CPUs. A high-priority job arrives: Kueue preempts the
low one, the operator deletes its pods with their grace period, the trainer
gets SIGTERM and saves a checkpoint at its current step (its only one), the
quota is handed back, the high job runs and ends; Kueue re-admits the low job,
which resumes at that step and finishes with the validation loss of an
uninterrupted run (the same threshold as test_training.py).
"""

from __future__ import annotations

import copy
import threading
import time
from datetime import datetime
from typing import Any

import pytest

from tests.e2e.test_training import (
    SHAKESPEARE,
    VAL_LOSS_THRESHOLD,
    events,
    failure_report,
    get_job,
    wait_job,
    write_corpus,
)
from tests.fixtures.e2e import LOCAL_PLACEMENT, apply_objects

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.timeout(1200)]

# Half the example's 300: what is asserted happens by step 60, and at 150 steps
# (the cosine schedule ending there) the validation loss is still well below the
# threshold. Saves the test tier about 20 s of training.
TOTAL_STEPS = 150
# Preempt once the trainer is past this step.
PREEMPT_AFTER_STEP = 60


def queued(manifest: dict[str, Any], name: str, queue: str, priority: str) -> dict[str, Any]:
    job = copy.deepcopy(manifest)
    job["metadata"] = {"name": name}
    job["spec"]["scheduling"] = {"queueName": queue, "priorityClassName": priority}
    return job


def short_job(name: str, queue: str, priority: str) -> dict[str, Any]:
    """Same shape and CPUs as the Shakespeare job, runs a few seconds and succeeds."""
    template = {"spec": copy.deepcopy(LOCAL_PLACEMENT)}
    return {
        "apiVersion": "torchfleet.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "resources": {"cpu": 1, "memory": "2Gi"},
            "command": ["python", "-c", "import time; time.sleep(5)"],
            "master": {"template": template},
            "worker": {"replicas": 1, "template": template},
            "scheduling": {"queueName": queue, "priorityClassName": priority},
        },
    }


class StatusWatch:
    """Every status the API server sends for one TrainingJob, from a watch in a
    thread (one connection, not a poll): what a user running `kubectl get -w`
    sees. A watch the API server ends (it does when a CRD is applied) resumes
    from the last version seen, or lists again when that is gone."""

    def __init__(self, cluster: Any, namespace: str, name: str) -> None:
        from kubernetes import client

        self.seen: list[dict[str, Any]] = []
        self._stopped = threading.Event()
        self._api = client.CustomObjectsApi(cluster.api_client())
        self._where = (namespace, name)
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        from kubernetes import watch

        version: str | None = None
        while not self._stopped.is_set():
            stream = watch.Watch().stream(
                self._api.list_namespaced_custom_object,
                "torchfleet.dev",
                "v1alpha1",
                self._where[0],
                "trainingjobs",
                field_selector=f"metadata.name={self._where[1]}",
                resource_version=version,
                timeout_seconds=30,
            )
            try:
                for event in stream:
                    if event["type"] == "ERROR":  # 410 Gone: list again
                        version = None
                        break
                    version = event["object"]["metadata"]["resourceVersion"]
                    self.seen.append(copy.deepcopy(event["object"].get("status") or {}))
            except Exception:  # the connection ended: resume from the last version
                time.sleep(0.2)

    def stop(self) -> list[dict[str, Any]]:
        self._stopped.set()
        return list(self.seen)


def test_preempted_job_resumes_at_the_step_it_was_preempted(
    cluster, kueue, kueue_objects, node_agent, e2e_operator, e2e_namespace
):
    namespace = e2e_namespace
    low = kueue_objects.priority_class("e2e-low", 100)
    high = kueue_objects.priority_class("e2e-high", 1000)
    flavor = kueue_objects.flavor("e2e-cpu")
    # Room for exactly one job: 2 pods x (1 CPU, 2Gi).
    cq = kueue_objects.cluster_queue(
        "e2e-one-job",
        [(flavor, {"cpu": 2, "memory": "4Gi"})],
        preemption={"withinClusterQueue": "LowerPriority"},
    )
    queue = kueue_objects.local_queue(namespace, "team-a", cq)
    write_corpus(cluster, namespace, node_agent)
    name = "low"
    master = f"{name}-master-0"
    low_job = queued(SHAKESPEARE, name, queue, low)
    low_job["spec"]["trainer"]["training"]["steps"] = TOTAL_STEPS
    # No periodic checkpoint before the end: a checkpoint of the preempted run
    # can only be the save on SIGTERM (with the example's 50, a SIGTERM that
    # came during step 100's evaluation stopped on a periodic one).
    low_job["spec"]["trainer"]["checkpoint"]["interval"] = TOTAL_STEPS
    apply_objects(cluster, namespace, low_job)
    statuses = StatusWatch(cluster, namespace, name)

    def first_run() -> str:
        return (node_agent.logs(namespace, master, "trainer") or [""])[0]

    try:
        deadline = time.monotonic() + 540
        while not any(e["step"] >= PREEMPT_AFTER_STEP for e in events(first_run(), "step")):
            assert time.monotonic() < deadline, f"no step {PREEMPT_AFTER_STEP} in 540s"
            time.sleep(0.5)
        apply_objects(cluster, namespace, short_job("urgent", queue, high))

        # The low job's trainer got SIGTERM and saved where it was.
        deadline = time.monotonic() + 120
        while not events(first_run(), "preempted"):
            assert time.monotonic() < deadline, "the low job's trainer was never preempted"
            time.sleep(0.5)
        (preempted,) = events(first_run(), "preempted")
        stopped_at = preempted["step"]
        assert PREEMPT_AFTER_STEP <= stopped_at < TOTAL_STEPS, preempted
        assert [e["step"] for e in events(first_run(), "checkpoint")] == [stopped_at]
        job = get_job(cluster, namespace, name)
        evicted = next(c for c in job["status"]["conditions"] if c["type"] == "Evicted")
        assert evicted["status"] == "True" and evicted["reason"] == "Preempted", evicted

        assert wait_job(cluster, namespace, "urgent", {"Succeeded"}, 300)
        job = wait_job(cluster, namespace, name, {"Succeeded", "Failed"}, 540)
        assert job["status"]["phase"] == "Succeeded", job["status"]
        assert job["status"]["restartCount"] == 0 and job["status"]["disruptions"] == 1

        runs = node_agent.logs(namespace, master, "trainer")
        assert len(runs) == 2, f"expected the preempted run and the resumed one: {len(runs)}"
        final = runs[-1]
        assert [e["step"] for e in events(final, "resumed")] == [stopped_at]
        steps_after = [e["step"] for e in events(final, "step")]
        assert min(steps_after) > stopped_at and max(steps_after) == TOTAL_STEPS
        evals = events(final, "eval")
        assert evals and evals[-1]["step"] == TOTAL_STEPS
        assert evals[-1]["val_loss"] < VAL_LOSS_THRESHOLD

        # What the status said on the way. The save on SIGTERM came after the
        # operator's last scrape; the trainer's termination message told it:
        # progress never went back (the run resumed at the last step it had
        # shown or later), the checkpoint is dated when it was saved, and no
        # second counts as recomputed (no step was done twice).
        seen = statuses.stop()
        steps = [s["progress"]["step"] for s in seen if "step" in (s.get("progress") or {})]
        assert steps == sorted(steps), f"progress went backwards: {steps}"
        (save,) = events(first_run(), "checkpoint")
        shown = next(s["lastCheckpoint"] for s in seen if s.get("lastCheckpoint"))
        assert shown["step"] == stopped_at, shown
        saved_at = datetime.fromisoformat(shown["time"]).timestamp()
        assert abs(saved_at - save["time"]) < 1.5, (shown, save["time"])
        assert job["status"]["timeAccounting"]["recomputedSeconds"] == 0, job["status"]
    except AssertionError as error:
        raise AssertionError(
            f"{error}\n{failure_report(cluster, namespace, node_agent, e2e_operator)}"
        ) from None
