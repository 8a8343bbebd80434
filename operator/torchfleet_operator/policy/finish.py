"""A finished job (Succeeded or Failed): clean its pods, release its Kueue
quota and Kubernetes' gang PodGroups, then delete it when its TTL is over. Pure.

Which pods go is cleanPodPolicy's (clean_pod.py), except for a job that
failed for a reason its pods cannot explain further (api/reasons.py's
HOLDS_NOTHING): every pod goes. A trainer that ended beside native sidecars
goes too, whatever the policy: its pod would otherwise run for ever.
"""

from __future__ import annotations

from torchfleet_operator.api import constants as c
from torchfleet_operator.api import reasons as r
from torchfleet_operator.api.v1alpha1 import TrainingJobSpec
from torchfleet_operator.planning import ChildRef, Pass, Plan
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
    release_finished_groups(step, None)
    ttl.expire(step, spec.run_policy.ttl_seconds_after_finished)
    return step.finalize()


def release_finished_groups(step: Pass, restart: int | None) -> None:
    """Deletes Kubernetes' PodGroups of the gang generations before ``restart``
    (every one when ``restart`` is None: the job finished). A generation's
    group places only its own gang; kept, it would count in the scheduler's
    and the API server's work until the job is deleted. Protection (1.37's
    PodGroupProtection finalizer) keeps one whose pods are still active until
    they are gone; a group already being deleted is left to it."""
    for group in step.observed.pod_groups:
        if group.kind != "Kubernetes" or group.deleting or not group.name:
            continue
        if restart is None or group.generation < restart:
            step.plan.delete.append(
                ChildRef("PodGroup", group.name, group.uid, api_version=str(group.api_version))
            )
