"""Status that is never stale: after a gang restart status.progress shows the step
the new gang resumes from at once, and the old gang's last scrape (which the
poller still holds) never comes back. Decided in the planner."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from torchfleet_operator.observed import Observed, SavedCheckpoint
from torchfleet_operator.reconcile import plan
from torchfleet_operator.status import goodput
from torchfleet_operator.status.conditions import set_condition
from torchfleet_operator.status.patch import with_removals

from .builders import CONFIG, at, gang, job, observed, pod, running_status, stamp

LAST_SCRAPE = {
    "step": 300,
    "totalSteps": 1000,
    "percent": 30,
    "loss": 2.1,
    "tokensPerSecond": 5000.0,
    "mfu": 0.4,
    "etaSeconds": 700,
    "checkpointSaveSeconds": 4.0,
    "updateTime": stamp(95),
}


def running(**extra: Any) -> dict[str, Any]:
    conditions = set_condition(None, "Running", True, "GangRunning", "all 3 pods", stamp(0))
    return running_status(conditions=conditions, progress=LAST_SCRAPE, **extra)


HELD = {"step": 300, "totalSteps": 1000, "percent": 30, "checkpointSaveSeconds": 4.0}


def restarted(checkpoint: dict[str, Any] | None) -> dict[str, Any]:
    """The status once the gang restarted at t=100 (pod 2 died) and its master,
    which held the progress at its last step while it could still save, is gone."""
    failed = pod("llm", 2, phase="Failed", exit_code=137, reason="Error")
    status = running(lastCheckpoint=checkpoint) if checkpoint else running()
    seen = observed(*gang(**{failed.name: failed}), progress=LAST_SCRAPE)
    p = plan(job(), seen, at(100), CONFIG, status=status)
    assert p.status["phase"] == "Restarting" and p.status["restartCount"] == 1
    assert p.status["progress"] == HELD | {"updateTime": stamp(100)}
    assert p.status["timeAccounting"]["gang"]["ending"] is True
    gone = plan(job(), observed(progress=LAST_SCRAPE), at(100), CONFIG, status=p.status)
    assert "ending" not in gone.status["timeAccounting"]["gang"]
    return gone.status


@pytest.mark.parametrize(
    ("checkpoint", "step", "percent"),
    [({"step": 200, "time": stamp(50)}, 200, 20), (None, 0, 0)],
    ids=["resumes from the last checkpoint", "no checkpoint: from the start"],
)
def test_a_gang_restart_shows_the_resumed_step_at_once(checkpoint, step, percent) -> None:
    status = restarted(checkpoint)
    # The dead gang's rates, loss and ETA go; the step and percent are the resumed ones.
    assert status["progress"] == {
        "step": step,
        "totalSteps": 1000,
        "percent": percent,
        "updateTime": stamp(100),
        "source": "Checkpoint",  # the operator's reset, not a figure of the trainer's
    }
    # The status write removes what the reset dropped (a merge patch would keep it).
    patch = with_removals(running(), status)["progress"]
    assert patch["etaSeconds"] is None and patch["tokensPerSecond"] is None


def test_the_old_gangs_scrapes_never_come_back() -> None:
    status = restarted({"step": 200})
    pods = gang(restart=1)
    # The poller still holds the old master's last scrape...
    held = plan(job(), observed(*pods, progress=LAST_SCRAPE), at(120), CONFIG, status=status)
    assert held.status["progress"]["step"] == 200
    # ...or one that was in flight across the restart (taken after it, before the new gang ran).
    in_flight = LAST_SCRAPE | {"updateTime": stamp(101)}
    now_running = plan(job(), observed(*pods, progress=in_flight), at(130), CONFIG, status=status)
    assert now_running.status["phase"] == "Running"
    assert now_running.status["progress"]["step"] == 200
    again = plan(
        job(), observed(*pods, progress=in_flight), at(140), CONFIG, status=now_running.status
    )
    assert again.status["progress"]["step"] == 200
    # The new master's first scrape is shown.
    fresh = {"step": 210, "totalSteps": 1000, "percent": 21, "updateTime": stamp(150)}
    new = plan(job(), observed(*pods, progress=fresh), at(151), CONFIG, status=again.status)
    assert new.status["progress"] == fresh


def test_the_percentage_goes_back_only_with_the_step() -> None:
    """A job's life, pass by pass: scrapes, a restart, the stale scrape, the resume."""
    status = running()
    shown = [status["progress"]]
    failed = pod("llm", 2, phase="Failed", exit_code=137, reason="Error")
    lives: list[tuple[float, Observed]] = [
        (96, observed(*gang(), progress=LAST_SCRAPE | {"step": 320, "updateTime": stamp(96)})),
        (100, observed(*gang(**{failed.name: failed}), progress=LAST_SCRAPE, checkpoint_step=250)),
        (110, observed(progress=LAST_SCRAPE)),
        (125, observed(*gang(restart=1), progress=LAST_SCRAPE)),
        (130, observed(*gang(restart=1), progress=LAST_SCRAPE)),
        (
            140,
            observed(
                *gang(restart=1),
                progress={"step": 260, "totalSteps": 1000, "percent": 26, "updateTime": stamp(139)},
            ),
        ),
    ]
    for t, seen in lives:
        status = plan(job(), seen, at(t), CONFIG, status=status).status
        shown.append(status["progress"])
    steps = [p["step"] for p in shown]
    # 320 stays while the old master may still save; then the checkpoint's 250.
    assert steps == [300, 320, 320, 250, 250, 250, 260]
    for before, after in itertools.pairwise(shown):
        if after["percent"] < before["percent"]:
            assert after["step"] < before["step"], (before, after)


