"""The time accounting (status/goodput.py): each table row is a job's life as the
planner feeds it, pass by pass; the buckets must add up to the wall time.

Tolerance: the buckets are whole seconds (the status's timestamps), and the
splits of running time are rounded to the millisecond, so "add up" is checked
to within SUM_TOLERANCE seconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from torchfleet_operator.api.v1alpha1 import TrainingJobStatus
from torchfleet_operator.observed import parse_time
from torchfleet_operator.status import goodput as gp

from .builders import at, stamp

SUM_TOLERANCE = 0.01


@dataclass(frozen=True)
class Pass:
    """One reconcile pass at ``t`` seconds: the phase it leaves the job in and
    what the scrape shows (step, newest checkpoint, save seconds)."""

    t: float
    phase: str
    ended: bool = False  # this pass ends the gang (restart, suspend, eviction)
    step: int | None = None
    checkpoint: int | None = None
    saving: float = 0.0


def run(passes: list[Pass], status: dict[str, Any] | None = None) -> dict[str, Any]:
    """Feeds the passes through the accounting as the planner does; the last status."""
    status = dict(status or {})
    for p in passes:
        progress = None if p.step is None else {"step": p.step, "checkpointSaveSeconds": p.saving}
        account = gp.account(
            status.get("timeAccounting"),
            phase_before=status.get("phase"),
            phase_now=p.phase,
            gang_ended=p.ended,
            progress=progress,
            checkpoint_step=p.checkpoint,
            now=at(p.t),
            created=at(0),
            status_changed=True,  # every row is a pass that writes
        )
        status = {"phase": p.phase, "timeAccounting": account, "goodput": gp.goodput(account)}
        # What the API server stores must parse back, and survive JSON (the operator's restart).
        status = json.loads(json.dumps(status))
        TrainingJobStatus.model_validate({k: v for k, v in status.items() if v is not None})
    return status


def steady(start: float, end: float, first_step: int = 0, **fields: Any) -> list[Pass]:
    """A gang running from ``start`` to ``end`` at one step per second, a pass every 30 s."""
    times = [*range(int(start), int(end), 30), int(end)]
    return [Pass(t, "Running", step=first_step + t - int(start), **fields) for t in times]


@dataclass(frozen=True)
class Case:
    name: str
    passes: list[Pass]
    expected: dict[str, float]
    goodput: float | None


CASES = [
    Case(
        "steady run: queued until the gang runs, then all productive",
        [Pass(0, "Pending"), *steady(10, 610), Pass(611, "Succeeded", step=600)],
        {"wallSeconds": 611, "queuedSeconds": 10, "runningSeconds": 601, "recomputedSeconds": 0},
        1.0,
    ),
    Case(
        "one restart: 100 steps past the checkpoint are recomputed, 30 s to restart",
        [
            Pass(0, "Pending"),
            *steady(10, 300, checkpoint=200),
            Pass(310, "Restarting", ended=True, step=300, checkpoint=200),
            Pass(340, "Running", step=200, checkpoint=200),
            Pass(640, "Succeeded", step=500, checkpoint=500),
        ],
        {
            "wallSeconds": 640,
            "queuedSeconds": 10,
            "restartingSeconds": 30,
            "runningSeconds": 600,
            # gang 1 ran 300 s for 300 steps; 100 of them came after the checkpoint
            "recomputedSeconds": 100,
            "productiveSeconds": 500,
        },
        round(500 / 630, 4),
    ),
    Case(
        "suspended and requeued: neither counts against goodput",
        [
            Pass(0, "Pending"),
            *steady(10, 110, checkpoint=100),
            Pass(110, "Suspended", ended=True, step=100, checkpoint=100),
            Pass(410, "Pending", checkpoint=100),
            Pass(420, "Running", step=100, checkpoint=100),
            Pass(520, "Running", step=200, checkpoint=100),
        ],
        {
            "wallSeconds": 520,
            "queuedSeconds": 20,
            "suspendedSeconds": 300,
            "runningSeconds": 200,
            "recomputedSeconds": 0,
        },
        1.0,
    ),
    Case(
        "checkpoint saves: the loop's blocked time, summed over gangs",
        [
            Pass(0, "Running"),
            Pass(100, "Running", step=90, checkpoint=90, saving=10),
            Pass(101, "Restarting", ended=True, step=90, checkpoint=90, saving=10),
            Pass(111, "Running", step=90, checkpoint=90),
            Pass(211, "Running", step=180, checkpoint=180, saving=10),
        ],
        {
            "wallSeconds": 211,
            "restartingSeconds": 10,
            "runningSeconds": 201,
            "checkpointSeconds": 20,
            "recomputedSeconds": 0,
            "productiveSeconds": 181,
        },
        round(181 / 211, 4),
    ),
    Case(
        "operator down for 5 minutes: the gap goes to the phase last seen, once",
        [
            *(Pass(0, "Pending"), Pass(10, "Running", step=0), Pass(40, "Running", step=30)),
            *(Pass(340, "Running", step=330), Pass(340, "Running", step=330)),  # one pass twice
        ],
        {"wallSeconds": 340, "queuedSeconds": 10, "runningSeconds": 330},
        1.0,
    ),
    Case(
        "a gang that never showed a step loses nothing it could be blamed for",
        [Pass(0, "Running"), Pass(60, "Restarting", ended=True), Pass(70, "Running")],
        {"wallSeconds": 70, "runningSeconds": 60, "restartingSeconds": 10, "recomputedSeconds": 0},
        round(60 / 70, 4),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_buckets_add_up_to_the_wall_time(case: Case) -> None:
    status = run(case.passes)
    account = status["timeAccounting"]
    for key, value in case.expected.items():
        assert account[key] == pytest.approx(value, abs=SUM_TOLERANCE), key
    assert status["goodput"] == case.goodput
    phases = sum(account[key] for key in gp.PHASE_BUCKETS)
    running = sum(account[key] for key in gp.RUNNING_PARTS)
    assert phases == pytest.approx(account["wallSeconds"], abs=SUM_TOLERANCE)
    assert running == pytest.approx(account["runningSeconds"], abs=SUM_TOLERANCE)
    since, until = parse_time(account["since"]), parse_time(account["until"])
    assert since is not None and until is not None
    assert (until - since).total_seconds() == account["wallSeconds"]


def test_the_same_pass_twice_counts_each_second_once() -> None:
    before = run([Pass(0, "Pending"), *steady(10, 100)])
    again = run([Pass(100, "Running", step=90)], before)
    assert again["timeAccounting"] == before["timeAccounting"]


def test_a_pass_that_changes_nothing_else_writes_only_every_flush_interval() -> None:
    start = run([Pass(0, "Running", step=0)])["timeAccounting"]

    def quiet(t: float) -> dict[str, Any] | None:
        return gp.account(
            start,
            phase_before="Running",
            phase_now="Running",
            gang_ended=False,
            progress=None,
            checkpoint_step=None,
            now=at(t),
            created=at(0),
            status_changed=False,
        )

    # The pass that follows our own status write must not write again (no loop).
    assert quiet(gp.FLUSH_SECONDS - 1) is start
    flushed = quiet(gp.FLUSH_SECONDS)
    assert flushed is not None and flushed["runningSeconds"] == gp.FLUSH_SECONDS


def test_a_finished_job_is_frozen() -> None:
    status = run([Pass(0, "Running", step=0), Pass(50, "Failed", step=50)])
    later = run([Pass(5000, "Failed", step=50)], status)
    assert later["timeAccounting"] == status["timeAccounting"]
    assert later["timeAccounting"]["wallSeconds"] == 50


def test_a_job_found_mid_life_counts_from_now_not_from_its_creation() -> None:
    # An operator upgraded under a running job: its history is unknown, not all "running".
    status = run([Pass(1000, "Running", step=10)], {"phase": "Running"})
    account = status["timeAccounting"]
    assert account["since"] == stamp(1000) and account["wallSeconds"] == 0


@pytest.mark.parametrize(
    "stored",
    [
        "not an object",
        {"until": "yesterday"},
        {"until": stamp(0), "runningSeconds": "many", "gang": [1, 2]},
        {"until": stamp(0), "runningSeconds": -50, "gang": {"startStep": -3}},
        {"until": stamp(0), "queuedSeconds": True, "gang": {"runningSeconds": float("nan")}},
    ],
)
def test_a_mangled_stored_account_is_repaired_not_a_crash(stored: Any) -> None:
    status = run([Pass(60, "Running", step=60)], {"phase": "Running", "timeAccounting": stored})
    account = status["timeAccounting"]
    phases = sum(account[key] for key in gp.PHASE_BUCKETS)
    assert phases == pytest.approx(account["wallSeconds"], abs=SUM_TOLERANCE)
    assert all(account[key] >= 0 for key in gp.PHASE_BUCKETS + gp.RUNNING_PARTS)


def test_a_clock_behind_the_last_write_never_subtracts() -> None:
    status = run([Pass(0, "Running", step=0), Pass(100, "Running", step=100)])
    behind = run([Pass(90, "Running", step=100)], status)["timeAccounting"]
    assert behind["until"] == stamp(100) and behind["wallSeconds"] == 100
