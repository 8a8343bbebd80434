"""The TrainingJob and ConfigMap that ``torchfleet run`` creates, as a user
would write them by hand (examples/byo-torchrun.yaml): the packed script
mounted at /workspace in both roles, ``torchrun`` as the command.

Pure: plain data in, manifests out; the job is checked against the same
pydantic models the CRD is generated from before anything is sent.
"""

from __future__ import annotations

import re
import secrets
import string
from typing import Any

from torchfleet_cli.packing import MOUNT_PATH, Package
from torchfleet_operator.api import API_VERSION, KIND, parse_training_job
from torchfleet_operator.api.constants import (
    CLUSTER_RUNTIME_KIND,
    MAX_JOB_NAME_LENGTH,
    RUNTIME_KIND,
    TRAINER_CONTAINER_NAME,
)
from torchfleet_operator.desired.labels import JOB_NAME_LABEL

# The examples' image for a script of the user's own (examples/byo-torchrun.yaml).
DEFAULT_IMAGE = "pytorch/pytorch:2.9.0-cuda12.8-cudnn9-runtime"
CODE_VOLUME = "code"
_SUFFIX_LENGTH = 5


def job_name(script: str) -> str:
    """A fresh job name from the script's name: ``train.py`` -> ``train-x7k2p``."""
    stem = re.sub(r"[^a-z0-9-]+", "-", script.lower().rsplit("/", 1)[-1].removesuffix(".py"))
    stem = stem.strip("-") or "job"
    if not stem[0].isalpha():
        stem = f"job-{stem}"
    stem = stem[: MAX_JOB_NAME_LENGTH - _SUFFIX_LENGTH - 1].rstrip("-")
    alphabet = string.ascii_lowercase + string.digits
    return f"{stem}-{''.join(secrets.choice(alphabet) for _ in range(_SUFFIX_LENGTH))}"


def code_configmap_name(job: str) -> str:
    return f"{job}-code"


def _template(
    package: Package,
    configmap: str,
    node_selector: dict[str, str] | None,
    tolerations: list[dict[str, str]] | None,
) -> dict[str, Any]:
    placement: dict[str, Any] = {}
    if node_selector:
        placement["nodeSelector"] = dict(node_selector)
    if tolerations:
        placement["tolerations"] = [dict(t) for t in tolerations]
    return {
        "spec": {
            **placement,
            "volumes": [
                {
                    "name": CODE_VOLUME,
                    "configMap": {"name": configmap, "items": package.items},
                }
            ],
            "containers": [
                {
                    "name": TRAINER_CONTAINER_NAME,
                    "workingDir": MOUNT_PATH,
                    "volumeMounts": [{"name": CODE_VOLUME, "mountPath": MOUNT_PATH}],
                }
            ],
        }
    }


def runtime_ref(text: str) -> dict[str, str]:
    """``--runtime``'s value as spec.runtimeRef: ``NAME`` (a
    ClusterTrainingRuntime, the platform team's), or ``KIND/NAME`` as kubectl
    names an object (``trainingruntime/NAME`` for the namespace's own)."""
    kind, slash, name = text.rpartition("/")
    kinds = {k.lower(): k for k in (RUNTIME_KIND, CLUSTER_RUNTIME_KIND)}
    if not name or (slash and kind.lower() not in kinds):
        raise ValueError(
            f"runtime {text!r}: want NAME (a {CLUSTER_RUNTIME_KIND}) or "
            f"{RUNTIME_KIND}/NAME or {CLUSTER_RUNTIME_KIND}/NAME"
        )
    return {"kind": kinds[kind.lower()] if slash else CLUSTER_RUNTIME_KIND, "name": name}


def training_job(
    name: str,
    package: Package,
    *,
    nodes: int = 1,
    procs_per_node: int | str = 1,
    args: list[str] | tuple[str, ...] = (),
    image: str | None = None,
    gpus: int = 0,
    node_selector: dict[str, str] | None = None,
    tolerations: list[dict[str, str]] | None = None,
    runtime: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The TrainingJob running ``torchrun <entry> <args>`` on ``nodes`` pods
    (placed by ``node_selector`` and ``tolerations``, in both roles); raises
    :class:`torchfleet_operator.api.InvalidSpecError` naming a bad field.

    On a ``runtime`` (spec.runtimeRef) the job gives only what differs: the
    code, the size, the arguments; the image is the runtime's unless one is
    given. Without one the image defaults to :data:`DEFAULT_IMAGE`."""
    if nodes < 1:
        raise ValueError(f"nodes must be at least 1, not {nodes}")
    template = _template(package, code_configmap_name(name), node_selector, tolerations)
    spec: dict[str, Any] = {"runtimeRef": dict(runtime)} if runtime else {}
    if image or not runtime:
        spec["image"] = image or DEFAULT_IMAGE
    spec |= {
        "processesPerNode": procs_per_node,
        "command": ["torchrun", package.entry_path],
        "master": {"template": template},
        "worker": {"replicas": nodes - 1, "template": template},
    }
    if args:
        spec["args"] = list(args)
    if gpus:
        spec["resources"] = {"gpus": gpus}
    body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec}
    parse_training_job(body)
    return body


def code_configmap(job: str, package: Package, owner: dict[str, Any]) -> dict[str, Any]:
    """The ConfigMap holding the packed code, owned by the created job
    ``owner`` (:func:`owner_reference`): deleting the job deletes it."""
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": code_configmap_name(job),
            "labels": {JOB_NAME_LABEL: job},
            "ownerReferences": [owner_reference(owner)],
        },
        "data": package.data,
    }
    if package.binary_data:
        body["binaryData"] = package.binary_data
    return body


def toleration(text: str) -> dict[str, str]:
    """``KEY=VALUE:EFFECT`` or ``KEY:EFFECT`` (any value) as a pod toleration,
    the form ``kubectl taint`` takes."""
    taint, _, effect = text.rpartition(":")
    key, equals, value = taint.partition("=")
    if not key or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
        raise ValueError(
            f"toleration {text!r}: want KEY=VALUE:EFFECT or KEY:EFFECT, the effect "
            "NoSchedule, PreferNoSchedule or NoExecute"
        )
    if equals:
        return {"key": key, "operator": "Equal", "value": value, "effect": effect}
    return {"key": key, "operator": "Exists", "effect": effect}


def owner_reference(job: dict[str, Any]) -> dict[str, Any]:
    """The created job as the owner of its code: deleting the job deletes it."""
    meta = job["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
    }
