"""Every status a planning pass writes in these tests is exactly what the typed
status model (api/v1alpha1.py TrainingJobStatus, the CRD's status schema)
reads and writes back: no key the API server would prune, no value of another
type or out of its bounds (a field set on the model is not validated there),
nothing the model would change. The fuzz test's garbage included: the pass
reads the status into the model, leaving out what the model refuses."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from torchfleet_operator.planning import Pass, Plan

from .builders import status_wire_problem


@pytest.fixture(autouse=True)
def _statuses_are_typed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    finalize = Pass.finalize

    def checked(step: Pass) -> Plan:
        decided = finalize(step)
        problem = status_wire_problem(decided.status)
        assert problem is None, f"the pass of {step.name} wrote a status that {problem}"
        return decided

    monkeypatch.setattr(Pass, "finalize", checked)
    yield