def test_a_restart_is_counted_in_the_time_accounting() -> None:
    failed = pod("llm", 2, phase="Failed", exit_code=137, reason="Error")
    status = running(lastCheckpoint={"step": 200}, timeAccounting=goodput.fresh(at(0), None))
    seen = observed(*gang(**{failed.name: failed}), progress=LAST_SCRAPE)
    ending = plan(job(), seen, at(100), CONFIG, status=status).status
    assert ending["timeAccounting"]["recomputedSeconds"] == 0  # not before the master is gone
    gone = observed(progress=LAST_SCRAPE)
    account = plan(job(), gone, at(100), CONFIG, status=ending).status["timeAccounting"]
    assert account["wallSeconds"] == account["runningSeconds"] == 100
    # 300 steps in 100 s, 4 of them saving; the 100 steps past the checkpoint are lost.
    assert account["checkpointSeconds"] == 4
    assert account["recomputedSeconds"] == pytest.approx(96 * 100 / 300)
    assert account["gang"] == {
        "inPlaceRound": 0,
        "startStep": 200,
        "runningSeconds": 0,
        "checkpointSecondsBefore": 4,
    }


def test_suspending_a_running_gang_also_shows_the_step_it_will_resume_from() -> None:
    status = running(lastCheckpoint={"step": 250})
    p = plan(job(suspend=True), observed(*gang(), progress=LAST_SCRAPE), at(100), CONFIG, status)
    assert p.status["phase"] == "Suspended"
    assert p.status["progress"] == HELD | {"updateTime": stamp(100)}  # the master may save
    gone = observed(progress=LAST_SCRAPE)
    p = plan(job(suspend=True), gone, at(100), CONFIG, status=p.status)
    assert p.status["progress"] == {
        "step": 250,
        "totalSteps": 1000,
        "percent": 25,
        "updateTime": stamp(100),
        "source": "Checkpoint",
    }


def test_a_running_gang_keeps_its_scraped_figures() -> None:
    # Not a gang end: the latest scrape stays whole (rates, loss, ETA).
    newer = LAST_SCRAPE | {"step": 310, "updateTime": stamp(99)}
    p = plan(job(), observed(*gang(), progress=newer), at(100), CONFIG, status=running())
    assert p.status["phase"] == "Running" and p.status["progress"] == newer


@pytest.mark.parametrize(
    ("figures", "now", "second_look"),
    [
        ({"step": 301}, 95.6, True),
        ({}, 95.6, False),
        ({"step": 301}, 99, False),
    ],
    ids=[
        "new figures, same second: another pass in a second",
        "same figures: nothing to show, no pass",
        "an old scrape that stopped changing: never a pass a second",
    ],
)
def test_new_figures_in_the_second_already_shown_get_a_second_look(
    figures: dict[str, Any], now: float, second_look: bool
) -> None:
    # Timestamps are whole seconds: a scrape in the second already shown is not
    # "newer", and the poller wakes the job only when the figures change again.
    same_second = LAST_SCRAPE | figures
    p = plan(job(), observed(*gang(), progress=same_second), at(now), CONFIG, status=running())
    assert p.status["progress"] == LAST_SCRAPE
    if second_look:
        assert p.requeue_after is not None and p.requeue_after <= 1.0
        # By then the poller holds the same figures a second later: shown.
        later = same_second | {"updateTime": stamp(96)}
        shown = plan(job(), observed(*gang(), progress=later), at(96.1), CONFIG, status=p.status)
        assert shown.status["progress"] == later
    else:
        assert p.requeue_after is None or p.requeue_after > 1.0


@pytest.mark.parametrize("master_seen_ending", [True, False], ids=["ended-pod", "pod-gone"])
def test_a_save_in_the_grace_period_is_where_progress_resumes(master_seen_ending: bool) -> None:
    """Preempted at t=100 with step 300 scraped and step 200 checkpointed, the
    trainer saved step 310 in its grace period, after the last scrape. Its
    termination message says so (kept even when the pod went before a pass saw
    it end): progress never shows 200, nothing counts as recomputed, and the
    checkpoint is dated when it was saved."""
    status = running(
        lastCheckpoint={"step": 200, "time": stamp(50)}, timeAccounting=goodput.fresh(at(0), None)
    )
    old_scrape = {"progress": LAST_SCRAPE, "checkpoint_step": 200}
    suspend = plan(job(suspend=True), observed(*gang(), **old_scrape), at(100), CONFIG, status)
    assert suspend.status["progress"]["step"] == 300  # held: the master may still save
    saved = SavedCheckpoint(310, at(103))
    master = pod("llm", 0, phase="Failed", exit_code=143, deleting=True)
    pods = (master,) if master_seen_ending else ()
    seen = observed(*pods, saved_checkpoint=saved, **old_scrape)
    ended = plan(job(suspend=True), seen, at(104), CONFIG, status=suspend.status).status
    assert ended["lastCheckpoint"] == {"step": 310, "time": stamp(103)}
    assert ended["progress"] == {
        "step": 310,
        "totalSteps": 1000,
        "percent": 31,
        "updateTime": stamp(104),
        "source": "Checkpoint",
    }
    assert ended["timeAccounting"]["recomputedSeconds"] == 0
    # The passes after it, with the old gang's last scrape still held, change nothing back.
    again = plan(
        job(suspend=True),
        observed(**old_scrape, saved_checkpoint=saved),
        at(110),
        CONFIG,
        status=ended,
    )
    assert again.status["lastCheckpoint"] == ended["lastCheckpoint"]
    assert again.status["progress"]["step"] == 310
