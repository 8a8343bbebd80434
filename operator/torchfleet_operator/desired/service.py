"""The headless Service that gives every pod a stable DNS name (MASTER_ADDR)."""

from __future__ import annotations

from typing import Any

from torchfleet_contract import pod as contract
from torchfleet_operator.desired import labels, names


def headless_service(job: str, namespace: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": names.service_name(job),
            "namespace": namespace,
            "labels": labels.common_labels(job),
            "ownerReferences": [labels.owner_reference(job, uid)],
        },
        "spec": {
            "clusterIP": "None",
            # Ranks resolve each other before they are Ready (rendezvous happens
            # before any readiness could be reported).
            "publishNotReadyAddresses": True,
            "selector": labels.job_selector(job),
            "ports": [
                {"name": "rendezvous", "port": contract.DEFAULT_MASTER_PORT, "protocol": "TCP"}
            ],
        },
    }
