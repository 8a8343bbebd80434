"""The status merge patch removes what a pass dropped and keeps everything else."""

from __future__ import annotations

import pytest

from torchfleet_operator.status.patch import with_removals


def merge(target, patch):
    """RFC 7386 applied, as the API server does for application/merge-patch+json."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge(result.get(key), value)
    return result


RUNNING = {
    "phase": "Running",
    "progress": {"step": 90, "totalSteps": 100, "etaSeconds": 12, "loss": 1.5},
    "lastCheckpoint": {"step": 80},
    "conditions": [{"type": "Running", "status": "True"}],
}


@pytest.mark.parametrize(
    "old, new",
    [
        pytest.param(
            RUNNING,
            {
                "phase": "Succeeded",
                "progress": {"step": 100, "totalSteps": 100, "loss": 1.4},
                "lastCheckpoint": {"step": 100},
                "conditions": [{"type": "Succeeded", "status": "True"}],
            },
            id="eta dropped on completion",
        ),
        pytest.param(RUNNING, {"phase": "Restarting", "conditions": []}, id="whole parts dropped"),
        pytest.param({}, RUNNING, id="first write"),
        pytest.param(RUNNING, RUNNING, id="unchanged"),
        pytest.param({"progress": 5}, {"progress": {"step": 1}}, id="a scalar became an object"),
    ],
)
def test_the_stored_status_becomes_exactly_the_new_one(old, new):
    assert merge(old, with_removals(old, new)) == new


def test_nothing_is_nulled_that_the_new_status_keeps():
    patch = with_removals(RUNNING, {**RUNNING, "phase": "Succeeded"})
    assert patch == {**RUNNING, "phase": "Succeeded"}  # the full status, no nulls
