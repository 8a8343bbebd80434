"""policy/in_place.py: in-place restarts the master reports, counted toward
backoffLimit once each, across gangs and operator restarts. One row per case."""

from __future__ import annotations

from typing import Any

import pytest

from torchfleet_contract import pod as contract
from torchfleet_operator.desired.env import contract_env
from torchfleet_operator.observed import GangHealth
from torchfleet_operator.reconcile import plan
from torchfleet_operator.status import goodput as gp
from torchfleet_operator.status.conditions import find

from .builders import CONFIG, at, gang, job, observed, pod, running_status, spec_of, stamp

POLICY = {"inPlaceRestarts": 3, "backoffLimit": 2}


def passed(reported: int | None, status: dict[str, Any], restart: int = 0) -> Any:
    """One pass over a running gang whose master reports ``reported`` in-place restarts."""
    progress = {"step": 40, "updateTime": stamp(10)}
    health = GangHealth(restarts_in_gang=reported, in_place_reason="worker_killed")
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
    assert decided.in_place_reasons == ["worker_killed"] * new
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


def finished_gang(report: tuple[int, str | None] | None, exit_code: int = 0) -> Any:
    """A pass over a gang whose master just exited, leaving ``report`` (its
    termination message's in-place restarts), before any scrape showed one."""
    phase = "Succeeded" if exit_code == 0 else "Failed"
    master = pod("llm", 0, 2, phase=phase, exit_code=exit_code, in_place_report=report)
    seen = observed(*gang("llm", 3, 2, **{master.name: master}))
    before = {"countedRestarts": 2}  # the gang restarts before this gang (its third)
    body = job(status=running_status(2, **before), runPolicy=POLICY)
    return plan(body, seen, at(10), CONFIG)


@pytest.mark.parametrize(
    ("report", "exit_code", "total", "phase"),
    [
        # The round ended and the job with it before a scrape: the pod's last word.
        ((1, "worker_killed"), 0, 1, "Succeeded"),
        # Past backoffLimit (2 + 1 > 2), but the program finished: it succeeded.
        ((1, None), 0, 1, "Succeeded"),
        (None, 0, None, "Succeeded"),
        ((0, None), 0, None, "Succeeded"),
        # A failed pod's third failure: the gang restart's count, not an in-place one.
        (None, 1, None, "Failed"),
    ],
)
def test_a_round_only_the_termination_message_tells_is_counted(report, exit_code, total, phase):
    decided = finished_gang(report, exit_code)
    shown = decided.status.get("inPlaceRestarts") or {}
    assert shown.get("total") == total, decided.status
    assert decided.status["phase"] == phase
    if total:
        assert shown.get("lastReason") == report[1]
        assert decided.status["countedRestarts"] == 3


def test_launchers_get_the_budget_and_the_operators_exit_code_rule():
    spec = spec_of(
        runPolicy={"inPlaceRestarts": 2, "restartPolicy": "ExitCode", "permanentExitCodes": [3]}
    )
    env = contract_env("llm", "team", "uid", spec, 1, 0)
    assert env[contract.IN_PLACE_RESTARTS] == "2"
    policy = contract.ExitCodePolicy.from_env(env)
    assert policy.restart_policy == "ExitCode" and policy.permanent_codes == {3}
    assert not policy.retries(3) and policy.retries(137)
    off = contract_env("llm", "team", "uid", spec_of(runPolicy={"inPlaceRestarts": 0}), 1, 0)
    assert contract.IN_PLACE_RESTARTS not in off and contract.RESTART_POLICY not in off


ELASTIC = {"minNodes": 2, "maxNodes": 3}


@pytest.mark.parametrize(
    ("spec", "budget"),
    [
        ({}, 2),  # unset: the default, a fixed gang of the built-in trainer
        ({"runPolicy": {"backoffLimit": 1}}, 1),  # never past backoffLimit
        ({"runPolicy": {"backoffLimit": 0}}, 0),
        ({"runPolicy": {"restartPolicy": "Never"}}, 0),  # nothing is retried
        ({"runPolicy": {"restartPolicy": "ExitCode"}}, 2),
        ({"runPolicy": {"inPlaceRestarts": 0}}, 0),  # turned off
        ({"runPolicy": {"inPlaceRestarts": 5, "backoffLimit": 1}}, 5),  # as asked
        ({"command": ["torchrun", "train.py"]}, 0),  # its own launcher
        ({"elastic": ELASTIC}, 0),  # restarts by elastic.maxRestarts
    ],
)
def test_the_in_place_budget_unset_is_the_default_within_the_run_policy(
    spec: dict[str, Any], budget: int
):
    parsed = spec_of(**spec)
    assert parsed.in_place_restarts == budget
    env = contract_env("llm", "team", "uid", parsed, 1, 0)
    assert env.get(contract.IN_PLACE_RESTARTS) == (str(budget) if budget else None)


