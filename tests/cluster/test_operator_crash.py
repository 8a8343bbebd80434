"""Operators started per test (no shared one): a crash mid-creation, and back-off.

These tests need to be the only operator acting on their jobs, so the module
starts its own processes and uses no module-wide operator.
"""

from __future__ import annotations

import time

import pytest

from tests.fixtures.operator import kwok_job_spec as spec

pytestmark = pytest.mark.cluster


def test_operator_killed_while_creating_64_workers_recovers_exactly(
    operator_factory, job_driver, namespace
):
    # One API call at a time, so the kill lands in the middle of the gang.
    slow = operator_factory(env={"TORCHFLEET_OPERATOR_API_CONCURRENCY": "1"})
    job_driver.create(namespace, "big", spec(workers=64))
    job_driver.wait_for(
        "the first pods", lambda: len(job_driver.pods(namespace, "big")) >= 5, interval=0.02
    )
    slow.kill()
    before = {
        p["metadata"]["name"]: p["metadata"]["uid"] for p in job_driver.pods(namespace, "big")
    }
    assert 5 <= len(before) < 65, "the kill must interrupt the creation"

    operator_factory()
    pods = job_driver.wait_running_pods(namespace, "big", 65, timeout=120)
    assert job_driver.wait_phase(namespace, "big", "Running", timeout=60)["restartCount"] == 0
    expected = {"big-master-0", *(f"big-worker-{i}" for i in range(64))}
    assert {p["metadata"]["name"] for p in pods} == expected
    assert len(job_driver.pods(namespace, "big")) == 65  # no duplicates, none extra
    # Pods made before the crash were kept, not recreated.
    survivors = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
    assert all(survivors[name] == uid for name, uid in before.items())


def test_pod_the_apiserver_refuses_shows_its_message_and_backs_off(
    operator_factory, job_driver, namespace
):
    # An operator of its own, for this namespace only: its error count is this job's.
    operator = operator_factory(namespaces=[namespace])
    bad = {
        "spec": {
            "nodeSelector": {"torchfleet.dev/fake-node": "true"},
            "containers": [{"name": "trainer", "imagePullPolicy": "Sometimes"}],
        }
    }
    job_driver.create(namespace, "llm", spec(workers=1, master={"template": bad}))
    rejected = job_driver.wait_for(
        "the ChildrenRejected condition",
        lambda: next(
            (
                c
                for c in job_driver.status(namespace, "llm").get("conditions", [])
                if c["type"] == "ChildrenRejected" and c["status"] == "True"
            ),
            None,
        ),
    )
    assert "imagePullPolicy" in rejected["message"]
    assert "llm-master-0" in rejected["message"]
    assert job_driver.live_pods(namespace, "llm")[0]["metadata"]["name"] == "llm-worker-0"
    errors = operator.metric("torchfleet_operator_api_errors_total", resource="Pod")
    time.sleep(3)
    later = operator.metric("torchfleet_operator_api_errors_total", resource="Pod")
    # Back-off (0.5s doubling in tests) despite the worker's and the job's own
    # events: a handful of retries in 3 seconds, not a hot loop.
    assert errors >= 1 and later - errors <= 4
