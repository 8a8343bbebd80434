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

from pydantic import BaseModel

from torchfleet_contract import pod as contract
from torchfleet_operator.api import constants as c
from torchfleet_operator.api import reasons as r
from torchfleet_operator.api.parse import read_status, status_wire, wire
from torchfleet_operator.api.v1alpha1 import (
    Condition,
    JobPhase,
    ProgressStatus,
    TimeAccounting,
    TrainingJobStatus,
)
from torchfleet_operator.config import OperatorConfig
from torchfleet_operator.desired.names import MASTER_ROLE
from torchfleet_operator.observed import Observed, ObservedPod, parse_time, timestamp
from torchfleet_operator.status import conditions as cond
from torchfleet_operator.status import goodput, restarts
from torchfleet_operator.status import progress as progress_status

FINISHED = (c.PHASE_SUCCEEDED, c.PHASE_FAILED)
# Status keys the time accounting writes.
TIME_ACCOUNTING, ACCOUNTING_KEYS = goodput.TIME_ACCOUNTING, goodput.STATUS_KEYS


@dataclass(frozen=True)
class ChildRef:
    kind: str
    name: str
    uid: str | None = None
    grace_period_seconds: int | None = None
    api_version: str = "v1"


@dataclass(frozen=True)
class EventSpec:
    type: str  # Normal | Warning
    reason: str
    message: str
    # Once per job: its name comes from the job's uid and the reason, so the API
    # server refuses a second (a restarted operator, another replica). For an
    # event no status transition of this operator's marks (policy/managed.py).
    once: bool = False
    # With ``once``: what tells this event from the job's others of the same
    # reason (one per MultiKueue dispatch); part of the event's name, so a DNS
    # subdomain's characters.
    key: str = ""


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
    # spec.managedBy names this other controller: the pass executes nothing and
    # writes no status (policy/managed.py); only its events are posted.
    managed_by: str | None = None

    def wake_in(self, seconds: float | None) -> None:
        if seconds is None:
            return
        seconds = max(seconds, 0.0)
        self.requeue_after = (
            seconds if self.requeue_after is None else min(self.requeue_after, seconds)
        )


def find_condition(status: TrainingJobStatus, type_: str) -> Condition | None:
    return next((x for x in status.conditions or () if x.type == type_), None)


def _without_accounting(status: TrainingJobStatus) -> dict[str, Any]:
    return {k: v for k, v in status_wire(status).items() if k not in ACCOUNTING_KEYS}


def _gang_ended(old: TrainingJobStatus, new: TrainingJobStatus) -> bool:
    """This pass ends the gang: a restart, or a running gang suspended or evicted."""
    if restarts.gang(new) > restarts.gang(old):
        return True
    stopped = (c.PHASE_PENDING, c.PHASE_SUSPENDED, c.PHASE_RESTARTING)
    return old.phase == c.PHASE_RUNNING and new.phase in stopped


