"""A job's final status is its trainer's, however soon after the last scrape it ends.

examples/shakespeare-ddp.yaml cut to a 1 + 1 gang and 40 steps, which a tiny
model runs in a second or two: far less than the operator's scrape interval.
The trainer holds itself at step 10 (tests/e2e/hold) until the status shows
a scrape of it there, mid-run; released, it runs its last 30 steps, its final
evaluation and its final save before any later scrape is due. What the job
shows once Succeeded must be what its trainer's last log lines say: the last
step, loss, validation loss, throughput and checkpoint, taken from the master's
termination message in the pass that sets the phase (not the step-10 scrape).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.test_training import (
    corpus_namespace,
    events,
    failure_report,
    get_job,
    load_example,
    wait_job,
)
from tests.fixtures.e2e import apply_objects, held_at
from tests.fixtures.poll import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.timeout(900)]

NAME = "final-status"
STEPS = 40
HELD_AT_STEP = 10
CHECKPOINT_INTERVAL = 20


def short_job() -> dict[str, Any]:
    job = load_example("shakespeare-ddp.yaml")
    job["metadata"]["name"] = NAME
    spec = job["spec"]
    spec["processesPerNode"] = 1
    trainer = spec["trainer"]
    trainer["training"] |= {"steps": STEPS, "logInterval": 5, "evalInterval": 20}
    trainer["training"]["evalBatches"] = 2
    trainer["parallel"]["dataParallelReplicate"] = 2
    trainer["checkpoint"]["interval"] = CHECKPOINT_INTERVAL
    return job


def _progress(cluster: Any, namespace: str) -> dict[str, Any]:
    return dict((get_job(cluster, namespace, NAME).get("status") or {}).get("progress") or {})


def test_a_job_ending_between_scrapes_shows_its_trainers_last_figures(
    cluster, node_agent, e2e_operator
):
    with corpus_namespace(cluster, node_agent, e2e_operator, "e2e-final") as namespace:
        job = short_job()
        (hold,) = held_at(job, node_agent, namespace, ("step", HELD_AT_STEP))
        apply_objects(cluster, namespace, job)
        wait_for("the trainer held at step 10", hold.held, timeout=420)
        # A scrape of the held run reached the status: the last one before the end.
        scraped = wait_for(
            "a scrape of the held run in status.progress",
            lambda: (
                (p := _progress(cluster, namespace)).get("source") == "Metrics"
                and p.get("step") == HELD_AT_STEP
                and p
            ),
            timeout=120,
        )
        hold.release()
        try:
            done = wait_job(cluster, namespace, NAME, {"Succeeded", "Failed"}, timeout=420)
            assert done["status"]["phase"] == "Succeeded"
        except AssertionError as error:
            report = failure_report(cluster, namespace, node_agent, e2e_operator)
            raise AssertionError(f"{error}\n{report}") from None

        log = node_agent.logs(namespace, f"{NAME}-master-0", "trainer")[-1]
        last_step = events(log, "step")[-1]
        last_eval = events(log, "eval")[-1]
        last_save = events(log, "checkpoint")[-1]
        assert last_step["step"] == last_eval["step"] == last_save["step"] == STEPS
        status = done["status"]
        progress = status["progress"]
        # Not the step-10 scrape: the trainer's own last figures.
        assert scraped["step"] == HELD_AT_STEP < progress["step"]
        assert progress["source"] == "TrainerReport", progress
        assert progress["step"] == progress["totalSteps"] == STEPS
        assert progress["percent"] == 100
        assert progress["loss"] == pytest.approx(last_step["loss"], abs=1e-6)
        assert progress["validationLoss"] == pytest.approx(last_eval["val_loss"], abs=1e-6)
        # The log rounds throughput to 0.1 token/s, the status to 0.001.
        assert progress["tokensPerSecond"] == pytest.approx(
            last_step["tokens_per_second"], abs=0.051
        )
        assert "etaSeconds" not in progress  # nothing is left to estimate
        assert status["lastCheckpoint"]["step"] == STEPS
        assert (node_agent.claim_dir(namespace, f"{NAME}-checkpoint") / "step-00000040").is_dir()
        # What `kubectl get tj -o wide` prints: the same final figures.
        row = cluster.kubectl("get", "tj", NAME, "-n", namespace, "-o", "wide").stdout
        header, values = (line.split() for line in row.splitlines()[:2])
        shown = dict(zip(header, values, strict=False))
        assert shown["PHASE"] == "Succeeded" and shown["PROGRESS"] == "100"
        assert shown["CHECKPOINT"] == str(STEPS)
        assert float(shown["VAL-LOSS"]) == pytest.approx(last_eval["val_loss"], abs=1e-6)
