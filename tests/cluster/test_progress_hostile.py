"""A master pod's /metrics that lies, floods or stalls costs its job nothing but progress.

The pods run on KWOK nodes whose pod CIDR is a loopback /24 of their own, so a
master's pod IP is an address on this machine: the test binds a /metrics
server there (on a port of its own, given to the operator as its progress
port), and a real operator scrapes it
as it would a trainer. One job's server answers hostile things in turn while
its status (restartCount, phase, completionTime) must keep persisting; another
job's honest server must keep having its step read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tests.fixtures.operator import kwok_job_spec as spec
from tests.fixtures.scripted_metrics import ScriptedMetrics, on_node
from torchfleet_contract import pod as contract
from torchfleet_operator.config import OperatorConfig
from torchfleet_operator.controller import Controller
from torchfleet_operator.kube import Executor
from torchfleet_operator.planning import Plan

pytestmark = pytest.mark.cluster

STEP = contract.METRIC_STEP
HOSTILE_BODIES = {
    "garbage": b"\x00\xff{{{ not prometheus at all\n",
    "nan": f"{STEP} NaN\n".encode(),
    "negative": f"{STEP} -5\n{contract.METRIC_TOTAL_STEPS} 10\n".encode(),
    "1e30": f"{STEP} 1e30\n".encode(),
    "count-no-sum": (
        f"{STEP} 7\n{contract.METRIC_TOTAL_STEPS} 10\n{contract.METRIC_STEP_SECONDS}_count 3\n"
    ).encode(),
}
SCRAPE_ERRORS = "torchfleet_operator_progress_scrape_errors_total"


def _api_errors_422() -> float:
    """Status patches refused 422, as counted by the operator code in this process."""
    labels = {"verb": "patch", "resource": "TrainingJob/status", "code": "422"}
    return REGISTRY.get_sample_value("torchfleet_operator_api_errors_total", labels) or 0.0


class MetricsServer(ScriptedMetrics):
    """/metrics at one master pod's IP, answering what the test says (``answer``)."""

    def __init__(self, ip: str, port: int) -> None:
        self.answer = "good"
        self.step = 1
        super().__init__(ip, port)

    def respond(self, handler: BaseHTTPRequestHandler) -> None:
        answer = self.answer
        self.served[answer] += 1
        self.respond_with(handler, answer)

    def respond_with(self, handler: BaseHTTPRequestHandler, answer: str) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain")
        if answer == "huge":  # 50 MB with no Content-Length
            handler.end_headers()
            chunk = b"# " + b"x" * (1 << 20) + b"\n"
            for _ in range(50):
                handler.wfile.write(chunk)
            return
        if answer == "slow-loris":  # a byte now and then, never done
            handler.end_headers()
            while not self.closing.wait(0.1):
                handler.wfile.write(b"#")
                handler.wfile.flush()
            return
        body = f"{STEP} {self.step}\n".encode() if answer == "good" else HOSTILE_BODIES[answer]
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)


@pytest.fixture
def servers(scrape_port: int) -> Iterator[Callable[[str], MetricsServer]]:
    """The server at a pod IP (KWOK may give a restarted master its old IP back)."""
    by_ip: dict[str, MetricsServer] = {}

    def at(ip: str) -> MetricsServer:
        if ip not in by_ip:
            by_ip[ip] = MetricsServer(ip, scrape_port)
        return by_ip[ip]

    yield at
    for server in by_ip.values():
        server.close()


