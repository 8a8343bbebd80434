"""The job-phase series follow each job's latest phase and vanish with it."""

from __future__ import annotations

from prometheus_client import REGISTRY

from torchfleet_operator.metrics import PhaseTracker


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
