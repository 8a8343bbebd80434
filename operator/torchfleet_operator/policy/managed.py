"""spec.managedBy (KEP-4368's field, as a Job and a JobSet have it): whether
this operator runs the job at all. Pure.

A job another controller runs (Kueue's MultiKueue, or any other) is left
alone: no pods, Services, claims or PodGroups, and no status write, since the
other controller owns the status (MultiKueue mirrors a worker cluster's there)
and two writers would fight over it. Nothing is requeued either: the field is
immutable, so no later pass can find the job turned into this operator's.
Who runs it shows in ``kubectl get tj -o wide`` (the Managed-By column) and
in one event per job.
"""

from __future__ import annotations

from typing import Any

from torchfleet_operator.api import constants as c
from torchfleet_operator.api import reasons as r
from torchfleet_operator.planning import EventSpec, Plan

THIS_OPERATOR = ("", c.MANAGED_BY_OPERATOR)


def manager_elsewhere(spec: Any) -> str | None:
    """The controller ``spec.managedBy`` names when it is not this operator;
    None when this operator runs the job (unset, empty or its own value).

    Read from the raw spec, before it is parsed: a job another controller runs
    gets no status from this operator, not even for a spec it cannot parse.
    """
    value = spec.get("managedBy") if isinstance(spec, dict) else None
    if not isinstance(value, str) or value in THIS_OPERATOR:
        return None
    return value


def left_alone(manager: str) -> Plan:
    """The pass of a job ``manager`` runs: nothing to create, delete or write,
    nothing requeued; one event naming the manager, posted once per job."""
    if manager == c.MANAGED_BY_MULTIKUEUE:
        who = "Kueue's MultiKueue runs it on a worker cluster and mirrors its status here"
    else:
        who = f"{manager} runs it and owns its status"
    message = (
        f"spec.managedBy is {manager}: {who}; this operator creates no pods, Services, "
        "claims or PodGroups for it and never writes its status"
    )
    return Plan(
        managed_by=manager,
        events=[EventSpec("Normal", r.EVENT_MANAGED_ELSEWHERE, message, once=True)],
    )