def test_hostile_metrics_lose_nothing_and_never_stop_the_poller(
    operator_factory, job_driver, namespace, loopback_node, servers, scrape_port
):
    operator = operator_factory(
        namespaces=[namespace],
        env={
            "TORCHFLEET_OPERATOR_PROGRESS_INTERVAL_SECONDS": "0.5",
            "TORCHFLEET_OPERATOR_PROGRESS_PORT": str(scrape_port),
        },
    )

    def master_ip(job: str, restart: int = 0) -> str:
        (master,) = job_driver.wait_running_pods(namespace, job, 1, restart=restart)
        ip = master["status"]["podIP"]
        assert ip.startswith("127."), ip  # the loopback pod CIDR took
        return str(ip)

    def progress(job: str) -> dict[str, Any]:
        return dict(job_driver.status(namespace, job).get("progress") or {})

    job_driver.create(namespace, "honest", spec(workers=0, template=on_node(loopback_node())))
    job_driver.create(
        namespace,
        "hostile",
        spec(workers=0, template=on_node(loopback_node()), runPolicy={"backoffLimit": 3}),
    )
    honest_ip, hostile_ip = master_ip("honest"), master_ip("hostile")
    assert honest_ip != hostile_ip
    honest, hostile = servers(honest_ip), servers(hostile_ip)
    hostile.answer = "garbage"
    job_driver.wait_phase(namespace, "hostile", "Running")

    def honest_step_still_read() -> None:
        honest.step += 1
        job_driver.wait_for(
            f"the honest job's step {honest.step} in its status",
            lambda: progress("honest").get("step") == honest.step,
            timeout=30,
        )

    def serve(answer: str, error_reason: str | None = None) -> None:
        """Serves ``answer`` until the operator has scraped it (and, for an answer
        that must fail, counted the failure), then checks the honest job."""
        before = operator.metric(SCRAPE_ERRORS, reason=error_reason) if error_reason else 0
        served = hostile.served[answer]
        hostile.answer = answer
        job_driver.wait_for(
            f"the operator to scrape {answer!r}",
            lambda: (
                hostile.served[answer] >= served + 2
                and (
                    not error_reason or operator.metric(SCRAPE_ERRORS, reason=error_reason) > before
                )
            ),
            timeout=30,
        )
        assert operator.healthy(), operator.logs()
        honest_step_still_read()

    serve("garbage", "unparseable")
    serve("nan")
    serve("negative")
    serve("1e30")
    serve("huge", "too_large")
    serve("slow-loris", "timeout")
    # Not one of those became progress.
    assert progress("hostile") == {}

    # A _count without its _sum: progress, without an ETA (and no dead poller).
    serve("count-no-sum")
    shown = job_driver.wait_for(
        "the hostile job's step 7", lambda: (p := progress("hostile")).get("step") == 7 and p
    )
    assert shown["totalSteps"] == 10 and "etaSeconds" not in shown

    # A gang restart while the master says 1e30: restartCount persists.
    hostile.answer = "1e30"
    job_driver.fail_pod(namespace, "hostile-master-0", exit_code=137)
    restarted = job_driver.wait_for(
        "restartCount 1 persisted",
        lambda: (s := job_driver.status(namespace, "hostile")).get("restartCount") == 1 and s,
    )
    assert restarted["restartCount"] == 1
    # The new master answers with a slow-loris; the job still completes.
    servers(master_ip("hostile", restart=1)).answer = "slow-loris"
    honest_step_still_read()
    job_driver.succeed_pod(namespace, "hostile-master-0")
    done = job_driver.wait_phase(namespace, "hostile", "Succeeded")
    assert done["completionTime"] and done["restartCount"] == 1
    honest_step_still_read()

    # Nothing had to be rescued: the poller task itself never died.
    assert operator.metric("torchfleet_operator_task_restarts_total", task="progress") == 0
    assert "Traceback" not in operator.logs(last=2000), operator.logs()


def test_a_status_the_schema_refuses_is_written_again_without_its_progress(
    cluster, operator_crd, job_driver, namespace
):
    """Should a figure out of the schema ever reach a status write (the clamp is
    the first line), the real API server's 422 costs only the progress update."""
    job = job_driver.create(namespace, "llm", spec(workers=0))
    key, uid = (namespace, "llm"), job["metadata"]["uid"]
    controller = Controller(OperatorConfig(), Executor(cluster.api_client(), 1), "image:1")
    running = {"phase": "Running", "restartCount": 2, "progress": {"step": 3}}
    finished = {
        "phase": "Succeeded",
        "restartCount": 2,
        "completionTime": "2026-01-01T00:00:00Z",
        "progress": {"step": -1},  # what the schema refuses
    }
    try:
        assert controller._write_status(key, uid, {}, running, Plan())
        refused_before = _api_errors_422()
        assert controller._write_status(key, uid, running, finished, Plan())
    finally:
        controller.executor.close()
    assert _api_errors_422() == refused_before + 1  # the API server did refuse the first try
    stored = job_driver.status(namespace, "llm")
    assert (stored["phase"], stored["restartCount"], stored["completionTime"]) == (
        "Succeeded",
        2,
        "2026-01-01T00:00:00Z",
    )
    assert stored["progress"] == {"step": 3}  # the last good progress stays
