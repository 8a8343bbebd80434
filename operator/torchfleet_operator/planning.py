"""One planning pass: its state (``Pass``) and its outcome (``Plan``). Pure.

``reconcile.plan`` opens a Pass for one job and hands it to the policies
(``policy/*.py``), each of which writes its whole part of the decision into
it: the status fields and conditions it owns, the children to create or
delete, the events to post and when to look again. ``Pass.finalize`` closes
the pass: it stamps observedGeneration, closes the time accounting and turns
a phase change into its event.

Phase changes go through ``Pass.set_phase`` and conditions through
``set_condition``/``clear_condition``, so that every status change a policy
makes goes through one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from torchfleet_operator.api import constants as c
from torchfleet_operator.api import reasons as r
from torchfleet_operator.build.names import MASTER_ROLE
from torchfleet_operator.config import OperatorConfig
from torchfleet_operator.observed import Observed, ObservedPod, parse_time, timestamp
from torchfleet_operator.status import conditions as cond
from torchfleet_operator.status import goodput, restarts
from torchfleet_operator.status import progress as progress_status
from torchfleet_trainer import contract

FINISHED = (c.PHASE_SUCCEEDED, c.PHASE_FAILED)
# Status keys the time accounting writes.
TIME_ACCOUNTING, ACCOUNTING_KEYS = goodput.TIME_ACCOUNTING, goodput.STATUS_KEYS


@dataclass(frozen=True)
class ChildRef:
    kind: str
    name: str
    uid: str | None = None
    grace_period_seconds: int | None = None


@dataclass(frozen=True)
class EventSpec:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class WorkloadPatch:
    """A write to the job's Kueue Workload: a server-side apply of its status
    under ``field_manager``, or (field_manager None) a merge patch of the object,
    or (``delete_uid``) its deletion, only of that incarnation."""

    name: str
    body: dict[str, Any]
    field_manager: str | None = None
    delete_uid: str | None = None


@dataclass
class Plan:
    create: list[dict[str, Any]] = field(default_factory=list)
    # Pods the API server checks (server-side dry run) before any pod of a new
    # gang is created: what the CRD schema cannot (a mount naming no volume).
    dry_run: list[dict[str, Any]] = field(default_factory=list)
    delete: list[ChildRef] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[EventSpec] = field(default_factory=list)
    delete_job: bool = False
    requeue_after: float | None = None  # seconds until a time-based decision is due
    gang_restart: str | None = None  # reason, when this pass starts a restart
    workload_patches: list[WorkloadPatch] = field(default_factory=list)  # Kueue
    disruption: str | None = None  # reason, when that restart is a disruption (not counted)
    # Reasons of the elastic workers this pass replaces alone (one per pod).
    worker_replacements: list[str] = field(default_factory=list)
    # Reasons of the in-place restarts this pass learned of (one per restart).
    in_place_reasons: list[str] = field(default_factory=list)

    def wake_in(self, seconds: float | None) -> None:
        if seconds is None:
            return
        seconds = max(seconds, 0.0)
        self.requeue_after = (
            seconds if self.requeue_after is None else min(self.requeue_after, seconds)
        )


def _without(status: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: value for key, value in status.items() if key not in keys}


def _gang_ended(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """This pass ends the gang: a restart, or a running gang suspended or evicted."""
    if restarts.gang(new) > restarts.gang(old):
        return True
    stopped = (c.PHASE_PENDING, c.PHASE_SUSPENDED, c.PHASE_RESTARTING)
    return old.get("phase") == c.PHASE_RUNNING and new.get("phase") in stopped


class Pass:
    """The state of one planning pass; the policies write their decisions into it."""

    def __init__(
        self,
        body: dict[str, Any],
        status: dict[str, Any],
        observed: Observed,
        now: datetime,
        config: OperatorConfig,
    ) -> None:
        meta = body["metadata"]
        self.name: str = meta["name"]
        self.namespace: str = meta["namespace"]
        self.uid: str = meta.get("uid", "")
        self.generation = meta.get("generation")
        self.labels: dict[str, str] = dict(meta.get("labels") or {})
        created = meta.get("creationTimestamp")
        self.created = parse_time(created)
        self.old_status = status
        self.status: dict[str, Any] = dict(status)
        self.observed = observed
        self.now = now
        self.stamp = timestamp(now)
        self.config = config
        self.plan = Plan()

    # ---- status ----

    @property
    def phase(self) -> str | None:
        phase = self.status.get("phase")
        return phase if isinstance(phase, str) else None

    def set_phase(self, phase: str) -> None:
        """The one place a pass changes the job's phase."""
        self.status["phase"] = phase

    def condition(self, type_: str) -> dict[str, Any] | None:
        return cond.find(self.status.get("conditions"), type_)

    def is_true(self, type_: str) -> bool:
        return cond.is_true(self.status.get("conditions"), type_)

    def set_condition(self, type_: str, value: bool, reason: str, message: str) -> None:
        self.status["conditions"] = cond.set_condition(
            self.status.get("conditions"), type_, value, reason, message, self.stamp
        )

    def clear_condition(self, type_: str, reason: str, message: str) -> None:
        """``type_`` False (when it was True), with what is true now."""
        self.status["conditions"] = cond.clear(
            self.status.get("conditions"), type_, reason, message, self.stamp
        )

    def finish(self, phase: str, reason: str, message: str) -> None:
        self.set_phase(phase)
        self.status.setdefault("completionTime", self.stamp)
        self.set_condition(phase, True, reason, message)
        for other in (r.CONDITION_RUNNING, r.CONDITION_RESTARTING):
            self.clear_condition(other, reason, f"the job {phase}: {message}")

    def previous_size(self) -> int | None:
        """The desired size the last written status recorded (elastic jobs)."""
        shown = self.old_status.get("elastic")
        size = shown.get("desiredNodes") if isinstance(shown, dict) else None
        return size if isinstance(size, int) and not isinstance(size, bool) else None

    # ---- children and events ----

    def delete_pods(self, pods: list[ObservedPod]) -> None:
        for pod in pods:
            if not pod.deleting:
                # Finished pods hold nothing: drop them at once (not one whose
                # sidecars still run: they get their grace period).
                grace = 0 if pod.finished and not pod.sidecars_running else None
                self.plan.delete.append(ChildRef("Pod", pod.name, pod.uid, grace))

    def event(self, type_: str, reason: str, message: str) -> None:
        self.plan.events.append(EventSpec(type_, reason, message))

    # ---- closing the pass ----

    def finalize(self) -> Plan:
        if self.generation is not None:
            self.status["observedGeneration"] = self.generation
        restarts.record_total(self.status)
        self._account()
        self._lifecycle_events()
        self.plan.status = self.status
        return self.plan

    def _lifecycle_events(self) -> None:
        """One event per transition users look for: each phase change, each gang
        restart (even one while the job was already Restarting), and a gang
        that runs again after an earlier one ended (from which checkpoint)."""
        old_phase = self.old_status.get("phase")
        new_phase = self.phase
        if self.plan.gang_restart:
            # Reason: the failure's own (PodFailed, NodeLost, ...); message: which restart.
            restarting = self.condition(r.CONDITION_RESTARTING) or {}
            message = restarting.get("message") or "the gang restarts"
            self.event("Warning", self.plan.gang_restart, message)
        elif new_phase != old_phase and new_phase:
            self.plan.events.append(self._phase_event(new_phase))
        if new_phase == c.PHASE_RUNNING and old_phase != c.PHASE_RUNNING:
            resumed = self._resumed_message()
            if resumed is not None:
                self.event("Normal", r.EVENT_GANG_RESUMED, resumed)

    def _resumed_message(self) -> str | None:
        """What a gang that runs after an earlier one ended starts from; None for
        the first gang of a job that has no checkpoint yet."""
        gang = restarts.gang(self.status)
        step = (self.status.get("lastCheckpoint") or {}).get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            return f"gang {gang} is running; it resumes from the checkpoint of step {step}"
        if gang > 0:
            return (
                f"gang {gang} is running; no checkpoint was seen, so it starts from the beginning"
            )
        return None

    def _account(self) -> None:
        """Ends a gang's progress and time accounting when this pass ends the gang,
        and advances the time accounting (status/goodput.py)."""
        old, new = self.old_status, self.status
        ended = _gang_ended(old, new)
        ending = ended or goodput.ending(old.get(TIME_ACCOUNTING))
        holding = ending and new.get("phase") not in FINISHED and self._ended_master_runs()
        progress = new.get("progress") if isinstance(new.get("progress"), dict) else None
        checkpoint = (new.get("lastCheckpoint") or {}).get("step")
        checkpoint = checkpoint if isinstance(checkpoint, int) else None
        if ending:
            # The next gang resumes from the newest save: show that step once
            # the old master (which may still save) is gone, not the old gang's
            # last until the new master is scraped.
            if holding:
                shown = progress_status.held(progress, self.stamp) if ended else progress
            else:
                shown = progress_status.resumed(progress, checkpoint, self.stamp)
            if shown is None:
                new.pop("progress", None)
            else:
                new["progress"] = shown
        accounted = goodput.account(
            old.get(TIME_ACCOUNTING),
            phase_before=old.get("phase"),
            phase_now=new.get("phase"),
            gang_ended=ending and not holding,
            holding=holding,
            shown=None if ending else self._shown_round(),
            progress=progress,
            checkpoint_step=checkpoint,
            now=self.now,
            created=self.created,
            status_changed=_without(new, ACCOUNTING_KEYS) != _without(old, ACCOUNTING_KEYS),
        )
        if accounted is None:
            return
        new[TIME_ACCOUNTING] = accounted
        fraction = goodput.goodput(accounted)
        if fraction is None:
            new.pop("goodput", None)
        else:
            new["goodput"] = fraction

    def _shown_round(self) -> goodput.ShownRound | None:
        """The scrape status.progress shows after this pass, with the in-place
        round it comes from and its train-phase start; None without one."""
        scraped = self.observed.progress
        if self.phase != c.PHASE_RUNNING or not isinstance(scraped, dict):
            return None
        if scraped != self.status.get("progress"):  # not this gang's, or not accepted
            return None
        health = self.observed.health
        round_ = (health.restarts_in_gang if health is not None else None) or 0
        started = None
        if health is not None and health.phase == contract.PHASE_TRAIN:
            started = _unix_time(health.phase_started)
        return goodput.ShownRound(round_, scraped, started)

    def _ended_master_runs(self) -> bool:
        """A master of a gang that ended still runs: preempted, its trainer saves
        in the grace period, and that save is the step the next gang resumes from."""
        restart = restarts.gang(self.status)
        gang_runs = self.status.get("phase") == c.PHASE_RUNNING
        ended = [p for p in self.observed.pods if p.restart < restart or not gang_runs]
        return any(pod.role == MASTER_ROLE and not pod.finished for pod in ended)

    def _phase_event(self, phase: str) -> EventSpec:
        found = self.condition(phase)
        message = (found or {}).get("message") or f"TrainingJob is {phase}"
        reason = (found or {}).get("reason") or phase
        warning = phase in (c.PHASE_FAILED, c.PHASE_RESTARTING)
        return EventSpec("Warning" if warning else "Normal", reason, message)


def _unix_time(seconds: float | None) -> datetime | None:
    """A pod's Unix timestamp as a datetime; None for one no clock can show."""
    if seconds is None:
        return None
    try:
        return datetime.fromtimestamp(seconds, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None
