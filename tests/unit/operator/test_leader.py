"""Who leads: the Lease decisions of leader.py, on the candidate's own clock."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

from torchfleet_operator.kube import FENCED, RawApi
from torchfleet_operator.leader import (
    ElectionTiming,
    LeaderElector,
    LeaseRecord,
    next_record,
    released,
)

ME, OTHER = "me", "other"
STAMP = "2026-11-23T10:00:00.000000Z"


def held_by(holder: str | None, transitions: int = 3) -> LeaseRecord:
    return LeaseRecord(holder, 15, "then", "then", transitions)


@pytest.mark.parametrize(
    "current, seen_at, now, holder, transitions",
    [
        pytest.param(None, 0, 0, ME, 0, id="no lease yet: create it"),
        pytest.param(held_by(None), 0, 0, ME, 4, id="released: take it at once"),
        pytest.param(held_by(ME), 0, 14, ME, 3, id="ours: renew, no transition"),
        pytest.param(held_by(ME), 0, 99, ME, 3, id="ours even if we were slow"),
        pytest.param(held_by(OTHER), 0, 14.9, None, None, id="another's, renewed 14.9s ago"),
        pytest.param(held_by(OTHER), 0, 15, ME, 4, id="another's, unchanged for 15s"),
        pytest.param(held_by(OTHER), 10, 20, None, None, id="another's, seen changing 10s ago"),
    ],
)
def test_next_record(current, seen_at, now, holder, transitions):
    record = next_record(current, seen_at, ME, now, STAMP, 15)
    if holder is None:
        assert record is None
        return
    assert record is not None and record.holder == holder
    assert record.transitions == transitions and record.renew_time == STAMP
    if current is not None and current.holder == ME:
        assert record.acquire_time == current.acquire_time  # held since then
    else:
        assert record.acquire_time == STAMP


def test_expiry_ignores_the_holders_wall_clock():
    # A renewTime far in the past (a skewed node clock) does not make the lease
    # ours while we have seen it change within the lease duration.
    skewed = LeaseRecord(OTHER, 15, "1970-01-01T00:00:00.000000Z", "1970-01-01T00:00:00.000000Z")
    assert next_record(skewed, 100.0, ME, 101.0, STAMP, 15) is None


def test_release_gives_up_only_our_own_lease():
    assert released(held_by(ME), ME) == LeaseRecord(None, 1, "then", "then", 3)
    assert released(held_by(OTHER), ME) is None


def test_round_trip_through_the_lease_spec():
    record = LeaseRecord(ME, 15, STAMP, STAMP, 2)
    assert LeaseRecord.from_spec(record.to_spec()) == record
    assert LeaseRecord.from_spec({"holderIdentity": "", "leaseDurationSeconds": -1}) == (
        LeaseRecord(None, 15)
    )


@pytest.mark.parametrize(
    "lease, renew, retry",
    [(10, 10, 2), (15, 10, 10), (15, 10, 0)],
)
def test_timings_that_could_leave_two_leaders_are_refused(lease, renew, retry):
    with pytest.raises(ValueError, match="lease > renew deadline > retry period"):
        ElectionTiming(lease, renew, retry)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    "leading, renewed_ago, holds",
    [
        pytest.param(True, 0.0, True, id="just renewed"),
        pytest.param(True, 9.9, True, id="inside the renew deadline"),
        pytest.param(True, 10.0, False, id="the deadline passed, the loop not yet told"),
        pytest.param(True, 3600.0, False, id="frozen for an hour"),
        pytest.param(False, 0.0, False, id="a standby"),
    ],
)
def test_a_leader_may_write_only_inside_its_renew_deadline(
    monkeypatch, leading, renewed_ago, holds
):
    clock = _Clock()
    monkeypatch.setattr("torchfleet_operator.leader.time.monotonic", clock)
    elector = LeaderElector(None, "ns", "lease", ME, ElectionTiming(15, 10.0, 2.0))
    elector.leading = leading
    elector._renewed = clock.now - renewed_ago
    assert elector.holds_lease() is holds


def test_a_fenced_client_sends_no_write():
    from kubernetes import client

    raw = RawApi(client.ApiClient(client.Configuration(host="https://127.0.0.1:1")))
    raw.fence = lambda: False
    # Port 1 refuses connections: had the write been sent, the error would say so.
    with pytest.raises(ApiException) as refused:
        raw.request("POST", "/api/v1/namespaces/ns/pods", {"kind": "Pod"})
    assert refused.value.reason == FENCED
