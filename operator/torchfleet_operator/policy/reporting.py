"""What a gang reports into the status on every pass: its pod counts, the
latest scrape of the master's /metrics (status.progress) and the newest
checkpoint (status.lastCheckpoint); and as the job succeeds or fails, the
trainer's final report in their place. Pure: the scrape and the report arrive parsed
(status/progress.py, observed.py) in the pass's observations."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from torchfleet_operator.api import constants as c
from torchfleet_operator.api import reasons as r
from torchfleet_operator.api.parse import wire
from torchfleet_operator.api.v1alpha1 import CheckpointStatus, ProgressStatus, ReplicaStatuses
from torchfleet_operator.desired.names import MASTER_ROLE
from torchfleet_operator.observed import ObservedPod, parse_time, timestamp
from torchfleet_operator.planning import Pass
from torchfleet_operator.status import progress as progress_status
from torchfleet_operator.status.counts import nodes_ready, replica_statuses


def count(step: Pass, gang: list[ObservedPod], nodes: int) -> None:
    step.status.replica_statuses = ReplicaStatuses.model_validate(replica_statuses(gang))
    step.status.nodes_ready = nodes_ready(gang, nodes)


def record_progress(step: Pass) -> None:
    """The latest scrape into status.progress, unless it is the old gang's."""
    observed = step.observed
    shown = _progress(step)
    running = step.condition(r.CONDITION_RUNNING)
    since = None
    if running is not None and running.status == "True" and running.last_transition_time:
        since = timestamp(running.last_transition_time)
    if (
        observed.progress is not None
        and step.old_status.phase == c.PHASE_RUNNING  # only a running gang is scraped
    ):
        if progress_status.is_current(observed.progress, shown, since):
            step.status.progress = ProgressStatus.model_validate(observed.progress)
        elif progress_status.waits_for_a_later_second(observed.progress, shown, step.now):
            step.plan.wake_in(1.0)  # by then the poller holds a scrape a second newer
    record_checkpoint(step)


def record_checkpoint(step: Pass) -> None:
    """status.lastCheckpoint: the newest save known. The master's /metrics shows
    one when it is scraped (dated then); a trainer that ends after that scrape
    reports its last save itself (dated when it saved: its final save, or the
    one it made in a preemption's grace period).
    Only a report newer than the one shown replaces it: the old gang's last
    scrape, which the poller still holds, never takes back a later save. The
    status keeps whole seconds, so two saves can share one: then the larger
    step is the later (a run only saves past the step it resumed from)."""
    observed = step.observed
    shown = step.status.last_checkpoint
    shown_step = shown.step if shown is not None else None
    shown_at = shown.time if shown is not None else None
    reports: list[tuple[datetime, int]] = []
    if observed.checkpoint_step is not None:
        scraped = parse_time((observed.progress or {}).get("updateTime"))
        reports.append((scraped or step.now, observed.checkpoint_step))
    if observed.saved_checkpoint is not None:
        reports.append((observed.saved_checkpoint.time, observed.saved_checkpoint.step))
    for when, number in sorted(reports):  # the newest last: it wins
        when = min(when.replace(microsecond=0), step.now)  # a pod's clock is not ours
        if number != shown_step and _newer(when, number, shown_at, shown_step):
            shown_step, shown_at = number, when
            step.status.last_checkpoint = CheckpointStatus(step=number, time=when.astimezone(UTC))


def _newer(when: datetime, number: int, shown_at: datetime | None, shown: int | None) -> bool:
    if shown_at is None or shown is None:
        return True
    return when > shown_at or (when == shown_at and number > shown)


def final_progress(step: Pass, gang: Iterable[ObservedPod]) -> None:
    """status.progress of a job that succeeded, in the write that says so: its
    master's final report (the last step, loss, validation loss and throughput,
    however soon after the last scrape the run ended); else, for an older
    trainer that wrote none, the last scrape completed (progress_complete)."""
    if not _from_report(step, gang):
        progress_complete(step)


def failed_progress(step: Pass, gang: Iterable[ObservedPod]) -> None:
    """status.progress of a job that failed, in the write that says so: its
    master's report of where the run stood as it failed; else (a trainer
    that wrote none, a pod lost before its program ended) the last scrape."""
    _from_report(step, gang)


def _from_report(step: Pass, gang: Iterable[ObservedPod]) -> bool:
    """status.progress from the master's final report; False without one."""
    report = next(
        (p.final_report for p in gang if p.role == MASTER_ROLE and p.final_report is not None),
        None,
    )
    if report is None:
        return False
    final = progress_status.final(report, _progress(step), step.now)
    step.status.progress = ProgressStatus.model_validate(final)
    return True


def progress_complete(step: Pass) -> None:
    """torchfleet-train exits 0 only after its last step (preempted, it exits
    143), so its success means every step ran, even when the last scrape of
    the master's /metrics came a few steps before the end."""
    progress = step.status.progress
    if progress is None or not progress.total_steps:
        return
    done = progress.model_copy(update={"step": progress.total_steps, "percent": 100})
    done.eta_seconds = None
    step.status.progress = done


def scrape_is_shown(step: Pass) -> bool:
    """The pass's scrape is the one status.progress shows: this gang's, accepted
    by record_progress. Whole, not by its time: two scrapes a second apart may
    carry the same stamp."""
    scraped = step.observed.progress
    return isinstance(scraped, dict) and scraped == _progress(step)


def _progress(step: Pass) -> dict[str, Any] | None:
    """status.progress as the plain data status/progress.py computes on."""
    return wire(step.status.progress) if step.status.progress is not None else None
