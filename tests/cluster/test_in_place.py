"""In-place restarts judged by a real operator from a scripted master's /metrics.

A gang of 3 on KWOK loopback nodes with the default in-place budget (2) and
backoffLimit 3; the test serves what torchfleet-train's rank 0 exports (the
gang's in-place count and the last one's reason beside its progress) and reads
the job's status, events and pods:

1. Each in-place restart the master reports is counted once: status, the
   InPlaceRestart event, toward backoffLimit,
   ``torchfleet_operator_in_place_restarts_total{reason}``, with the pods
   untouched; ``kubectl get tj``'s Restarts shows ``status.restarts`` (1), not
   ``restartCount`` (0).
2. The operator restarted in between reads the same figure and counts nothing
   again (the count lives in status, not in the operator; nor in its metric).
3. With the launchers' budget spent, the next failure is a pod's container
   exiting: a gang restart, counted toward backoffLimit as well (Restarts 3,
   restartCount 1); the new gang's launchers count from 0.
4. One more in-place restart passes backoffLimit: the job fails.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.test_node_health import exported
from tests.fixtures.scripted_metrics import scraped_again, scraping_env
from torchfleet_contract import pod as k
from torchfleet_operator.desired.names import pod_name_for_rank
from torchfleet_operator.status.conditions import find

pytestmark = pytest.mark.cluster

JOB = "in-place"
BACKOFF_LIMIT = 3


def reporting(step: int, restarts: int, reason: str | None = None) -> str:
    """Rank 0's /metrics at ``step`` after ``restarts`` in-place restarts of this gang."""
    lines = [f"{k.METRIC_IN_PLACE_RESTARTS} {restarts}"]
    lines += [
        f'{k.METRIC_IN_PLACE_RESTART_REASON}{{{k.LABEL_REASON}="{each}"}} {int(each == reason)}'
        for each in k.RESTART_REASONS
    ]
    return exported(step) + "\n".join(lines) + "\n"


def in_place(status: dict[str, Any]) -> dict[str, Any]:
    return dict(status.get("inPlaceRestarts") or {})


def counted(operator: Any, reason: str) -> float:
    """What the operator's ``torchfleet_operator_in_place_restarts_total`` counted
    for ``reason`` (the counter goes up once the status write that records the
    restart landed)."""
    return operator.metric("torchfleet_operator_in_place_restarts_total", reason=reason)


def restarts_column(cluster: Any, namespace: str) -> str:
    """The Restarts column of ``kubectl get tj``."""
    table = cluster.kubectl("get", "tj", JOB, "-n", namespace).stdout.splitlines()
    return table[1].split()[table[0].split().index("RESTARTS")]


