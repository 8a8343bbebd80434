"""Pod counts alone are written at a pace; every other change at once."""

from __future__ import annotations

import pytest

from torchfleet_operator.status.pacing import counts_only, wait_before_writing

FORMING = {"phase": "Pending", "nodesReady": "0/3", "timeAccounting": {"until": "t0"}}


@pytest.mark.parametrize(
    ("change", "only_counts"),
    [
        ({"nodesReady": "1/3"}, True),
        ({"nodesReady": "1/3", "timeAccounting": {"until": "t1"}, "goodput": 0.5}, True),
        ({"nodesReady": "3/3", "phase": "Running"}, False),  # the phase goes at once
        ({"nodesReady": "1/3", "conditions": [{"type": "Created"}]}, False),
        ({"timeAccounting": {"until": "t1"}}, False),  # the accounting's own flush
        ({}, False),  # nothing changed: nothing to pace
    ],
)
def test_counts_only(change, only_counts):
    assert counts_only(FORMING, {**FORMING, **change}) is only_counts


@pytest.mark.parametrize(
    ("change", "since_last_write", "wait"),
    [
        ({"nodesReady": "1/3"}, 2.0, 3.0),  # counts alone, 2 s after a write: 3 s more
        ({"nodesReady": "1/3"}, 5.0, None),  # the interval is over: now
        ({"nodesReady": "1/3"}, None, None),  # never written by this process: now
        ({"phase": "Running", "nodesReady": "3/3"}, 0.1, None),  # not counts alone: now
    ],
)
def test_wait_before_writing(change, since_last_write, wait):
    assert wait_before_writing(FORMING, {**FORMING, **change}, since_last_write, 5.0) == wait