def account_counting_round_0(**gang: Any) -> dict[str, Any]:
    """100 s of running in round 0 of gang 0, its last step 40 scraped at 100 s."""
    account = gp.fresh(at(0), 0) | {"until": stamp(100), "wallSeconds": 100}
    account |= {"runningSeconds": 100, "productiveSeconds": 100}
    account["gang"] |= {
        "runningSeconds": 100,
        "lastStep": 40,
        "lastStepTime": stamp(100),
        "lastSaveSeconds": 0,
    } | gang
    return account


def new_round_pass(account: dict[str, Any], **status: Any) -> Any:
    """The pass at 130 s that first shows round 1: training again since 120 s, at step 31."""
    old_status = running_status(
        progress={"step": 40, "updateTime": stamp(100)},
        lastCheckpoint={"step": 30, "time": stamp(90)},
        timeAccounting=account,
        **status,
    )
    health = GangHealth(
        phase=contract.PHASE_TRAIN,
        phase_started=at(120).timestamp(),
        restarts_in_gang=1,
        in_place_reason="worker_killed",
    )
    seen = observed(*gang("llm", 3), health=health, progress={"step": 31, "updateTime": stamp(130)})
    return plan(job(status=old_status, runPolicy=POLICY), seen, at(130), CONFIG)


def test_an_in_place_round_is_restart_time_and_its_steps_past_the_checkpoint_recomputed():
    """The old round's last step was scraped at 100 s (step 40, checkpoint 30); the
    new round trains from 120 s, and the pass that first shows it runs at 130 s:
    20 s were restart time, a quarter of the old round's 100 s was recomputed, and
    the new round has run 10 s from the checkpoint."""
    decided = new_round_pass(account_counting_round_0())
    shown = decided.status["timeAccounting"]
    assert shown["wallSeconds"] == 130
    assert shown["restartingSeconds"] == 20
    assert shown["runningSeconds"] == 110
    assert shown["recomputedSeconds"] == 25  # 100 s x (40 - 30) / 40 steps
    assert shown["productiveSeconds"] == 85
    assert shown["gang"] | {"lastStepTime": None} == {
        "inPlaceRound": 1,
        "startStep": 30,
        "runningSeconds": 10,
        "checkpointSecondsBefore": 0,
        "lastStep": 31,
        "lastStepTime": None,
        "lastSaveSeconds": 0,
    }
    assert decided.status["goodput"] == round(85 / 130, 4)
    assert decided.status["progress"]["step"] == 31  # progress drops to the resumed round's


def test_a_round_is_settled_once_whichever_pass_shows_it_first():
    """The next pass (or a restarted operator's) sees round 1 again: nothing moves."""
    first = new_round_pass(account_counting_round_0())
    again = dict(first.status)
    health = GangHealth(phase=contract.PHASE_TRAIN, restarts_in_gang=1)
    progress = {"step": 35, "updateTime": stamp(135)}
    seen = observed(*gang("llm", 3), health=health, progress=progress)
    second = plan(job(status=again, runPolicy=POLICY), seen, at(135), CONFIG)
    shown = second.status["timeAccounting"]
    assert shown["restartingSeconds"] == 20 and shown["recomputedSeconds"] == 25
    assert shown["gang"]["runningSeconds"] == 15 and shown["gang"]["lastStep"] == 35


def test_an_account_from_before_rounds_were_counted_adopts_the_round_shown():
    """An operator upgraded mid-run: its account has no inPlaceRound. Nothing is
    settled on a guess; later rounds are counted from the one it adopts."""
    account = account_counting_round_0()
    del account["gang"]["inPlaceRound"]
    decided = new_round_pass(account)
    shown = decided.status["timeAccounting"]
    assert shown["restartingSeconds"] == 0 and shown["recomputedSeconds"] == 0
    assert shown["gang"]["inPlaceRound"] == 1


def test_a_new_round_without_a_train_phase_start_counts_until_the_pass():
    hostile = GangHealth(phase=contract.PHASE_TRAIN, phase_started=1e300, restarts_in_gang=1)
    old_status = running_status(
        progress={"step": 40, "updateTime": stamp(100)}, timeAccounting=account_counting_round_0()
    )
    seen = observed(*gang("llm", 3), health=hostile, progress={"step": 1, "updateTime": stamp(130)})
    decided = plan(job(status=old_status, runPolicy=POLICY), seen, at(130), CONFIG)
    assert decided.status["timeAccounting"]["restartingSeconds"] == 30
    assert decided.status["timeAccounting"]["runningSeconds"] == 100
