"""A finished job (Succeeded or Failed): clean its pods, release its Kueue
quota, then delete it when its TTL is over. Pure.

Which pods go is cleanPodPolicy's (clean_pod.py), except for a job that
failed for a reason its pods cannot explain further (api/reasons.py's
HOLDS_NOTHING): every pod goes. A trainer that ended beside native sidecars
goes too, whatever the policy: its pod would otherwise run for ever.
"""

from __future__ import annotations

from torchfleet_operator.api import constants as c
from torchfleet_operator.api import reasons as r
from torchfleet_operator.api.v1alpha1 import TrainingJobSpec
from torchfleet_operator.planning import Pass, Plan
from torchfleet_operator.policy import clean_pod, kueue, ttl


def finished(step: Pass, spec: TrainingJobSpec) -> Plan:
    """Succeeded or Failed: clean the pods, then the TTL."""
    kueue.mark_finished(step, spec)
    failed = step.condition(c.PHASE_FAILED)
    reason = failed.reason if failed is not None else None
    holds_nothing = step.phase == c.PHASE_FAILED and reason in r.HOLDS_NOTHING
    policy = "All" if holds_nothing else spec.run_policy.clean_pod_policy
    cleaned = clean_pod.pods_to_clean(policy, step.observed.pods)
    cleaned += [p for p in step.observed.pods if p.sidecars_running and p not in cleaned]
    step.delete_pods(cleaned)
    ttl.expire(step, spec.run_policy.ttl_seconds_after_finished)
    return step.finalize()
