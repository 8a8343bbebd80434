"""policy/in_place.py: in-place restarts the master reports, counted toward
backoffLimit once each, across gangs and operator restarts. One row per case."""

from __future__ import annotations

from typing import Any

import pytest

from torchfleet_operator.build.env import contract_env
from torchfleet_operator.reconcile import plan
from torchfleet_operator.status.conditions import find
from torchfleet_operator.status.node_health import GangHealth
from torchfleet_trainer import contract

from .builders import CONFIG, at, gang, job, observed, running_status, spec_of, stamp

POLICY = {"inPlaceRestarts": 3, "backoffLimit": 2}


def passed(reported: int | None, status: dict[str, Any], restart: int = 0) -> Any:
    """One pass over a running gang whose master reports ``reported`` in-place restarts."""
    progress = {"step": 40, "updateTime": stamp(10)}
    health = GangHealth(in_place_restarts=reported, in_place_reason="worker_killed")
    seen = observed(*gang("llm", 3, restart), health=health, progress=progress)
    body = job(status=running_status(restart, progress=progress, **status), runPolicy=POLICY)
    return plan(body, seen, at(10), CONFIG)


@pytest.mark.parametrize(
    ("reported", "before", "total", "counted"),
    [
        (None, {}, None, 0),  # nothing reported: nothing recorded
        (0, {}, None, 0),
        (1, {}, 1, 1),
        # Seen already (an operator restart reads the same figure): not counted twice.
        (1, {"inPlaceRestarts": {"total": 1, "gang": 0, "inGang": 1}, "countedRestarts": 1}, 1, 1),
        (2, {"inPlaceRestarts": {"total": 1, "gang": 0, "inGang": 1}, "countedRestarts": 1}, 2, 2),
    ],
)
def test_each_in_place_restart_counts_once(reported, before, total, counted):
    decided = passed(reported, before)
    shown = decided.status.get("inPlaceRestarts") or {}
    assert shown.get("total") == total
    assert int(decided.status.get("countedRestarts") or 0) == counted
    assert decided.status["restarts"] == (total or 0)  # restartCount 0 + in place
    new = (total or 0) - (before.get("inPlaceRestarts") or {}).get("total", 0)
    assert decided.in_place_restarts == ["worker_killed"] * new
    assert [e.reason for e in decided.events if e.reason == "InPlaceRestart"] == ["InPlaceRestart"][
        :new
    ]
    if new:
        assert shown["lastReason"] == "worker_killed"


def test_a_new_gangs_launchers_count_from_zero_again():
    before = {"inPlaceRestarts": {"total": 2, "gang": 0, "inGang": 2}, "countedRestarts": 3}
    decided = passed(1, before, restart=1)
    assert decided.status["inPlaceRestarts"] | {"lastTime": None} == {
        "total": 3,
        "gang": 1,
        "inGang": 1,
        "lastReason": "worker_killed",
        "lastTime": None,
    }
    assert decided.status["restarts"] == 1 + 3


def test_in_place_restarts_past_backoff_limit_fail_the_job():
    before = {"inPlaceRestarts": {"total": 2, "gang": 0, "inGang": 2}, "countedRestarts": 2}
    decided = passed(3, before)
    assert decided.status["phase"] == "Failed"
    failed = find(decided.status["conditions"], "Failed")
    assert failed and failed["reason"] == "BackoffLimitExceeded"
    assert "3 counted restarts of backoffLimit 2" in failed["message"]


def test_launchers_get_the_budget_and_the_operators_exit_code_rule():
    spec = spec_of(
        runPolicy={"inPlaceRestarts": 2, "restartPolicy": "ExitCode", "permanentExitCodes": [3]}
    )
    env = contract_env("llm", "team", "uid", spec, 1, 0)
    assert env[contract.IN_PLACE_RESTARTS] == "2"
    policy = contract.ExitCodePolicy.from_env(env)
    assert policy.restart_policy == "ExitCode" and policy.permanent_codes == {3}
    assert not policy.retries(3) and policy.retries(137)
    off = contract_env("llm", "team", "uid", spec_of(), 1, 0)
    assert contract.IN_PLACE_RESTARTS not in off and contract.RESTART_POLICY not in off
