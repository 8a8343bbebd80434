"""The status write's body: the new status, plus a null for every key it dropped.

The one status write per pass is a JSON merge patch (RFC 7386), which never
removes what it does not mention: a key the pass no longer sets (progress's
etaSeconds once the job completed, lastCheckpoint after a fresh start) would
stay in the stored status for ever. A null removes it. Lists are replaced
whole by a merge patch, so only objects are compared key by key.
"""

from __future__ import annotations

from typing import Any


def with_removals(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``new`` as a merge patch over ``old``: what ``old`` has and ``new`` lacks is null."""
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            patch[key] = with_removals(before, value)
        else:
            patch[key] = value
    return patch
