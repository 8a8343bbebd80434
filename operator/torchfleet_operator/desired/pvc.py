"""The checkpoint claim the operator creates from checkpoint.claimTemplate."""

from __future__ import annotations

from typing import Any

from torchfleet_operator.api.v1alpha1 import ClaimTemplate
from torchfleet_operator.desired import labels, names


def checkpoint_claim(job: str, namespace: str, uid: str, template: ClaimTemplate) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": names.checkpoint_claim_name(job),
        "namespace": namespace,
        "labels": labels.common_labels(job),
    }
    if template.retention_policy == "Delete":
        # Owned: the garbage collector removes it with the job. Retain leaves
        # it unowned so a later job can resume from it.
        metadata["ownerReferences"] = [labels.owner_reference(job, uid)]
    spec: dict[str, Any] = {
        "accessModes": list(template.access_modes),
        "resources": {"requests": {"storage": str(template.size)}},
    }
    if template.storage_class_name:
        spec["storageClassName"] = template.storage_class_name
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": spec}