class Pass:
    """The state of one planning pass; the policies write their decisions into it.

    The stored status is read once, into the typed model (``old_status``, as
    stored; ``status``, what this pass decides), and written once, by
    ``finalize``, as ``plan.status``."""

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
        self.old_status = read_status(status)
        self.status = self.old_status.model_copy(deep=True)
        self.observed = observed
        self.now = now
        self.stamp = timestamp(now)
        # Now as a status holds it: whole seconds, UTC.
        self.stamp_time = datetime.fromisoformat(self.stamp)
        self.config = config
        self.plan = Plan()

    # ---- status ----

    @property
    def phase(self) -> JobPhase | None:
        return self.status.phase

    def set_phase(self, phase: JobPhase) -> None:
        """The one place a pass changes the job's phase."""
        self.status.phase = phase

    def condition(self, type_: str) -> Condition | None:
        return find_condition(self.status, type_)

    def is_true(self, type_: str) -> bool:
        found = self.condition(type_)
        return found is not None and found.status == "True"

    def wire_conditions(self) -> cond.Conditions:
        """The conditions as the plain data status/conditions.py computes on."""
        return [wire(x) for x in self.status.conditions or ()]

    def set_wire_conditions(self, conditions: cond.Conditions) -> None:
        self.status.conditions = [Condition.model_validate(x) for x in conditions]

    def set_condition(self, type_: str, value: bool, reason: str, message: str) -> None:
        self.set_wire_conditions(
            cond.set_condition(self.wire_conditions(), type_, value, reason, message, self.stamp)
        )

    def clear_condition(self, type_: str, reason: str, message: str) -> None:
        """``type_`` False (when it was True), with what is true now."""
        self.set_wire_conditions(
            cond.clear(self.wire_conditions(), type_, reason, message, self.stamp)
        )

    def drop_condition(self, type_: str) -> None:
        """``type_`` gone, so that setting it again starts a fresh transition time."""
        self.status.conditions = [x for x in self.status.conditions or () if x.type != type_]

    def finish(self, phase: JobPhase, reason: str, message: str) -> None:
        self.set_phase(phase)
        if self.status.completion_time is None:
            self.status.completion_time = self.stamp_time
        self.set_condition(phase, True, reason, message)
        for other in (r.CONDITION_RUNNING, r.CONDITION_RESTARTING):
            self.clear_condition(other, reason, f"the job {phase}: {message}")

    def previous_size(self) -> int | None:
        """The desired size the last written status recorded (elastic jobs)."""
        shown = self.old_status.elastic
        if shown is None or "desired_nodes" not in shown.model_fields_set:
            return None
        return shown.desired_nodes

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
        if isinstance(self.generation, int) and self.generation >= 0:
            self.status.observed_generation = self.generation
        restarts.record_total(self.status)
        self._account()
        self._lifecycle_events()
        self.plan.status = status_wire(self.status)
        return self.plan

    def _lifecycle_events(self) -> None:
        """One event per transition users look for: each phase change, each gang
        restart (even one while the job was already Restarting), and a gang
        that runs again after an earlier one ended (from which checkpoint)."""
        old_phase = self.old_status.phase
        new_phase = self.phase
        if self.plan.gang_restart:
            # Reason: the failure's own (PodFailed, NodeLost, ...); message: which restart.
            restarting = self.condition(r.CONDITION_RESTARTING)
            message = (restarting.message if restarting else None) or "the gang restarts"
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
        step = self.status.last_checkpoint.step if self.status.last_checkpoint else None
        if step is not None:
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
        ending = ended or goodput.ending(_wire_or_none(old.time_accounting))
        holding = ending and new.phase not in FINISHED and self._ended_master_runs()
        progress = _wire_or_none(new.progress)
        checkpoint = new.last_checkpoint.step if new.last_checkpoint is not None else None
        if ending:
            # The next gang resumes from the newest save: show that step once
            # the old master (which may still save) is gone, not the old gang's
            # last until the new master is scraped.
            if holding:
                shown = progress_status.held(progress, self.stamp) if ended else progress
            else:
                shown = progress_status.resumed(progress, checkpoint, self.stamp)
            new.progress = None if shown is None else ProgressStatus.model_validate(shown)
        accounted = goodput.account(
            _wire_or_none(old.time_accounting),
            phase_before=old.phase,
            phase_now=new.phase,
            gang_ended=ending and not holding,
            holding=holding,
            shown=None if ending else self._shown_round(),
            progress=progress,
            checkpoint_step=checkpoint,
            now=self.now,
            created=self.created,
            status_changed=_without_accounting(new) != _without_accounting(old),
        )
        if accounted is None:
            return
        new.time_accounting = TimeAccounting.model_validate(accounted)
        new.goodput = goodput.goodput(accounted)

    def _shown_round(self) -> goodput.ShownRound | None:
        """The scrape status.progress shows after this pass, with the in-place
        round it comes from and its train-phase start; None without one."""
        scraped = self.observed.progress
        if self.phase != c.PHASE_RUNNING or not isinstance(scraped, dict):
            return None
        shown = self.status.progress
        if shown is None or scraped != wire(shown):  # not this gang's, or not accepted
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
        gang_runs = self.status.phase == c.PHASE_RUNNING
        ended = [p for p in self.observed.pods if p.restart < restart or not gang_runs]
        return any(pod.role == MASTER_ROLE and not pod.finished for pod in ended)

    def _phase_event(self, phase: str) -> EventSpec:
        found = self.condition(phase)
        message = (found.message if found else None) or f"TrainingJob is {phase}"
        reason = (found.reason if found else None) or phase
        warning = phase in (c.PHASE_FAILED, c.PHASE_RESTARTING)
        return EventSpec("Warning" if warning else "Normal", reason, message)


def _wire_or_none(model: BaseModel | None) -> dict[str, Any] | None:
    return wire(model) if model is not None else None


def _unix_time(seconds: float | None) -> datetime | None:
    """A pod's Unix timestamp as a datetime; None for one no clock can show."""
    if seconds is None:
        return None
    try:
        return datetime.fromtimestamp(seconds, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None
