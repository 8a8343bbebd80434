"""The operator against a real apiserver with KWOK nodes: the job lifecycle.

One operator process serves the module; every test has its own namespace.
KWOK runs pods on fake GPU nodes and fails or completes them on demand.
"""

from __future__ import annotations

import time

import pytest

from tests.fixtures.operator import kwok_job_spec as spec
from torchfleet_operator.status.conditions import find

pytestmark = pytest.mark.cluster


def test_create_runs_the_gang_and_a_second_pass_changes_nothing(
    shared_operator, job_driver, namespace
):
    job_driver.create(namespace, "llm", spec(workers=2))
    pods = job_driver.wait_running_pods(namespace, "llm", 3)
    status = job_driver.wait_phase(namespace, "llm", "Running")
    assert status["nodesReady"] == "3/3" and status["restartCount"] == 0
    assert sorted(p["metadata"]["name"] for p in pods) == [
        "llm-master-0",
        "llm-worker-0",
        "llm-worker-1",
    ]
    master = next(p for p in pods if p["metadata"]["name"] == "llm-master-0")
    env = {e["name"]: e.get("value") for e in master["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == f"llm-master-0.llm.{namespace}.svc"
    assert env["NNODES"] == "3" and env["NODE_RANK"] == "0" and env["RANK"] == "0"
    assert master["metadata"]["ownerReferences"][0]["kind"] == "TrainingJob"
    service = job_driver.get_core(namespace, "services", "llm")
    assert service is not None and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    job_driver.wait_events(namespace, "llm", {"Pending", "GangRunning"})

    # A spec-irrelevant change triggers a full pass: no pod or status write follows.
    before = {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in pods}
    job_before = job_driver.get(namespace, "llm")
    passes = shared_operator.passes((namespace, "llm"))
    job_driver.patch(namespace, "llm", {"metadata": {"labels": {"touched": "yes"}}})
    touched_rv = job_driver.wait_for(
        "the label change",
        lambda: (
            (j := job_driver.get(namespace, "llm"))
            and j["metadata"].get("labels", {}).get("touched")
            and j["metadata"]["resourceVersion"]
        ),
    )
    shared_operator.wait_idle_after(
        passes, (namespace, "llm")
    )  # the pass the change triggered has run
    after = {
        p["metadata"]["name"]: p["metadata"]["resourceVersion"]
        for p in job_driver.live_pods(namespace, "llm")
    }
    assert after == before
    assert job_driver.get(namespace, "llm")["metadata"]["resourceVersion"] == touched_rv
    assert job_before["status"] == job_driver.get(namespace, "llm")["status"]
    assert shared_operator.metric("torchfleet_operator_jobs", phase="Running") >= 1


def test_worker_exit_137_restarts_the_gang_exit_1_fails_the_job(
    shared_operator, job_driver, namespace
):
    job_driver.create(namespace, "llm", spec(runPolicy={"restartPolicy": "ExitCode"}))
    old = job_driver.wait_running_pods(namespace, "llm", 3)
    job_driver.fail_pod(namespace, "llm-worker-1", exit_code=137)
    new = job_driver.wait_running_pods(namespace, "llm", 3, restart=1)
    status = job_driver.wait_phase(namespace, "llm", "Running")
    assert status["restartCount"] == 1
    assert not {p["metadata"]["uid"] for p in old} & {p["metadata"]["uid"] for p in new}
    env = {e["name"]: e.get("value") for e in new[0]["spec"]["containers"][0]["env"]}
    assert env["TORCHFLEET_RESTART_COUNT"] == "1"
    # The Restarting transition, with the failure as its reason.
    job_driver.wait_events(namespace, "llm", {"PodFailed"}, type="Warning")
    assert (
        shared_operator.metric("torchfleet_operator_gang_restarts_total", reason="PodFailed") >= 1
    )

    job_driver.fail_pod(namespace, "llm-worker-0", exit_code=1)
    failed = job_driver.wait_phase(namespace, "llm", "Failed")
    message = find(failed.get("conditions"), "Failed")["message"]
    assert "llm-worker-0" in message and "exit code 1" in message
    assert failed["restartCount"] == 1


def test_backoff_limit_exhausted_fails_with_reason(shared_operator, job_driver, namespace):
    job_driver.create(namespace, "llm", spec(workers=1, runPolicy={"backoffLimit": 1}))
    job_driver.wait_running_pods(namespace, "llm", 2)
    job_driver.fail_pod(namespace, "llm-master-0", exit_code=137)
    job_driver.wait_running_pods(namespace, "llm", 2, restart=1)
    job_driver.fail_pod(namespace, "llm-worker-0", exit_code=137)
    failed = job_driver.wait_phase(namespace, "llm", "Failed")
    reason = find(failed.get("conditions"), "Failed")
    assert reason["reason"] == "BackoffLimitExceeded"
    assert "llm-worker-0" in reason["message"] and "137" in reason["message"]
    # BackoffLimitExceeded deletes every pod, whatever cleanPodPolicy (Running) says.
    job_driver.wait_for("every pod deleted", lambda: not job_driver.pods(namespace, "llm"))


def test_master_success_succeeds_and_cleans_running_pods(shared_operator, job_driver, namespace):
    job_driver.create(namespace, "llm", spec(runPolicy={"ttlSecondsAfterFinished": 3}))
    job_driver.wait_running_pods(namespace, "llm", 3)
    assert shared_operator.passes((namespace, "llm")) >= 1
    job_driver.succeed_pod(namespace, "llm-master-0")
    status = job_driver.wait_phase(namespace, "llm", "Succeeded")
    assert status["completionTime"]
    job_driver.wait_for(
        "workers deleted, master kept",
        lambda: (
            [p["metadata"]["name"] for p in job_driver.live_pods(namespace, "llm")]
            == ["llm-master-0"]
        ),
    )
    # ttlSecondsAfterFinished: the job goes, and the garbage collector takes the rest.
    job_driver.wait_for(
        "TTL deletion", lambda: job_driver.get(namespace, "llm") is None, timeout=30
    )
    # A deleted job leaves no per-job series behind in the operator's /metrics.
    job_driver.wait_for(
        "the job's pass counter dropped", lambda: shared_operator.passes((namespace, "llm")) == 0
    )
    job_driver.wait_for(
        "garbage collection",
        lambda: (
            not job_driver.pods(namespace, "llm")
            and job_driver.get_core(namespace, "services", "llm") is None
        ),
        timeout=60,
    )


def test_suspend_removes_pods_and_resume_runs_again(shared_operator, job_driver, namespace):
    job_driver.create(namespace, "llm", spec())
    job_driver.wait_running_pods(namespace, "llm", 3)
    started = job_driver.wait_phase(namespace, "llm", "Running")["startTime"]
    job_driver.patch(namespace, "llm", {"spec": {"suspend": True}})
    suspended = job_driver.wait_phase(namespace, "llm", "Suspended")
    job_driver.wait_for("no pods while suspended", lambda: not job_driver.pods(namespace, "llm"))
    assert suspended["startTime"] == started
    # Another pass of the suspended job (a label change triggers one) creates nothing.
    passes = shared_operator.passes((namespace, "llm"))
    job_driver.patch(namespace, "llm", {"metadata": {"labels": {"poke": "1"}}})
    shared_operator.wait_idle_after(passes, (namespace, "llm"))
    assert not job_driver.pods(namespace, "llm"), "nothing may be created while suspended"
    job_driver.patch(namespace, "llm", {"spec": {"suspend": False}})
    job_driver.wait_running_pods(namespace, "llm", 3)
    resumed = job_driver.wait_phase(namespace, "llm", "Running")
    assert find(resumed.get("conditions"), "Suspended")["status"] == "False"


def test_active_deadline_fails_the_job(shared_operator, job_driver, namespace):
    deadline = 3
    submitted = time.monotonic()
    job_driver.create(
        namespace, "llm", spec(workers=1, runPolicy={"activeDeadlineSeconds": deadline})
    )
    failed = job_driver.wait_phase(namespace, "llm", "Failed", timeout=deadline + 20)
    # Counted from the job's start, which cannot come before its submission: at
    # the deadline (by the wait above, not long after), never before it but for
    # the second that status.startTime's whole seconds drop, as a Job's do.
    assert time.monotonic() - submitted >= deadline - 1
    assert find(failed.get("conditions"), "Failed")["reason"] == "DeadlineExceeded"
    job_driver.wait_for("running pods cleaned", lambda: not job_driver.live_pods(namespace, "llm"))


def test_pod_deleted_by_hand_restarts_the_gang(shared_operator, job_driver, namespace):
    job_driver.create(namespace, "llm", spec())
    job_driver.wait_running_pods(namespace, "llm", 3)
    job_driver.wait_phase(namespace, "llm", "Running")
    job_driver.delete_pod(namespace, "llm-master-0")
    job_driver.wait_running_pods(namespace, "llm", 3, restart=1)
    status = job_driver.wait_phase(namespace, "llm", "Running")
    assert status["restartCount"] == 1
    assert len(job_driver.live_pods(namespace, "llm")) == 3


def test_deleting_the_job_garbage_collects_its_children(shared_operator, job_driver, namespace):
    job_driver.create(namespace, "llm", spec())
    job_driver.wait_running_pods(namespace, "llm", 3)
    job_driver.delete(namespace, "llm")
    job_driver.wait_for(
        "pods and service collected",
        lambda: (
            not job_driver.pods(namespace, "llm")
            and job_driver.get_core(namespace, "services", "llm") is None
        ),
        timeout=60,
    )
