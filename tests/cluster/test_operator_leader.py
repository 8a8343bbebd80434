"""Two operator replicas, one leader (a real coordination.k8s.io Lease).

Each test starts its own pair, watching only its namespace and electing, as
the chart runs it, on the chart's Lease in the chart's namespace (the
identity's: tests/fixtures/chart_identity.py; the pairs of one session take
turns), with short timings (lease 4 s, renew deadline 3 s, retry 0.5 s) so
that a take-over takes seconds.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from datetime import datetime

import pytest

from tests.fixtures.chart_identity import LEASE
from tests.fixtures.chart_identity import NAMESPACE as CHART_NAMESPACE
from tests.fixtures.cluster import audit_events, audit_log, token_kubeconfig
from tests.fixtures.operator import kwok_job_spec as spec

pytestmark = pytest.mark.cluster

LEASE_SECONDS = 4


def _pair(operator_factory, namespace, kubeconfigs=(None, None), **env):
    settings = {
        "TORCHFLEET_OPERATOR_LEADER_ELECT": "true",
        "POD_NAMESPACE": CHART_NAMESPACE,
        "TORCHFLEET_OPERATOR_LEASE_NAME": LEASE,
        "TORCHFLEET_OPERATOR_LEASE_DURATION_SECONDS": str(LEASE_SECONDS),
        "TORCHFLEET_OPERATOR_LEASE_RENEW_DEADLINE_SECONDS": "3",
        "TORCHFLEET_OPERATOR_LEASE_RETRY_PERIOD_SECONDS": "0.5",
        **env,
    }
    return [
        operator_factory(kubeconfig=kubeconfig, env=settings, namespaces=[namespace])
        for kubeconfig in kubeconfigs
    ]


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
        cluster.kubectl("get", "lease", LEASE, "-n", CHART_NAMESPACE, "-o", "json").stdout
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


def test_a_leader_that_stops_cleanly_hands_over_at_once(
    operator_factory, job_driver, cluster, namespace
):
    replicas = _pair(operator_factory, namespace)
    leader, standby = _leader(job_driver, replicas)
    # Metadata of the Lease's owner (the chart's labels, Helm's annotations)
    # outlives every renewal, release and take-over.
    label = f"torchfleet.dev/kept-{namespace[-6:]}"
    cluster.kubectl("label", "lease", LEASE, "-n", CHART_NAMESPACE, f"{label}=yes")
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
    lease = json.loads(
        cluster.kubectl("get", "lease", LEASE, "-n", CHART_NAMESPACE, "-o", "json").stdout
    )
    assert lease["spec"]["holderIdentity"] and lease["metadata"]["labels"][label] == "yes"
    cluster.kubectl("label", "lease", LEASE, "-n", CHART_NAMESPACE, f"{label}-")
    job_driver.create(namespace, "after", spec(workers=1))
    job_driver.wait_running_pods(namespace, "after", 2)


WRITES = {"create", "update", "patch", "delete", "deletecollection"}


@pytest.fixture
def identities(cluster, namespace, tmp_path):
    """A kubeconfig per replica, each its own ServiceAccount (cluster-admin: what
    is judged here is who writes, not what it may), so that the API server's
    audit log tells the two apart; and, by kubeconfig, the user it records."""
    log = audit_log(cluster)
    if log is None:
        pytest.skip("another cluster's API server audit log is not ours to read")
    if not log.exists():
        pytest.fail(
            f"the local cluster keeps no audit log at {log}: it was started by an older "
            "checkout; `make cluster-down` and run again",
            pytrace=False,
        )
    accounts = ("replica-a", "replica-b")
    users = {}
    for account in accounts:
        cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
        cluster.kubectl(
            "create",
            "clusterrolebinding",
            f"{namespace}-{account}",
            "--clusterrole=cluster-admin",
            f"--serviceaccount={namespace}:{account}",
        )
        kubeconfig = token_kubeconfig(cluster, namespace, account, tmp_path / account)
        users[kubeconfig] = f"system:serviceaccount:{namespace}:{account}"
    try:
        yield users
    finally:
        for account in accounts:
            cluster.kubectl("delete", "clusterrolebinding", f"{namespace}-{account}", check=False)


def audited_writes(cluster, user: str) -> list[dict]:
    """The writes the API server logged for ``user`` (Leases are not logged)."""
    return [e for e in audit_events(cluster, user) if e["verb"] in WRITES]


def _when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def test_the_api_server_logs_no_write_by_the_standby(
    operator_factory, job_driver, cluster, namespace, identities
):
    """The same promise as above, counted by the API server (the standby's own
    request counter misses its Lease client and pod informer)."""
    replicas = _pair(operator_factory, namespace, tuple(identities))
    leader, standby = _leader(job_driver, replicas)
    for number in range(5):
        job_driver.create(namespace, f"job-{number}", spec(workers=1))
    for number in range(5):
        job_driver.wait_running_pods(namespace, f"job-{number}", 2)
        job_driver.wait_phase(namespace, f"job-{number}", "Running")
    assert len(audited_writes(cluster, identities[leader.kubeconfig])) >= 10
    assert audited_writes(cluster, identities[standby.kubeconfig]) == []


def test_a_leader_stopped_past_its_lease_never_writes_again(
    operator_factory, job_driver, cluster, namespace, identities
):
    """Split brain, judged by the API server's audit log: a leader frozen past
    its lease (SIGSTOP), then thawed, writes nothing after its successor took
    the lease, though its watches hand it work on waking."""
    leader, standby = _leader(job_driver, _pair(operator_factory, namespace, tuple(identities)))
    job_driver.create(namespace, "before", spec(workers=1))
    job_driver.wait_running_pods(namespace, "before", 2)
    job_driver.wait_phase(namespace, "before", "Running")

    leader.process.send_signal(signal.SIGSTOP)
    job_driver.wait_for(
        "the standby to take the lease",
        lambda: standby.metric("torchfleet_operator_leader") == 1,
        timeout=LEASE_SECONDS + 10,
        interval=0.1,
    )
    lease = json.loads(
        cluster.kubectl("get", "lease", LEASE, "-n", CHART_NAMESPACE, "-o", "json").stdout
    )
    taken = _when(lease["spec"]["acquireTime"])
    # Work that the frozen leader's watches deliver when it thaws.
    job_driver.create(namespace, "during", spec(workers=1))
    job_driver.fail_pod(namespace, "before-worker-0", exit_code=1)
    job_driver.wait_running_pods(namespace, "during", 2)
    job_driver.wait_running_pods(namespace, "before", 2, restart=1)
    leader.process.send_signal(signal.SIGCONT)
    # It finds the lease lost and exits, as its docstring promises (judged
    # after the log, which says more when it does not).
    with contextlib.suppress(AssertionError):
        job_driver.wait_for(
            "the thawed leader to exit", lambda: leader.process.poll() is not None, timeout=30
        )
    job_driver.create(namespace, "after", spec(workers=1))
    job_driver.wait_running_pods(namespace, "after", 2)

    old = audited_writes(cluster, identities[leader.kubeconfig])
    new = audited_writes(cluster, identities[standby.kubeconfig])
    # The log saw each replica write while it led, so it could see a stray one.
    assert any(e["objectRef"].get("resource") == "pods" for e in old)
    assert any(e["objectRef"].get("name") == "during-master-0" for e in new)
    stray = [
        (e["verb"], e["objectRef"], e["requestReceivedTimestamp"])
        for e in old
        if _when(e["requestReceivedTimestamp"]) > taken
    ]
    assert not stray, f"the old leader wrote after {taken.isoformat()}: {stray}"
    assert leader.process.poll() is not None, "the thawed leader went on running"
