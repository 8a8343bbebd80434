"""The ChildrenRejected condition: what the apiserver refused this pass. Pure.

The second half of a pass: once the executor ran the plan, its refusals are
folded into the status here, so every status field is still decided by pure
code. A refused child waits for its back-off (``Observed.held``); while it
does, the earlier refusal still stands.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from torchfleet_operator.api import reasons as r
from torchfleet_operator.desired import security
from torchfleet_operator.observed import timestamp
from torchfleet_operator.status import conditions as cond


def after_execute(
    status: dict[str, Any],
    previous: dict[str, Any],
    rejected: list[tuple[str, str, int, str]],
    still_held: bool,
    now: datetime,
) -> dict[str, Any]:
    """The status once the plan ran: the plan's, plus what the apiserver refused.

    ``rejected`` are this pass's refusals (kind, name, code, message);
    ``still_held`` says whether children refused earlier still wait for their
    back-off, in which case the earlier refusal still stands.
    """
    if rejected or not still_held:
        return with_rejections(status, rejected, now)
    return keep_condition(status, previous, r.CONDITION_CHILDREN)


def with_rejections(
    status: dict[str, Any], rejected: list[tuple[str, str, int, str]], now: datetime
) -> dict[str, Any]:
    """Adds the apiserver's refusals (kind, name, code, message) as a condition.

    A missing PodGroup CRD gets its own reason so that the fix is obvious.
    """
    status = dict(status)
    stamp = timestamp(now)
    if not rejected:
        status["conditions"] = cond.clear(
            status.get("conditions"),
            r.CONDITION_CHILDREN,
            r.REASON_ACCEPTED,
            "the API server accepted every child",
            stamp,
        )
        return status
    # An invalid pod first: it decides the job's fate (policy/invalid.py).
    rejected = sorted(rejected, key=lambda x: not (x[0] == "Pod" and x[2] in (400, 422)))
    kind, name, code, message = rejected[0]
    reason = r.REASON_CREATE_REJECTED
    if kind == "Pod" and code in (400, 422):
        reason = r.REASON_POD_INVALID
    elif code == 409:  # the executor reports only another owner's object as 409
        reason = r.REASON_NAME_CONFLICT
    elif kind == "PodGroup" and code == 404:
        reason = r.REASON_POD_GROUP_CRD_MISSING
        message = (
            f"the PodGroup CRD for spec.scheduling.podGroup is not installed in this "
            f"cluster ({message}); install the scheduler (podGroup Kubernetes: serve "
            f"scheduling.k8s.io/v1beta1, feature gate GenericWorkload, on Kubernetes 1.37; "
            f"v1alpha2 on 1.36) or set podGroup None"
        )
    refusal = security.describe_refusal(message)
    if refusal is not None:
        reason, message = r.REASON_POD_SECURITY_REJECTED, refusal
    text = f"{kind} {name}: {message}"
    if len(rejected) > 1:
        text += f" (and {len(rejected) - 1} more)"
    status["conditions"] = cond.set_condition(
        status.get("conditions"), r.CONDITION_CHILDREN, True, reason, text, stamp
    )
    return status


def keep_condition(status: dict[str, Any], previous: dict[str, Any], type_: str) -> dict[str, Any]:
    """``status`` with condition ``type_`` as it was in ``previous`` (or absent)."""
    kept = cond.find(previous.get("conditions"), type_)
    conditions = [x for x in status.get("conditions") or () if x.get("type") != type_]
    if kept is not None:
        conditions = sorted([*conditions, kept], key=lambda x: str(x.get("type")))
    return {**status, "conditions": conditions}
