"""What a gang reports into the status on every pass: its pod counts, the
latest scrape of the master's /metrics (status.progress) and the newest
checkpoint (status.lastCheckpoint); and as the job succeeds, the trainer's
final report in their place. Pure: the scrape and the report arrive parsed
(status/progress.py, observed.py) in the pass's observations."""

from __future__ import annotations

from datetime import datetime

from torchfleet_operator.api import constants as c
from torchfleet_operator.api import reasons as r
from torchfleet_operator.build.names import MASTER_ROLE
from torchfleet_operator.observed import ObservedPod, parse_time, timestamp
from torchfleet_operator.planning import Pass
from torchfleet_operator.status import progress as progress_status
from torchfleet_operator.status.counts import nodes_ready, replica_statuses


def count(step: Pass, gang: list[ObservedPod], nodes: int) -> None:
    step.status["replicaStatuses"] = replica_statuses(gang)
    step.status["nodesReady"] = nodes_ready(gang, nodes)


def record_progress(step: Pass) -> None:
    """The latest scrape into status.progress, unless it is the old gang's."""
    observed = step.observed
    shown = step.status.get("progress")
    shown = shown if isinstance(shown, dict) else None
    running = step.condition(r.CONDITION_RUNNING) or {}
    since = running.get("lastTransitionTime") if running.get("status") == "True" else None
    if (
        observed.progress is not None
        and step.old_status.get("phase") == c.PHASE_RUNNING  # only a running gang is scraped
    ):
        if progress_status.is_current(observed.progress, shown, since):
            step.status["progress"] = observed.progress
        elif progress_status.waits_for_a_later_second(observed.progress, shown, step.now):
            step.plan.wake_in(1.0)  # by then the poller holds a scrape a second newer
    record_checkpoint(step)


def record_checkpoint(step: Pass) -> None:
    """status.lastCheckpoint: the newest save known. The master's /metrics shows
    one when it is scraped (dated then); a trainer that ends after that scrape
    reports its last save itself (dated when it saved: its final save, or the
    one it made in a preemption's grace period).
    Only a report newer than the one shown replaces it: the old gang's last
    scrape, which the poller still holds, never takes back a later save."""
    observed = step.observed
    shown = step.status.get("lastCheckpoint")
    shown = shown if isinstance(shown, dict) else {}
    shown_at = parse_time(shown.get("time"))
    reports: list[tuple[datetime, int]] = []
    if observed.checkpoint_step is not None:
        scraped = parse_time((observed.progress or {}).get("updateTime"))
        reports.append((scraped or step.now, observed.checkpoint_step))
    if observed.saved_checkpoint is not None:
        reports.append((observed.saved_checkpoint.time, observed.saved_checkpoint.step))
    for when, number in sorted(reports):  # the newest last: it wins
        when = min(when.replace(microsecond=0), step.now)  # a pod's clock is not ours
        if number != shown.get("step") and (shown_at is None or when > shown_at):
            shown = {"step": number, "time": timestamp(when)}
            shown_at = when
            step.status["lastCheckpoint"] = shown


def final_progress(step: Pass, gang: list[ObservedPod]) -> None:
    """status.progress of a job that succeeded, in the write that says so: its
    master's final report (the last step, loss, validation loss and throughput,
    however soon after the last scrape the run ended); else, for an older
    trainer that wrote none, the last scrape completed (progress_complete)."""
    report = next(
        (p.final_report for p in gang if p.role == MASTER_ROLE and p.final_report is not None),
        None,
    )
    if report is None:
        progress_complete(step)
        return
    shown = step.status.get("progress")
    step.status["progress"] = progress_status.final(
        report, shown if isinstance(shown, dict) else None, step.now
    )


def progress_complete(step: Pass) -> None:
    """torchfleet-train exits 0 only after its last step (preempted, it exits
    143), so its success means every step ran, even when the last scrape of
    the master's /metrics came a few steps before the end."""
    progress = step.status.get("progress")
    if not progress or not progress.get("totalSteps"):
        return
    done = {k: v for k, v in progress.items() if k != "etaSeconds"}
    step.status["progress"] = done | {"step": progress["totalSteps"], "percent": 100}


def scrape_is_shown(step: Pass) -> bool:
    """The pass's scrape is the one status.progress shows: this gang's, accepted
    by record_progress. Whole, not by its time: two scrapes a second apart may
    carry the same stamp."""
    scraped = step.observed.progress
    return isinstance(scraped, dict) and scraped == step.status.get("progress")
