"""Kubernetes-style conditions: one per type, transition time kept while unchanged."""

from __future__ import annotations

from typing import Any

Conditions = list[dict[str, Any]]


def find(conditions: Conditions | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions or () if c.get("type") == type_), None)


def is_true(conditions: Conditions | None, type_: str) -> bool:
    found = find(conditions, type_)
    return found is not None and found.get("status") == "True"


def set_condition(
    conditions: Conditions | None,
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: str,
) -> Conditions:
    """A new list with ``type_`` set; the transition time moves only when the status does."""
    wanted = "True" if status else "False"
    old = find(conditions, type_)
    since = old["lastTransitionTime"] if old and old.get("status") == wanted else now
    updated = {
        "type": type_,
        "status": wanted,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }
    others = [c for c in conditions or () if c.get("type") != type_]
    return sorted([*others, updated], key=lambda c: str(c.get("type")))


def clear(
    conditions: Conditions | None, type_: str, reason: str, message: str, now: str
) -> Conditions:
    """Sets ``type_`` False if it is True; an absent or False condition stays as it is.

    ``reason`` and ``message`` say what is true now: a condition that flips
    keeps nothing of what it said while it was True."""
    old = find(conditions, type_)
    if old is None or old.get("status") == "False":
        return list(conditions or ())
    return set_condition(conditions, type_, False, reason, message, now)
