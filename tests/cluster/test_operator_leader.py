"""Two operator replicas, one leader (a real coordination.k8s.io Lease).

Each test starts its own pair, watching only its namespace and electing on a
Lease there, with short timings (lease 4 s, renew deadline 3 s, retry 0.5 s)
so that a take-over takes seconds.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.fixtures.operator import kwok_job_spec as spec

pytestmark = pytest.mark.cluster

LEASE_SECONDS = 4


def _pair(operator_factory, namespace, **env):
    settings = {
        "TORCHFLEET_OPERATOR_LEADER_ELECT": "true",
        "POD_NAMESPACE": namespace,
        "TORCHFLEET_OPERATOR_LEASE_DURATION_SECONDS": str(LEASE_SECONDS),
        "TORCHFLEET_OPERATOR_LEASE_RENEW_DEADLINE_SECONDS": "3",
        "TORCHFLEET_OPERATOR_LEASE_RETRY_PERIOD_SECONDS": "0.5",
        **env,
    }
    return [operator_factory(env=settings, namespaces=[namespace]) for _ in range(2)]


def _leader(job_driver, replicas, timeout=30):
    def found():
        leading = [r for r in replicas if r.metric("torchfleet_operator_leader") == 1]
        return leading if leading else None

    leading = job_driver.wait_for("a leader", found, timeout=timeout)
    assert len(leading) == 1, "two replicas lead at once"
    return leading[0], next(r for r in replicas if r is not leading[0])


def _writes(replica) -> float:
    return sum(
        replica.metric("torchfleet_operator_api_requests_total", verb=verb)
        for verb in ("POST", "PUT", "PATCH", "DELETE")
    )


def test_only_the_leader_writes_and_no_pod_is_made_twice(
    operator_factory, job_driver, cluster, namespace
):
    replicas = _pair(operator_factory, namespace)
    leader, standby = _leader(job_driver, replicas)
    for number in range(20):
        job_driver.create(namespace, f"job-{number}", spec(workers=1))
    for number in range(20):
        job_driver.wait_running_pods(namespace, f"job-{number}", 2, timeout=120)
    assert len(job_driver.pods(namespace)) == 40  # no duplicates, none extra
    assert leader.metric("torchfleet_operator_pods_created_total") == 40
    # The standby reconciled nothing: not one create, delete or status write.
    assert _writes(leader) > 40 and _writes(standby) == 0
    assert standby.metric("torchfleet_operator_leader") == 0
    lease = json.loads(
        cluster.kubectl("get", "lease", "torchfleet-operator", "-n", namespace, "-o", "json").stdout
    )
    assert lease["spec"]["holderIdentity"] and lease["spec"]["leaseDurationSeconds"] == 4


def test_the_standby_takes_over_a_gang_the_leader_died_creating(
    operator_factory, job_driver, namespace
):
    # One API call at a time, so the kill lands in the middle of the gang.
    replicas = _pair(operator_factory, namespace, TORCHFLEET_OPERATOR_API_CONCURRENCY="1")
    leader, standby = _leader(job_driver, replicas)
    job_driver.create(namespace, "big", spec(workers=64))
    job_driver.wait_for(
        "the first pods", lambda: len(job_driver.pods(namespace, "big")) >= 5, interval=0.02
    )
    leader.kill()
    killed = time.monotonic()
    assert len(job_driver.pods(namespace, "big")) < 65, "the kill must interrupt the creation"
    job_driver.wait_for(
        "the standby to lead",
        lambda: standby.metric("torchfleet_operator_leader") == 1,
        timeout=LEASE_SECONDS + 5,
        interval=0.1,
    )
    took_over = time.monotonic() - killed
    assert took_over <= LEASE_SECONDS + 5
    pods = job_driver.wait_running_pods(namespace, "big", 65, timeout=120)
    assert len(job_driver.pods(namespace, "big")) == 65  # exactly the gang: none twice
    assert {p["metadata"]["name"] for p in pods} == {
        "big-master-0",
        *(f"big-worker-{i}" for i in range(64)),
    }
    assert job_driver.wait_phase(namespace, "big", "Running", timeout=60)["restartCount"] == 0


def test_a_leader_that_stops_cleanly_hands_over_at_once(operator_factory, job_driver, namespace):
    replicas = _pair(operator_factory, namespace)
    leader, standby = _leader(job_driver, replicas)
    leader.stop()  # SIGTERM: releases the lease
    stopped = time.monotonic()
    job_driver.wait_for(
        "the standby to lead",
        lambda: standby.metric("torchfleet_operator_leader") == 1,
        timeout=LEASE_SECONDS,
        interval=0.1,
    )
    # Well before the lease would have expired on its own.
    assert time.monotonic() - stopped < LEASE_SECONDS
    job_driver.create(namespace, "after", spec(workers=1))
    job_driver.wait_running_pods(namespace, "after", 2)
