"""The gang's hostfile, and the init container that writes it into each pod.

DeepSpeed's launcher (``deepspeed --hostfile=... --no_ssh --node_rank=...``)
and MPI-style tools read the gang from a file of ``<host> slots=<n>`` lines;
in DeepSpeed's no-ssh mode ``--node_rank`` indexes that file's order, so line
*i* must be node rank *i*. The hosts are the pods' stable DNS names through the
headless Service, the slots the job's processes per node.

How it reaches the pod: a small init container (the trainer's own image and
securityContext, so it passes whatever Pod Security level the trainer passes)
writes the file into an emptyDir mounted at ``contract.HOSTFILE_PATH``'s
directory, from the line pattern and the node count given as its arguments,
not from the lines themselves. Carrying the lines (in env or an annotation)
would make every pod O(nodes) bytes, O(nodes^2) per job, past the API's
limits at a few thousand nodes; a ConfigMap of the job would be one more
child for reconcile to create, watch and repair. The names depend on nothing
but the job, so the file needs no update while the gang lives, and a gang
restart's new pods write the same one.

An elastic job's hostfile lists every pod it may run (maxNodes lines): each
pod's file is then the same whichever size the job runs at, and a resize
(pods added or removed, survivors kept) leaves every file right. Who is in
the gang at a moment comes from the rendezvous, not from this file.

Jobs that run torchfleet-train get no hostfile: nothing in it reads one.
"""

from __future__ import annotations

import copy
import posixpath
from typing import Any

from torchfleet_contract import pod as contract
from torchfleet_operator.api.v1alpha1 import TrainingJobSpec
from torchfleet_operator.desired import names

VOLUME = "hostfile"
INIT_CONTAINER = "hostfile"
# POSIX sh (any image that can run a training script has one): $1 the file, $2
# the node count, $3 the slots, $4 the master's name, $5 and $6 what goes
# before and after a worker's index. `$((` is left alone by Kubernetes' $(VAR)
# expansion of command and args: no variable can be named "(i - 1".
SCRIPT = (
    'set -eu; i=0; while [ "$i" -lt "$2" ]; do '
    'if [ "$i" -eq 0 ]; then host="$4"; else host="$5$((i - 1))$6"; fi; '
    'echo "$host slots=$3"; i=$((i + 1)); done > "$1"'
)
# The trainer's resources the init container takes: not its GPUs or RDMA devices.
_COPIED_RESOURCES = ("cpu", "memory")


def wanted(spec: TrainingJobSpec) -> bool:
    """Every job that runs a command of its own gets a hostfile."""
    return not spec.runs_trainer


def node_count(spec: TrainingJobSpec) -> int:
    """The lines: the gang's nodes, or every node an elastic job may have."""
    return spec.elastic.max_nodes if spec.elastic is not None else spec.nodes


def lines(job: str, namespace: str, spec: TrainingJobSpec) -> list[str]:
    """The hostfile's lines in node-rank order (what the init container writes)."""
    slots = spec.resolved_processes_per_node
    return [
        f"{names.pod_address(job, namespace, names.pod_name_for_rank(job, rank))} slots={slots}"
        for rank in range(node_count(spec))
    ]


def _worker_address_parts(job: str, namespace: str) -> tuple[str, str]:
    """A worker's address is prefix + index + suffix."""
    first = names.worker_pod_name(job, 0)
    address = names.pod_address(job, namespace, first)
    prefix, _, suffix = address.partition(first)
    return prefix + first.removesuffix("0"), suffix


def volume() -> dict[str, Any]:
    return {"name": VOLUME, "emptyDir": {}}


def mount() -> dict[str, Any]:
    return {"name": VOLUME, "mountPath": posixpath.dirname(contract.HOSTFILE_PATH)}


def init_container(
    job: str, namespace: str, spec: TrainingJobSpec, trainer: dict[str, Any]
) -> dict[str, Any]:
    """Writes the hostfile; ``trainer`` is the merged trainer container, whose
    image, user and CPU/memory it takes (an init container's
    requests count as the maximum with the pod's, so they add nothing, and a
    namespace quota that needs requests on every container gets them)."""
    prefix, suffix = _worker_address_parts(job, namespace)
    arguments = [
        contract.HOSTFILE_PATH,
        str(node_count(spec)),
        str(spec.resolved_processes_per_node),
        names.master_address(job, namespace),
        prefix,
        suffix,
    ]
    container: dict[str, Any] = {
        "name": INIT_CONTAINER,
        "image": trainer["image"],
        # "hostfile" is the script's $0, the name its errors carry.
        "command": ["sh", "-c", SCRIPT, INIT_CONTAINER, *arguments],
        "volumeMounts": [mount()],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    # The trainer's user and profile, so it passes whatever Pod Security level the
    # trainer passes, but no capability (RDMA's IPC_LOCK is the trainer's alone).
    security = copy.deepcopy(trainer.get("securityContext") or {})
    container["securityContext"] = {**security, "capabilities": {"drop": ["ALL"]}}
    copied = {
        section: {k: v for k, v in values.items() if k in _COPIED_RESOURCES}
        for section, values in (trainer.get("resources") or {}).items()
        if section in ("requests", "limits") and isinstance(values, dict)
    }
    resources = {section: values for section, values in copied.items() if values}
    if resources:
        container["resources"] = resources
    return container
