"""Restart accounting, in one place: the gang's generation, the failures counted
toward a limit, the disruptions that are not, and the in-place restarts. Pure.

Who is at fault decides the accounting (DESIGN.md). The program's own failures
count toward ``runPolicy.backoffLimit`` (``status.countedRestarts``), whether
they restart the gang (policy/failure.py) or its processes in place
(policy/in_place.py). Disruptions (preemption, eviction, a lost node, a deleted
pod, a Kueue eviction, node health's Replace) are counted apart
(``status.disruptions``) and never toward the limit. Elastic worker
replacements and node health's Replace restarts keep their own counters and
budgets (``elastic.maxRestarts``, ``stragglers.maxReplacements``) and reach
them by the same rule, ``limit_reached``.

Every status field this module names is written here and nowhere else:
``restartCount`` (the gang's generation, also on its pods' restart label),
``countedRestarts``, ``disruptions``, ``inPlaceRestarts`` and ``restarts``.
The status arrives typed (api/parse.py ``read_status`` leaves out a field the
model refuses), so every count here is a whole number >= 0; ``count_of``
clamps the counts that policies still keep in plain data.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from torchfleet_operator.api.v1alpha1 import InPlaceRestartsStatus, TrainingJobStatus


def count_of(raw: Any) -> int:
    """A stored count: a whole number >= 0, else 0 (never a bool)."""
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0 else 0


def limit_reached(counted: int, limit: int) -> bool:
    """The one rule for every budget: ``limit`` counted failures are allowed, the
    next one is past it. ``counted`` includes the failure being judged."""
    return counted > limit


# ---- the gang's generation ----


def gang(status: TrainingJobStatus) -> int:
    """The current gang's generation (``restartCount``): gang restarts so far."""
    return status.restart_count


def adopt_gang(status: TrainingJobStatus, seen: int) -> int:
    """The generation is at least ``seen``, the newest a pod carries (a status
    write lost before its pods were created); returns it."""
    status.restart_count = max(gang(status), seen)
    return status.restart_count


def next_gang(status: TrainingJobStatus) -> int:
    """Starts the next gang (a gang restart); returns its generation."""
    status.restart_count = gang(status) + 1
    return status.restart_count


# ---- failures counted toward backoffLimit, and disruptions ----


def counted(status: TrainingJobStatus) -> int:
    """Failures counted toward backoffLimit (the program's own).

    Stored once known; a status written before the field existed derives it:
    every gang restart that was not a disruption. A Kueue eviction is a
    disruption that restarts nothing, so the derivation is clamped at 0.
    """
    if status.counted_restarts is not None:
        return status.counted_restarts
    return max(0, gang(status) - status.disruptions)


def count_failure(status: TrainingJobStatus, *, disruption: bool, failures: int = 1) -> int:
    """Records ``failures`` restarts for one cause: a disruption's apart, the
    program's toward backoffLimit. Returns the counted restarts after them.

    The counted figure is stored either way, before the disruptions move, so
    that a status that derived it (``counted``) keeps what it had."""
    after = counted(status) + (0 if disruption else failures)
    if disruption:
        status.disruptions += failures
    status.counted_restarts = after
    return after


# ---- restarts in place ----


def in_place_in_gang(status: TrainingJobStatus) -> int:
    """The current gang's in-place restarts (its launchers' round; 0 before any)."""
    shown = status.in_place_restarts
    if shown is None or shown.gang != gang(status):
        return 0
    return shown.in_gang


def in_place_total(status: TrainingJobStatus) -> int:
    """In-place restarts over every gang so far."""
    return status.in_place_restarts.total if status.in_place_restarts is not None else 0


def count_in_place(
    status: TrainingJobStatus, reported: int, reason: str | None, now: datetime
) -> int:
    """Records that the current gang's launchers report ``reported`` restarts in
    place (the last for ``reason``); returns how many of them are new, each
    counted toward backoffLimit. A count seen before is not counted again,
    whatever an operator restart or a late report repeats."""
    shown = (status.in_place_restarts or InPlaceRestartsStatus()).model_copy()
    if shown.gang != gang(status) or "gang" not in shown.model_fields_set:
        shown.gang, shown.in_gang = gang(status), 0  # a new gang's launchers count from 0
    added = max(0, reported - shown.in_gang)
    if added:
        shown.total += added
        shown.in_gang = reported
        shown.last_time = now
        if reason:
            shown.last_reason = reason
        count_failure(status, disruption=False, failures=added)
    if shown.total:
        status.in_place_restarts = shown
    return added


def total(status: TrainingJobStatus) -> int:
    """Gang restarts plus every in-place restart: kubectl's Restarts column."""
    return gang(status) + in_place_total(status)


def record_total(status: TrainingJobStatus) -> None:
    status.restarts = total(status)
