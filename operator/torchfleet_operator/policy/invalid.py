"""A spec the operator cannot use: invalid before the first gang, not
understood after it. Pure.

Full validation of the spec gates only the *first* gang. A job that already
had one keeps going from what its pods are when its stored spec stops parsing
(a stricter operator, a rollback under a newer CRD): it is never failed for
it, and a finished job keeps its phase and its TTL. A pod template the API
server refused as invalid (400/422) is permanent: the job fails.
"""

from __future__ import annotations

from typing import Any

from torchfleet_operator.api import constants as c
from torchfleet_operator.api import reasons as r
from torchfleet_operator.api.v1alpha1 import ReplicaStatuses
from torchfleet_operator.planning import FINISHED, Pass, Plan, find_condition
from torchfleet_operator.policy import suspend, ttl
from torchfleet_operator.status import restarts
from torchfleet_operator.status.counts import replica_statuses


def _had_gang(step: Pass) -> bool:
    status = step.status
    return bool(step.observed.pods or status.start_time or restarts.gang(status))


def not_understood(step: Pass, raw_spec: dict[str, Any], problem: str) -> Plan:
    """A stored spec this operator cannot parse.

    Before the first gang it is an invalid spec (Failed). After, the job is
    left as it is: a finished job keeps its phase (and its TTL), a suspended
    one stays without pods, a running one keeps its pods; nothing is created,
    restarted or failed until the spec parses again.
    """
    phase = step.phase
    if phase not in FINISHED and not _had_gang(step) and raw_spec.get("suspend") is not True:
        return invalid(step, problem)
    failed = step.condition(c.PHASE_FAILED)
    if failed is None or failed.reason != r.REASON_INVALID_SPEC:  # that one already says it
        _report_not_understood(step, problem)
    if phase in FINISHED:
        ttl.expire(step, ttl.raw_ttl(raw_spec))
        return step.finalize()
    if raw_spec.get("suspend") is True:
        return suspend.suspend(step, list(step.observed.pods))
    restart = restarts.gang(step.status)
    gang = [p for p in step.observed.pods if p.restart == restart]
    step.status.replica_statuses = ReplicaStatuses.model_validate(replica_statuses(gang))
    return step.finalize()


def understood(step: Pass) -> None:
    step.clear_condition(
        r.CONDITION_SPEC_NOT_UNDERSTOOD,
        r.REASON_UNDERSTOOD,
        "the stored spec parses under this operator",
    )


def _report_not_understood(step: Pass, problem: str) -> None:
    message = (
        f"the stored spec does not parse under this operator ({problem}); the job "
        f"keeps its pods and phase, and nothing is created or restarted until it parses"
    )
    old = find_condition(step.old_status, r.CONDITION_SPEC_NOT_UNDERSTOOD)
    if old is None or old.status != "True" or old.message != message:
        step.event("Warning", r.EVENT_SPEC_NOT_UNDERSTOOD, message)
    step.set_condition(r.CONDITION_SPEC_NOT_UNDERSTOOD, True, r.REASON_PARSE_ERROR, message)


def invalid(step: Pass, problem: str) -> Plan:
    """A spec the CRD could not reject: Failed, no pods (and remove any made before)."""
    step.finish(c.PHASE_FAILED, r.REASON_INVALID_SPEC, problem)
    step.delete_pods([p for p in step.observed.pods if not p.finished])
    return step.finalize()


def fail_if_pods_refused(step: Pass) -> bool:
    """Fails the job (True) when the last pass's pods were refused as invalid.

    Permanent, unlike quota or Pod Security (403): the same template fails the
    same way however often it is retried. Only for the generation it was
    refused for: a template fixed since gets its own try.
    """
    found = step.condition(r.CONDITION_CHILDREN)
    if found is None or found.status != "True" or found.reason != r.REASON_POD_INVALID:
        return False
    if step.old_status.observed_generation != step.generation:
        return False
    message = f"the API server refused the pod template: {found.message}"
    step.finish(c.PHASE_FAILED, r.REASON_INVALID_SPEC, message)
    return True
