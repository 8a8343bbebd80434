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
The status is read back from the API server, so each reader clamps: a count
that is not a whole number >= 0 reads as 0.
"""

from __future__ import annotations

from typing import Any

RESTART_COUNT = "restartCount"
COUNTED_RESTARTS = "countedRestarts"
DISRUPTIONS = "disruptions"
IN_PLACE_RESTARTS = "inPlaceRestarts"
RESTARTS = "restarts"


def count_of(raw: Any) -> int:
    """A stored count: a whole number >= 0, else 0 (never a bool)."""
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0 else 0


def limit_reached(counted: int, limit: int) -> bool:
    """The one rule for every budget: ``limit`` counted failures are allowed, the
    next one is past it. ``counted`` includes the failure being judged."""
    return counted > limit


# ---- the gang's generation ----


def gang(status: dict[str, Any]) -> int:
    """The current gang's generation (``restartCount``): gang restarts so far."""
    return count_of(status.get(RESTART_COUNT))


def adopt_gang(status: dict[str, Any], seen: int) -> int:
    """The generation is at least ``seen``, the newest a pod carries (a status
    write lost before its pods were created); returns it."""
    current = max(gang(status), seen)
    status[RESTART_COUNT] = current
    return current


def next_gang(status: dict[str, Any]) -> int:
    """Starts the next gang (a gang restart); returns its generation."""
    status[RESTART_COUNT] = gang(status) + 1
    return gang(status)


# ---- failures counted toward backoffLimit, and disruptions ----


def disruptions(status: dict[str, Any]) -> int:
    """Times something other than the program stopped the gang."""
    return count_of(status.get(DISRUPTIONS))


def counted(status: dict[str, Any]) -> int:
    """Failures counted toward backoffLimit (the program's own).

    Stored once known; a status written before the field existed derives it:
    every gang restart that was not a disruption. A Kueue eviction is a
    disruption that restarts nothing, so the derivation is clamped at 0.
    """
    stored = status.get(COUNTED_RESTARTS)
    if isinstance(stored, int) and not isinstance(stored, bool) and stored >= 0:
        return stored
    return max(0, gang(status) - disruptions(status))


def count_failure(status: dict[str, Any], *, disruption: bool, failures: int = 1) -> int:
    """Records ``failures`` restarts for one cause: a disruption's apart, the
    program's toward backoffLimit. Returns the counted restarts after them.

    The counted figure is stored either way, before the disruptions move, so
    that a status that derived it (``counted``) keeps what it had."""
    after = counted(status) + (0 if disruption else failures)
    if disruption:
        status[DISRUPTIONS] = disruptions(status) + failures
    status[COUNTED_RESTARTS] = after
    return after


# ---- restarts in place ----


def in_place_in_gang(status: dict[str, Any]) -> int:
    """The current gang's in-place restarts (its launchers' round; 0 before any)."""
    shown = status.get(IN_PLACE_RESTARTS)
    if not isinstance(shown, dict) or shown.get("gang") != gang(status):
        return 0
    return count_of(shown.get("inGang"))


def in_place_total(status: dict[str, Any]) -> int:
    """In-place restarts over every gang so far."""
    shown = status.get(IN_PLACE_RESTARTS)
    return count_of(shown.get("total")) if isinstance(shown, dict) else 0


def count_in_place(status: dict[str, Any], reported: int, reason: str | None, stamp: str) -> int:
    """Records that the current gang's launchers report ``reported`` restarts in
    place (the last for ``reason``); returns how many of them are new, each
    counted toward backoffLimit. A count seen before is not counted again,
    whatever an operator restart or a late report repeats."""
    shown = status.get(IN_PLACE_RESTARTS)
    shown = dict(shown) if isinstance(shown, dict) else {}
    if shown.get("gang") != gang(status):  # a new gang's launchers count from 0
        shown |= {"gang": gang(status), "inGang": 0}
    added = max(0, reported - count_of(shown.get("inGang")))
    if added:
        shown |= {
            "total": count_of(shown.get("total")) + added,
            "inGang": reported,
            "lastTime": stamp,
            **({"lastReason": reason} if reason else {}),
        }
        count_failure(status, disruption=False, failures=added)
    if shown.get("total"):
        status[IN_PLACE_RESTARTS] = shown
    return added


def total(status: dict[str, Any]) -> int:
    """Gang restarts plus every in-place restart: kubectl's Restarts column."""
    return gang(status) + in_place_total(status)


def record_total(status: dict[str, Any]) -> None:
    status[RESTARTS] = total(status)
