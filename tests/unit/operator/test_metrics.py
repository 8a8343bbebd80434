"""The job-phase series follow each job's latest phase and vanish with it."""

from __future__ import annotations

from prometheus_client import REGISTRY

from torchfleet_operator.metrics import (
    TIME_COMPONENTS,
    GoodputTracker,
    HealthTracker,
    PhaseTracker,
)


def job_phase(namespace: str, job: str, phase: str) -> float | None:
    labels = {"job_namespace": namespace, "job_name": job, "phase": phase}
    return REGISTRY.get_sample_value("torchfleet_operator_job_phase", labels)


def jobs_in(phase: str) -> float:
    return REGISTRY.get_sample_value("torchfleet_operator_jobs", {"phase": phase}) or 0.0


def test_phase_series_move_with_the_job_and_go_when_it_is_forgotten():
    tracker = PhaseTracker()
    key = ("ml-team", "metrics-test-job")
    running_before = jobs_in("Running")

    tracker.set(key, "Pending")
    tracker.set(key, "Running")
    assert job_phase(*key, "Running") == 1
    assert job_phase(*key, "Pending") is None  # only the current phase has a series
    assert jobs_in("Running") == running_before + 1

    tracker.set(key, "Succeeded")
    assert job_phase(*key, "Succeeded") == 1
    assert job_phase(*key, "Running") is None
    assert jobs_in("Running") == running_before

    tracker.forget(key)
    assert job_phase(*key, "Succeeded") is None


def job_time(namespace: str, job: str, component: str) -> float | None:
    labels = {"job_namespace": namespace, "job_name": job, "component": component}
    return REGISTRY.get_sample_value("torchfleet_operator_job_time_seconds", labels)


def test_goodput_series_follow_the_status_and_go_with_the_job():
    tracker = GoodputTracker()
    key = ("ml-team", "goodput-test-job")
    account = {
        "wallSeconds": 640,
        "queuedSeconds": 10,
        "suspendedSeconds": 0,
        "restartingSeconds": 30,
        "runningSeconds": 600,
        "productiveSeconds": 500,
        "recomputedSeconds": 100,
        "checkpointSeconds": 0,
    }
    tracker.set(key, {"phase": "Pending"})  # nothing accounted yet: no series
    assert job_time(*key, "wall") is None
    tracker.set(key, {"timeAccounting": account, "goodput": 0.7937})
    assert {c: job_time(*key, c) for c in TIME_COMPONENTS} == {
        c: account[field] for c, field in TIME_COMPONENTS.items()
    }
    labels = {"job_namespace": key[0], "job_name": key[1]}
    assert REGISTRY.get_sample_value("torchfleet_operator_job_goodput", labels) == 0.7937
    tracker.set(key, {"timeAccounting": account | {"wallSeconds": "x"}})  # junk is skipped
    assert job_time(*key, "wall") == 640
    assert REGISTRY.get_sample_value("torchfleet_operator_job_goodput", labels) is None
    tracker.forget(key)
    assert all(job_time(*key, c) is None for c in TIME_COMPONENTS)
    tracker.forget(key)  # twice is fine


def test_node_health_series_follow_the_gang_and_go_with_the_job():
    tracker = HealthTracker()
    key = ("ml-team", "health-test-job")

    def windows(node: str) -> float | None:
        labels = {"job_namespace": key[0], "job_name": key[1], "node": node}
        return REGISTRY.get_sample_value("torchfleet_operator_job_node_slow_windows", labels)

    avoided = {"job_namespace": key[0], "job_name": key[1]}
    nodes = [{"node": "a", "slowWindows": 2}, {"node": "b", "slowWindows": 0}]
    tracker.set(key, {"health": {"nodes": nodes, "avoidedNodes": ["x"]}})
    assert (windows("a"), windows("b")) == (2, 0)
    assert REGISTRY.get_sample_value("torchfleet_operator_job_avoided_nodes", avoided) == 1
    # The next gang runs on other nodes: the old node's series goes.
    tracker.set(key, {"health": {"nodes": [{"node": "c"}, {"junk": 1}], "avoidedNodes": []}})
    assert (windows("a"), windows("b"), windows("c")) == (None, None, 0)
    tracker.forget(key)
    assert windows("c") is None
    assert REGISTRY.get_sample_value("torchfleet_operator_job_avoided_nodes", avoided) is None
