"""Reading a rank's kept log once its pod is gone: ``torchfleet logs JOB
--generation G --round R --rank N``. Pure: the reader pod's manifest.

torchfleet-train keeps every rank's output on the job's checkpoint volume
(``<checkpoint dir>/logs/gen-<G>/round-<R>/rank-<N>.log``, the pod contract's
kept_log_file), which outlives the gang; only a pod can read a volume, so the
command starts a short one: the job's claim mounted read-only where the job's
pods mount it, ``cat`` of the one file, on the nodes the job's master may run
on (a claim bound to one node's disk is reached there), restricted Pod
Security, the job's image. The client reads its log and deletes it.
"""

from __future__ import annotations

import secrets
import string
from typing import Any

from torchfleet_contract import pod as contract
from torchfleet_operator.api import parse_training_job
from torchfleet_operator.api.runtime_merge import merged_over_record
from torchfleet_operator.config import DEFAULT_TRAINER_IMAGE
from torchfleet_operator.desired import names
from torchfleet_operator.desired.labels import JOB_NAME_LABEL
from torchfleet_operator.policy.kept_logs import logs_root

VOLUME = "checkpoint"
PLACEMENT = ("nodeSelector", "tolerations", "affinity")


class NoKeptLogs(ValueError):
    """The job keeps no logs to read (a command of its own, no checkpoint volume)."""


def reader_pod(job: dict[str, Any], generation: int, round_: int, rank: int) -> dict[str, Any]:
    """The pod that prints rank ``rank``'s kept log of gang ``generation``,
    in-place round ``round_``; raises :class:`NoKeptLogs` saying why there is none."""
    body = {**job, "spec": merged_over_record(job) or job.get("spec")}  # a runtime's counts
    spec = parse_training_job(body).spec
    name = str(job["metadata"]["name"])
    root = logs_root(spec)
    if root is None or spec.checkpoint is None:
        raise NoKeptLogs(
            f"{name} keeps no logs: only torchfleet-train keeps them, on a checkpoint volume "
            "(a command of your own prints to its pod's log: torchfleet logs without --generation)"
        )
    claim = spec.checkpoint.claim_name or names.checkpoint_claim_name(name)
    master = ((body["spec"].get("master") or {}).get("template") or {}).get("spec") or {}
    suffix = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name[:40]}-logs-{suffix}",
            "labels": {JOB_NAME_LABEL: name, "app.kubernetes.io/component": "kept-log-reader"},
        },
        "spec": {
            **{key: master[key] for key in PLACEMENT if key in master},
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "volumes": [
                {"name": VOLUME, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
            ],
            "containers": [
                {
                    "name": "cat",
                    "image": spec.image or DEFAULT_TRAINER_IMAGE,
                    "command": ["cat", contract.kept_log_file(root, generation, round_, rank)],
                    "volumeMounts": [
                        {"name": VOLUME, "mountPath": spec.checkpoint.mount_path, "readOnly": True}
                    ],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                        "readOnlyRootFilesystem": True,
                    },
                    "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}},
                }
            ],
        },
    }
