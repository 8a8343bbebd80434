"""status/restarts.py: the one home of restart accounting, as a table."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from torchfleet_operator.api.parse import read_status, status_wire
from torchfleet_operator.status import restarts

STAMP = "2026-01-01T12:00:00Z"
NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("raw", "count"),
    [(3, 3), (0, 0), (-2, 0), (True, 0), ("4", 0), (None, 0), (2.5, 0)],
)
def test_a_stored_count_is_a_whole_number_or_nothing(raw: Any, count: int) -> None:
    assert restarts.count_of(raw) == count


@pytest.mark.parametrize(
    ("counted", "limit", "reached"),
    [(0, 0, False), (1, 0, True), (3, 3, False), (4, 3, True), (2, 6, False)],
)
def test_a_limit_allows_that_many_and_the_next_is_past_it(
    counted: int, limit: int, reached: bool
) -> None:
    assert restarts.limit_reached(counted, limit) is reached


@pytest.mark.parametrize(
    ("status", "counted"),
    [
        ({}, 0),
        ({"restartCount": 4, "countedRestarts": 1, "disruptions": 3}, 1),
        # A status written before countedRestarts existed derives it.
        ({"restartCount": 4, "disruptions": 1}, 3),
        ({"restartCount": 1, "disruptions": 2}, 0),  # a Kueue eviction restarts nothing
        ({"restartCount": 2, "countedRestarts": -1}, 2),  # hostile: derived instead
        ({"restartCount": 2, "countedRestarts": True}, 2),
    ],
)
def test_the_counted_restarts(status: dict[str, Any], counted: int) -> None:
    assert restarts.counted(read_status(status)) == counted


def test_a_program_failure_counts_and_a_disruption_does_not() -> None:
    status = read_status({"restartCount": 2, "countedRestarts": 1, "disruptions": 1})
    assert restarts.count_failure(status, disruption=False) == 2
    assert restarts.count_failure(status, disruption=True) == 2
    assert restarts.count_failure(status, disruption=False, failures=3) == 5
    assert status_wire(status) == {"restartCount": 2, "countedRestarts": 5, "disruptions": 2}


def test_a_disruption_pins_the_count_a_status_derived() -> None:
    # An older operator's status: 2 gang restarts, neither a disruption. A Kueue
    # eviction (a disruption that restarts nothing) must not take one of them back.
    status = read_status({"restartCount": 2})
    restarts.count_failure(status, disruption=True)
    assert status_wire(status) == {"restartCount": 2, "countedRestarts": 2, "disruptions": 1}
    assert restarts.counted(status) == 2


def test_the_generation_moves_forward_only() -> None:
    status = read_status({"restartCount": 2})
    assert restarts.adopt_gang(status, 1) == 2  # an old pod of an earlier gang
    assert restarts.adopt_gang(status, 3) == 3  # a write lost before its pods were made
    assert restarts.next_gang(status) == 4
    assert restarts.gang(status) == 4
    assert restarts.adopt_gang(read_status({"restartCount": "x"}), 0) == 0


@pytest.mark.parametrize(
    ("status", "round_"),
    [
        ({}, 0),
        ({"restartCount": 1, "inPlaceRestarts": {"total": 3, "gang": 1, "inGang": 2}}, 2),
        # An older gang's rounds are not this gang's.
        ({"restartCount": 1, "inPlaceRestarts": {"total": 3, "gang": 0, "inGang": 2}}, 0),
        ({"restartCount": 1, "inPlaceRestarts": {"gang": 1, "inGang": "2"}}, 0),  # hostile
        ({"restartCount": 1, "inPlaceRestarts": {"gang": 1, "inGang": True}}, 0),
        ({"restartCount": 1, "inPlaceRestarts": "x"}, 0),
    ],
)
def test_the_in_place_round_a_gang_is_in(status: dict[str, Any], round_: int) -> None:
    assert restarts.in_place_in_gang(read_status(status)) == round_


def test_in_place_restarts_count_once_each_toward_backoff_limit() -> None:
    status = read_status({"restartCount": 1, "countedRestarts": 1})
    assert restarts.count_in_place(status, 2, "worker_killed", NOW) == 2
    # Seen again (a later scrape, an operator restart): nothing new.
    assert restarts.count_in_place(status, 2, "worker_killed", NOW) == 0
    assert restarts.count_in_place(status, 1, None, NOW) == 0
    assert status_wire(status)["countedRestarts"] == 3
    assert status_wire(status)["inPlaceRestarts"] == {
        "gang": 1,
        "inGang": 2,
        "total": 2,
        "lastTime": STAMP,
        "lastReason": "worker_killed",
    }
    # The next gang's launchers count from 0 again; the total goes on.
    restarts.next_gang(status)
    assert restarts.count_in_place(status, 1, "peer_lost", NOW) == 1
    assert status_wire(status)["inPlaceRestarts"]["total"] == 3
    assert status_wire(status)["inPlaceRestarts"]["inGang"] == 1
    assert restarts.total(status) == 2 + 3
    restarts.record_total(status)
    assert status_wire(status)["restarts"] == 5


def test_no_in_place_restart_writes_no_in_place_record() -> None:
    status = read_status({"restartCount": 0})
    assert restarts.count_in_place(status, 0, None, NOW) == 0
    assert status_wire(status) == {"restartCount": 0}