def test_in_place_restarts_count_once_survive_an_operator_restart_and_fall_back_to_the_gang(
    job_driver, namespace, scripted_gang, scraping_operator, operator_factory, scrape_port, cluster
):
    server, _ = scripted_gang(JOB, trainer=True, backoffLimit=BACKOFF_LIMIT)
    uids = pod_uids(job_driver, namespace)
    server.body = reporting(10, 0)
    job_driver.wait_for(
        "step 10 shown",
        lambda: (job_driver.status(namespace, JOB).get("progress") or {}).get("step") == 10,
    )
    assert not in_place(job_driver.status(namespace, JOB))

    # 1. The first in-place restart, as its launchers report it.
    server.body = reporting(12, 1, k.RESTART_REASON_WORKER_KILLED)
    status = job_driver.wait_for(
        "the in-place restart counted",
        lambda: in_place(s := job_driver.status(namespace, JOB)).get("total") == 1 and s,
    )
    assert in_place(status) | {"lastTime": None} == {
        "total": 1,
        "inGang": 1,
        "gang": 0,
        "lastReason": k.RESTART_REASON_WORKER_KILLED,
        "lastTime": None,
    }
    assert status["countedRestarts"] == 1 and status["restartCount"] == 0
    assert status["restarts"] == 1  # kubectl get tj's Restarts: gang plus in-place
    assert restarts_column(cluster, namespace) == "1"  # status.restarts, not restartCount 0
    job_driver.wait_for(
        "the restart in torchfleet_operator_in_place_restarts_total",
        lambda: counted(scraping_operator, k.RESTART_REASON_WORKER_KILLED) == 1,
    )
    events = job_driver.wait_events(namespace, JOB, {"InPlaceRestart"}, type="Warning")
    message = next(e["message"] for e in events if e["reason"] == "InPlaceRestart")
    assert "1 of runPolicy.inPlaceRestarts 2 in gang 0" in message, message
    assert f"1 counted restarts of backoffLimit {BACKOFF_LIMIT}" in message, message
    assert pod_uids(job_driver, namespace) == uids  # no pod touched
    # Counted once, though every scrape since has said 1 again.
    assert counted(scraping_operator, k.RESTART_REASON_WORKER_KILLED) == 1

    # 2. A new operator reads the same figure: nothing is counted twice.
    scraping_operator.stop()
    operator = operator_factory(namespaces=[namespace], env=scraping_env(scrape_port))
    job_driver.wait_for("three scrapes by the new operator", scraped_again(server))
    server.body = reporting(14, 1, k.RESTART_REASON_WORKER_KILLED)
    job_driver.wait_for(
        "step 14 shown by the new operator",
        lambda: (job_driver.status(namespace, JOB).get("progress") or {}).get("step") == 14,
    )
    status = job_driver.status(namespace, JOB)
    assert in_place(status)["total"] == 1 and status["countedRestarts"] == 1, status
    restarts = [e for e in job_driver.events(namespace, JOB) if e["reason"] == "InPlaceRestart"]
    assert sum(e.get("count", 1) for e in restarts) == 1, restarts

    # 3. The second uses up the launchers' budget; the next failure ends a
    # container, and the operator restarts the gang.
    server.body = reporting(16, 2, k.RESTART_REASON_WORKER_FAILED)
    job_driver.wait_for(
        "the second in-place restart counted",
        lambda: in_place(job_driver.status(namespace, JOB)).get("total") == 2,
    )
    job_driver.wait_for(
        "the second in the new operator's metric",
        lambda: counted(operator, k.RESTART_REASON_WORKER_FAILED) == 1,
    )
    # The first, shown again to it, is not its to count (written before step 16's).
    assert counted(operator, k.RESTART_REASON_WORKER_KILLED) == 0
    job_driver.fail_pod(namespace, pod_name_for_rank(JOB, 1), exit_code=1)
    status = job_driver.wait_for(
        "the gang restart",
        lambda: (s := job_driver.status(namespace, JOB)).get("restartCount") == 1 and s,
    )
    assert status["countedRestarts"] == 3 and status["restarts"] == 3, status
    assert restarts_column(cluster, namespace) == "3"  # restartCount is 1
    assert status["phase"] != "Failed", status

    # 4. The new gang's launchers count from 0; their first passes backoffLimit.
    server, _ = scripted_gang(JOB, restart=1)
    server.body = reporting(18, 0)
    job_driver.wait_for(
        "the new gang's step shown",
        lambda: (job_driver.status(namespace, JOB).get("progress") or {}).get("step") == 18,
    )
    assert in_place(job_driver.status(namespace, JOB)) | {"lastTime": None} == {
        "total": 2,
        "inGang": 0,
        "gang": 1,
        "lastReason": k.RESTART_REASON_WORKER_FAILED,
        "lastTime": None,
    }
    server.body = reporting(20, 1, k.RESTART_REASON_PEER_LOST)
    status = job_driver.wait_for(
        "the job failed",
        lambda: (s := job_driver.status(namespace, JOB)).get("phase") == "Failed" and s,
    )
    failed = find(status["conditions"], "Failed")
    assert failed["reason"] == "BackoffLimitExceeded", failed
    assert "4 counted restarts of backoffLimit 3" in failed["message"], failed
    assert in_place(status)["total"] == 3 and status["countedRestarts"] == 4, status
    job_driver.wait_for(
        "the third in the metric",
        lambda: counted(operator, k.RESTART_REASON_PEER_LOST) == 1,
    )
    assert counted(operator, k.RESTART_REASON_WORKER_FAILED) == 1


def pod_uids(job_driver: Any, namespace: str) -> dict[str, str]:
    return {
        pod_name_for_rank(JOB, rank): job_driver.get_core(
            namespace, "pods", pod_name_for_rank(JOB, rank)
        )["metadata"]["uid"]
        for rank in range(3)
    }
