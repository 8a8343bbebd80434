"""Gang scheduling: a PodGroup (scheduler-plugins or Volcano) with minMember = every pod."""

from __future__ import annotations

from typing import Any

from torchfleet_operator.api.v1alpha1 import TrainingJobSpec
from torchfleet_operator.build import labels, names

COSCHEDULING_API = "scheduling.x-k8s.io/v1alpha1"
VOLCANO_API = "scheduling.volcano.sh/v1beta1"
# How pods name their group, per scheduler.
COSCHEDULING_POD_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_POD_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_SCHEDULER = "volcano"


def scheduler_name(spec: TrainingJobSpec) -> str | None:
    if spec.scheduling.scheduler_name:
        return spec.scheduling.scheduler_name
    return VOLCANO_SCHEDULER if spec.scheduling.pod_group == "Volcano" else None


def pod_group(job: str, namespace: str, uid: str, spec: TrainingJobSpec) -> dict[str, Any] | None:
    kind = spec.scheduling.pod_group
    if kind == "None":
        return None
    body: dict[str, Any] = {"minMember": spec.nodes}
    if kind == "Coscheduling":
        api_version = COSCHEDULING_API
        if spec.scheduling.schedule_timeout_seconds:
            body["scheduleTimeoutSeconds"] = spec.scheduling.schedule_timeout_seconds
    else:
        api_version = VOLCANO_API
        if spec.scheduling.queue_name:
            body["queue"] = spec.scheduling.queue_name
        if spec.scheduling.priority_class_name:
            body["priorityClassName"] = spec.scheduling.priority_class_name
    return {
        "apiVersion": api_version,
        "kind": "PodGroup",
        "metadata": {
            "name": names.podgroup_name(job),
            "namespace": namespace,
            "labels": labels.common_labels(job),
            "ownerReferences": [labels.owner_reference(job, uid)],
        },
        "spec": body,
    }


def pod_membership(job: str, spec: TrainingJobSpec) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) that put a pod into the job's PodGroup."""
    kind = spec.scheduling.pod_group
    if kind == "Coscheduling":
        return {COSCHEDULING_POD_LABEL: names.podgroup_name(job)}, {}
    if kind == "Volcano":
        return {}, {VOLCANO_POD_ANNOTATION: names.podgroup_name(job)}
    return {}, {}
