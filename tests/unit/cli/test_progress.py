"""A job's status, as the operator writes it (statuses/*.yaml), rendered into
the line beside ``torchfleet run``'s bar and the lines printed above it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from torchfleet_cli.progress import changes, failure_reason, progress_line
from torchfleet_operator.api import TrainingJobStatus
from torchfleet_operator.api.parse import read_status
from torchfleet_operator.status.progress import progress_from_metrics
from torchfleet_trainer.metrics import TrainMetrics

STATUSES = Path(__file__).parent / "statuses"


def status(name: str) -> TrainingJobStatus:
    return read_status(yaml.safe_load((STATUSES / f"{name}.yaml").read_text()))


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("pending", "Pending · restarts 0"),
        (
            "running",
            "Running · step 420/1000 · loss 1.93 · 51.2k tok/s · ETA 4m05s · restarts 1",
        ),
        ("restarting", "Restarting · step 400/1000 · loss 1.95 · restarts 2"),
        # A finished job has no time left, whatever the last scrape estimated.
        ("failed", "Failed · step 400/1000 · restarts 2"),
    ],
)
def test_the_progress_line_shows_what_the_status_holds(name: str, line: str) -> None:
    assert progress_line(status(name)) == line


def test_the_line_from_progress_the_operator_parsed_from_the_trainers_metrics() -> None:
    trainer = TrainMetrics()
    trainer.step.set(7)
    trainer.total_steps.set(10)
    trainer.loss.set(2.5)
    trainer.tokens_per_second.set(900)
    trainer.step_seconds.observe(2.0)
    progress, _ = progress_from_metrics(
        generate_latest(trainer.registry).decode(), "2026-11-20T23:10:00Z"
    )
    shown = read_status({"phase": "Running", "progress": progress})
    assert (
        progress_line(shown) == "Running · step 7/10 · loss 2.5 · 900 tok/s · ETA 6s · restarts 0"
    )


def test_the_first_look_prints_the_phase() -> None:
    assert changes(None, status("pending")) == ["Pending"]


def test_a_restart_prints_its_reason_and_the_phase_change() -> None:
    assert changes(status("running"), status("restarting")) == [
        "PodFailed: restart 2 (2 of backoffLimit 2): pod train-master-0 PodFailed with exit code 1",
        "Running -> Restarting",
    ]


def test_a_restart_seen_only_once_the_next_gang_runs_prints_its_number() -> None:
    # Between two looks the gang failed and came back: Restarting is False again.
    assert changes(
        status("pending").model_copy(update={"phase": "Running"}), status("running")
    ) == ["restart 1"]


def test_no_change_prints_nothing() -> None:
    assert changes(status("running"), status("running")) == []


def test_a_failure_prints_its_reason() -> None:
    reason = (
        "BackoffLimitExceeded: pod train-master-0 PodFailed with exit code 1; "
        "backoffLimit 2 reached after 2 counted restarts (0 disruptions not counted)"
    )
    assert failure_reason(status("failed")) == reason
    assert changes(status("restarting"), status("failed")) == [f"Restarting -> Failed: {reason}"]
