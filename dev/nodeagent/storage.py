"""A local-path provisioner for the agent's nodes.

A pod with a PersistentVolumeClaim is scheduled only once the claim is bound,
and the local cluster has no storage driver. So the agent offers a
StorageClass (the cluster default when there is none) and, for each pending
claim of that class, creates a PersistentVolume pre-bound to it whose data is
the directory the agent mounts for that claim. The controller-manager's
volume binder does the binding; the agent deletes the volumes it made once
their claims are gone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from .kube import Kube

log = logging.getLogger("nodeagent.storage")

STORAGE_CLASS = "torchfleet-local"
PROVISIONER = "torchfleet.dev/nodeagent-local"
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"


def storage_class_manifest(default: bool) -> dict[str, Any]:
    annotations = {DEFAULT_CLASS_ANNOTATION: "true"} if default else {}
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS, "annotations": annotations},
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Retain",
        "volumeBindingMode": "Immediate",
    }


def volume_for_claim(claim: dict[str, Any], path: Path) -> dict[str, Any]:
    """A volume pre-bound to ``claim`` whose data is ``path`` on this machine."""
    meta = claim["metadata"]
    spec = claim.get("spec") or {}
    size = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": f"pvc-{meta['uid']}",
            "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER},
        },
        "spec": {
            "capacity": {"storage": size},
            "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": STORAGE_CLASS,
            "volumeMode": spec.get("volumeMode") or "Filesystem",
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
            "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
        },
    }


class Provisioner:
    def __init__(self, kube: Kube, claim_dir: Callable[[str, str], Path]) -> None:
        self.kube = kube
        self.claim_dir = claim_dir

    def ensure_storage_class(self) -> None:
        classes = self.kube.request("GET", "/apis/storage.k8s.io/v1/storageclasses")["items"]
        if any(c["metadata"]["name"] == STORAGE_CLASS for c in classes):
            return
        has_default = any(
            (c["metadata"].get("annotations") or {}).get(DEFAULT_CLASS_ANNOTATION) == "true"
            for c in classes
        )
        manifest = storage_class_manifest(default=not has_default)
        try:
            self.kube.request("POST", "/apis/storage.k8s.io/v1/storageclasses", manifest)
        except ApiException as error:
            if error.status != 409:
                raise

    def provision_pending(self) -> None:
        """One pass: a volume for every pending claim of our class, and the
        volumes whose claims are gone deleted."""
        # Another agent that stopped may have removed the class we share.
        self.ensure_storage_class()
        claims = self.kube.request("GET", "/api/v1/persistentvolumeclaims")["items"]
        volumes = self.kube.request("GET", "/api/v1/persistentvolumes")["items"]
        existing = {v["metadata"]["name"] for v in volumes}
        for claim in claims:
            spec = claim.get("spec") or {}
            pending = (claim.get("status") or {}).get("phase") == "Pending"
            if not pending or spec.get("storageClassName") != STORAGE_CLASS:
                continue
            if f"pvc-{claim['metadata']['uid']}" in existing or spec.get("volumeName"):
                continue
            meta = claim["metadata"]
            path = self.claim_dir(meta["namespace"], meta["name"])
            self._create(volume_for_claim(claim, path))
            log.info("provisioned %s/%s at %s", meta["namespace"], meta["name"], path)
        for volume in volumes:
            ours = volume["spec"].get("storageClassName") == STORAGE_CLASS
            if ours and (volume.get("status") or {}).get("phase") == "Released":
                self.kube.request(
                    "DELETE", f"/api/v1/persistentvolumes/{volume['metadata']['name']}"
                )

    def remove(self) -> None:
        """On the way out: the StorageClass goes (so later claims do not wait
        for a provisioner that is gone), and so do its unbound volumes."""
        self.kube.request("DELETE", f"/apis/storage.k8s.io/v1/storageclasses/{STORAGE_CLASS}")
        for volume in self.kube.request("GET", "/api/v1/persistentvolumes")["items"]:
            ours = volume["spec"].get("storageClassName") == STORAGE_CLASS
            if ours and (volume.get("status") or {}).get("phase") != "Bound":
                name = volume["metadata"]["name"]
                self.kube.request("DELETE", f"/api/v1/persistentvolumes/{name}")

    def _create(self, manifest: dict[str, Any]) -> None:
        try:
            self.kube.request("POST", "/api/v1/persistentvolumes", manifest)
        except ApiException as error:
            if error.status != 409:
                raise
