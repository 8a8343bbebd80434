"""api/parse.py read_status and status_wire: the stored status into the typed
model once per pass, and back out as the API server stores it."""

from __future__ import annotations

from typing import Any

import pytest

from torchfleet_operator.api.parse import read_status, status_wire

# A status as the previous operator version writes it (field names and values).
STORED: dict[str, Any] = {
    "phase": "Running",
    "conditions": [
        {
            "type": "Running",
            "status": "True",
            "reason": "GangRunning",
            "message": "gang 1 is running",
            "lastTransitionTime": "2026-01-01T12:00:00Z",
        }
    ],
    "replicaStatuses": {
        "master": {"active": 1, "ready": 1, "succeeded": 0, "failed": 0},
        "worker": {"active": 2, "ready": 2, "succeeded": 0, "failed": 0},
    },
    "nodesReady": "3/3",
    "restartCount": 1,
    "countedRestarts": 1,
    "disruptions": 0,
    "restarts": 3,
    "inPlaceRestarts": {
        "gang": 1,
        "inGang": 2,
        "total": 2,
        "lastReason": "worker_killed",
        "lastTime": "2026-01-01T12:01:00Z",
    },
    "startTime": "2026-01-01T11:00:00Z",
    "lastCheckpoint": {"step": 40, "time": "2026-01-01T12:00:30Z"},
    "progress": {"step": 42, "totalSteps": 100, "percent": 42, "source": "Metrics"},
    "goodput": 0.75,
    "observedGeneration": 3,
}


def test_a_stored_status_reads_and_writes_back_unchanged() -> None:
    assert status_wire(read_status(STORED)) == STORED


def test_defaults_never_written_stay_unwritten() -> None:
    assert status_wire(read_status({"phase": "Pending"})) == {"phase": "Pending"}
    assert read_status({}).restart_count == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("restartCount", True),  # a bool is not a count
        ("restartCount", "2"),  # nor a string of digits
        ("restartCount", -1),
        ("phase", "Exploded"),
        ("conditions", [{"type": "Running"}]),  # no status
        ("inPlaceRestarts", "x"),
        ("startTime", "yesterday"),
    ],
)
def test_a_field_the_model_refuses_is_left_out_and_the_rest_kept(field: str, value: Any) -> None:
    read = read_status(STORED | {field: value})
    assert status_wire(read) == {k: v for k, v in STORED.items() if k != field}


def test_a_field_no_version_knows_is_left_out() -> None:
    assert status_wire(read_status({"phase": "Running", "fromTheFuture": 1})) == {
        "phase": "Running"
    }


@pytest.mark.parametrize("raw", [None, "Running", ["phase"], 3])
def test_a_status_that_is_not_an_object_reads_as_empty(raw: Any) -> None:
    assert status_wire(read_status(raw)) == {}
