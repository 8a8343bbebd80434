"""status.timeAccounting and status.goodput: where a job's wall time went. Pure.

Each pass adds the time since ``until`` to the bucket of the phase the job
was in during it (the phase the stored status shows), then moves ``until`` to
now. Everything it needs is in the status, so a pass run twice, or the first
pass of a restarted operator, adds each second exactly once: the time the
operator was down goes to the phase the job was last seen in.

Buckets (whole seconds, from the status's one-second timestamps, so they add
up exactly): queued (Pending: waiting for admission, scheduling or the first
gang) + suspended + restarting (a gang's end until the next one runs whole:
the restart latency) + running = wall. Running splits into checkpoint (the
loop blocked saving, from the trainer's save histogram), recomputed (steps
done after the last checkpoint by a gang that then ended: done again) and
productive (the rest). Time lost to restarts is restarting + recomputed.
goodput = productive / (running + restarting): the share of the time the job
was allowed to run that went into steps that were kept.

When a gang ends its steps since the last checkpoint are lost: their time is
the gang's running time (less its saves) times the share of its observed
steps that came after the checkpoint. A gang with no scrape showing a step
loses nothing it could be blamed for (the figure is unknown, not zero work).
While the ended gang's master still runs (preempted, it saves in its grace
period) the gang is marked ending and settled only once the master is gone,
against the newest save then known.

An in-place restart (runPolicy.inPlaceRestarts) ends a round, not the gang's
pods: the phase stays Running throughout. The account remembers the round it
counts and that round's last scraped step (``gang.inPlaceRound``,
``lastStep``, ``lastStepTime``); the first scrape from a later round moves the
time from that last step to the new round's training start from running to
restarting, and settles the old round as a gang would be settled (its steps
past the checkpoint are recomputed time; the next round counts from the
checkpoint it resumed from). From the account alone, so it happens once
whichever pass first shows the new round, and an operator restart changes
nothing.

To keep status writes rare, a pass that changes nothing else flushes only
every FLUSH_SECONDS (a flush is a status write, whose watch event is a pass).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from torchfleet_operator.api import constants as c
from torchfleet_operator.observed import parse_time, timestamp

FLUSH_SECONDS = 60
# The status keys this module decides.
TIME_ACCOUNTING = "timeAccounting"
STATUS_KEYS = (TIME_ACCOUNTING, "goodput")
FINISHED = (c.PHASE_SUCCEEDED, c.PHASE_FAILED)
BUCKET_OF_PHASE = {
    c.PHASE_RUNNING: "runningSeconds",
    c.PHASE_RESTARTING: "restartingSeconds",
    c.PHASE_SUSPENDED: "suspendedSeconds",
}
QUEUED = "queuedSeconds"  # Pending, or no phase yet
PHASE_BUCKETS = ("queuedSeconds", "suspendedSeconds", "restartingSeconds", "runningSeconds")
RUNNING_PARTS = ("productiveSeconds", "recomputedSeconds", "checkpointSeconds")


@dataclass(frozen=True)
class ShownRound:
    """The scrape status.progress shows after this pass, and its in-place round."""

    round: int  # the launchers' in-place restarts in this gang (0: none)
    progress: dict[str, Any]  # step, checkpointSaveSeconds, updateTime
    train_started: datetime | None = None  # the trainer's train phase began


def _seconds(raw: Any) -> float:
    """A stored duration; anything else (hostile, missing, negative) is 0."""
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not raw >= 0:
        return 0.0
    return float(raw)


def _step(raw: Any) -> int | None:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        return None
    return raw


def ending(previous: Any) -> bool:
    """The stored account's gang ended and waits for its master's last save."""
    gang = previous.get("gang") if isinstance(previous, dict) else None
    return isinstance(gang, dict) and gang.get("ending") is True


def fresh(start: datetime, checkpoint_step: int | None) -> dict[str, Any]:
    """An empty account starting at ``start``."""
    when = timestamp(start)
    account: dict[str, Any] = {"since": when, "until": when, "wallSeconds": 0}
    account |= dict.fromkeys(PHASE_BUCKETS + RUNNING_PARTS, 0)
    account["gang"] = _gang(checkpoint_step, 0.0)
    return account


def _gang(checkpoint_step: int | None, checkpoint_seconds_before: float) -> dict[str, Any]:
    return {
        "inPlaceRound": 0,  # a new gang's launchers count from 0
        "startStep": checkpoint_step or 0,
        "runningSeconds": 0,
        "checkpointSecondsBefore": _round(checkpoint_seconds_before),
    }


def _round(seconds: float) -> float | int:
    rounded = round(seconds, 3)
    return int(rounded) if rounded == int(rounded) else rounded


def _readable(previous: Any) -> bool:
    """A stored account this pass can add to (else it starts afresh, never crashes)."""
    return (
        isinstance(previous, dict)
        and parse_time(previous.get("since")) is not None
        and parse_time(previous.get("until")) is not None
    )


def recomputed_seconds(
    gang: dict[str, Any], progress: dict[str, Any] | None, checkpoint_step: int | None
) -> float:
    """Running time a gang that just ended spent on steps after the last checkpoint."""
    running = _seconds(gang.get("runningSeconds"))
    start = _step(gang.get("startStep")) or 0
    last_seen = _step((progress or {}).get("step"))
    if running <= 0 or last_seen is None or last_seen <= start:
        return 0.0
    kept = max(start, checkpoint_step or 0)
    lost_steps = max(0, last_seen - kept)
    training = max(0.0, running - _seconds((progress or {}).get("checkpointSaveSeconds")))
    return min(running, training * lost_steps / (last_seen - start))


def account(
    previous: Any,
    *,
    phase_before: str | None,
    phase_now: str | None,
    gang_ended: bool,
    holding: bool = False,
    shown: ShownRound | None = None,
    progress: dict[str, Any] | None,
    checkpoint_step: int | None,
    now: datetime,
    created: datetime | None,
    status_changed: bool,
) -> dict[str, Any] | None:
    """The account after this pass; ``previous`` itself when there is nothing to write.

    ``gang_ended`` settles the gang that ended (its lost time is counted);
    ``holding`` marks it ending instead: its master still runs, and the save it
    may make decides what was lost, so settling waits for it.
    ``shown`` is the scrape this pass's status shows: a later in-place round than
    the account's settles the one it counted (the module docstring).
    ``progress`` is this pass's, before any reset (its checkpointSaveSeconds
    is the gang's, its step the gang's last seen); ``checkpoint_step`` the
    newest complete checkpoint; ``created`` the job's creationTimestamp (a
    job's first pass counts from it; a job found mid-life counts from now).
    """
    if phase_before in FINISHED:
        return previous if isinstance(previous, dict) else None
    now = now.replace(microsecond=0)
    if not _readable(previous):
        start = created if phase_before is None and created is not None else now
        previous = fresh(min(start, now), checkpoint_step)
    until = parse_time(previous["until"])
    assert until is not None
    now = max(now, until)  # a clock behind the last writer's adds nothing (and never subtracts)
    elapsed = (now - until).total_seconds()
    in_place = not ending(previous) and _round_ended(previous.get("gang"), shown)
    due = (
        gang_ended
        or in_place
        or (holding and not ending(previous))
        or status_changed
        or phase_now != phase_before
        or phase_now in FINISHED
        or elapsed >= FLUSH_SECONDS
    )
    if not due:
        return previous
    updated = _advanced(previous, phase_before, elapsed, now)
    gang = updated["gang"]
    if holding:
        gang["ending"] = True
    resumed = 0.0
    if in_place:
        assert shown is not None
        resumed = _restarting_in_place(updated, shown, now)
        progress = {  # the round that ended, as its last scrape showed it
            "step": gang.get("lastStep"),
            "checkpointSaveSeconds": gang.get("lastSaveSeconds"),
        }
    saving_now = min(
        _seconds((progress or {}).get("checkpointSaveSeconds")), _seconds(gang["runningSeconds"])
    )
    if gang_ended or in_place:
        updated["recomputedSeconds"] = _round(
            _seconds(updated.get("recomputedSeconds"))
            + recomputed_seconds(gang, progress, checkpoint_step)
        )
        before = _seconds(gang.get("checkpointSecondsBefore")) + saving_now
        updated["gang"] = gang = _gang(checkpoint_step, before)
        if in_place:  # the new round has trained since it resumed
            gang["runningSeconds"] = _round(resumed)
        saving_now = 0.0
    if shown is not None and not gang_ended and not gang.get("ending"):
        _remember_shown(gang, shown)
    updated["checkpointSeconds"] = _round(
        _seconds(gang.get("checkpointSecondsBefore")) + saving_now
    )
    running = _seconds(updated["runningSeconds"])
    lost = _seconds(updated["recomputedSeconds"]) + _seconds(updated["checkpointSeconds"])
    updated["productiveSeconds"] = _round(max(0.0, running - lost))
    return updated


def _round_ended(stored: Any, shown: ShownRound | None) -> bool:
    """The scrape shown comes from a later in-place round than the account counts."""
    if shown is None or not isinstance(stored, dict):
        return False
    counted = _step(stored.get("inPlaceRound"))
    # An account from before rounds were counted adopts the shown one, settling nothing.
    return counted is not None and shown.round > counted


def _restarting_in_place(updated: dict[str, Any], shown: ShownRound, now: datetime) -> float:
    """Moves the restart's seconds (the old round's last step until the new
    round's training start) from running to restarting, and leaves the gang's
    running time the old round's alone (it is settled next); the new round's
    running seconds since its start. Never more than was counted as running."""
    gang = updated["gang"]
    last_step_at = parse_time(gang.get("lastStepTime"))
    if last_step_at is None:  # the old round never showed a step: nothing to split
        return 0.0
    resumed_at = shown.train_started or now
    resumed_at = max(last_step_at, min(now, resumed_at))
    running = _seconds(gang["runningSeconds"])
    moved = min((resumed_at - last_step_at).total_seconds(), running)
    resumed = min((now - resumed_at).total_seconds(), running - moved)
    gang["runningSeconds"] = _round(max(0.0, running - moved - resumed))
    updated["runningSeconds"] = _round(_seconds(updated["runningSeconds"]) - moved)
    updated["restartingSeconds"] = _round(_seconds(updated["restartingSeconds"]) + moved)
    return resumed


def _remember_shown(gang: dict[str, Any], shown: ShownRound) -> None:
    """The round this account counts, and its last step as the scrape shows it."""
    gang["inPlaceRound"] = max(shown.round, _step(gang.get("inPlaceRound")) or 0)
    step = _step(shown.progress.get("step"))
    taken = parse_time(shown.progress.get("updateTime"))
    if step is None or taken is None:
        return
    gang["lastStep"] = step
    gang["lastStepTime"] = timestamp(taken)
    gang["lastSaveSeconds"] = _round(_seconds(shown.progress.get("checkpointSaveSeconds")))


def _advanced(
    previous: dict[str, Any], phase: str | None, elapsed: float, now: datetime
) -> dict[str, Any]:
    """``previous`` with ``elapsed`` seconds added to ``phase``'s bucket, until now."""
    updated = {key: previous.get(key, 0) for key in PHASE_BUCKETS + RUNNING_PARTS}
    updated |= {"since": previous.get("since"), "until": timestamp(now)}
    bucket = BUCKET_OF_PHASE.get(phase or "", QUEUED)
    updated[bucket] = _round(_seconds(previous.get(bucket)) + elapsed)
    stored = previous.get("gang")
    known: dict[str, Any] = stored if isinstance(stored, dict) else {}
    gang = {
        "startStep": _step(known.get("startStep")) or 0,
        "runningSeconds": _seconds(known.get("runningSeconds")),
        "checkpointSecondsBefore": _seconds(known.get("checkpointSecondsBefore")),
    }
    if known.get("ending") is True:
        gang["ending"] = True
    for key in ("inPlaceRound", "lastStep", "lastStepTime", "lastSaveSeconds"):
        if key in known:
            gang[key] = known[key]
    if bucket == "runningSeconds":
        gang["runningSeconds"] = _round(gang["runningSeconds"] + elapsed)
    updated["gang"] = gang
    updated["wallSeconds"] = _round(sum(_seconds(updated[key]) for key in PHASE_BUCKETS))
    return updated


def goodput(account_: dict[str, Any] | None) -> float | None:
    """productive / (running + restarting); None before the job was allowed to run."""
    if not account_:
        return None
    allowed = _seconds(account_.get("runningSeconds")) + _seconds(account_.get("restartingSeconds"))
    if allowed <= 0:
        return None
    return round(min(1.0, _seconds(account_.get("productiveSeconds")) / allowed), 4)
