"""One pod per node rank: the operator's defaults with the role template merged over.

Order of precedence (later wins): operator defaults < role template < the
operator's identity fields (name, labels it selects on, owner, restart policy,
hostname/subdomain), which must hold for the gang to work at all.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from torchfleet_contract import pod as contract
from torchfleet_operator.api.constants import (
    DEFAULT_TERMINATION_GRACE_SECONDS,
    TRAINER_CONTAINER_NAME,
)
from torchfleet_operator.api.v1alpha1 import PodTemplate, TrainingJobSpec, trainer_and_sidecars
from torchfleet_operator.desired import env as pod_env
from torchfleet_operator.desired import hostfile, labels, names, podgroup, security
from torchfleet_operator.desired.names import pod_name_for_rank
from torchfleet_operator.desired.resources import container_resources

SHM_VOLUME = "dshm"
CHECKPOINT_VOLUME = "checkpoint"
TRAINER_COMMAND = ["torchfleet-train"]
# The trainer image's user and group (trainer_image/Dockerfile). A provisioned
# checkpoint volume is root-owned: fsGroup makes it group-writable and adds the
# group to every container, so any non-root image can write checkpoints.
CHECKPOINT_FS_GROUP = 1000


def role_of(node_rank: int) -> str:
    return names.MASTER_ROLE if node_rank == 0 else names.WORKER_ROLE


def template_for(spec: TrainingJobSpec, node_rank: int) -> PodTemplate | None:
    return spec.master.template if node_rank == 0 else spec.worker.template


def runs_default_image(spec: TrainingJobSpec, template_image: str | None) -> bool:
    """Whether the trainer runs the operator's own image, whose user (uid 1000,
    runAsNonRoot) and empty home (HOME may move to /tmp) are known."""
    return spec.image is None and template_image is None


def _trainer_container(
    job: str,
    namespace: str,
    uid: str,
    spec: TrainingJobSpec,
    node_rank: int,
    restart: int,
    image: str,
    template_image: str | None = None,
) -> dict[str, Any]:
    env = pod_env.pod_env(job, namespace, uid, spec, node_rank, restart)
    container: dict[str, Any] = {
        "name": TRAINER_CONTAINER_NAME,
        "image": spec.image or image,
        "command": list(spec.command) if spec.command else list(TRAINER_COMMAND),
        "env": [
            *({"name": k, "value": v} for k, v in env.items()),
            # The trainer names its node by it in the per-node series (node health).
            {"name": contract.NODE_NAME, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        ],
        "ports": [
            {"name": "metrics", "containerPort": contract.DEFAULT_METRICS_PORT, "protocol": "TCP"},
            {
                "name": "rendezvous",
                "containerPort": contract.rendezvous_port(restart),
                "protocol": "TCP",
            },
        ],
        "volumeMounts": [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}],
        # The log's tail becomes the termination message when the trainer fails
        # without writing one: the job's condition then says why (a template wins).
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if spec.args:
        container["args"] = list(spec.args)
    resources = container_resources(spec)
    if resources:
        container["resources"] = resources
    container["securityContext"] = security.trainer_security_context(
        spec, runs_default_image(spec, template_image)
    )
    if spec.checkpoint:
        container["volumeMounts"].append(
            {"name": CHECKPOINT_VOLUME, "mountPath": spec.checkpoint.mount_path}
        )
    if hostfile.wanted(spec):
        container["volumeMounts"].append(hostfile.mount())
    return container


def _merge_env(base: list[dict[str, Any]], override: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Template env wins by name; order: operator's first, then the template's new ones."""
    by_name = {item["name"]: item for item in override}
    merged = [by_name.pop(item["name"], item) for item in base]
    return merged + [item for item in override if item["name"] in by_name]


def _merge_by_key(ours: Any, theirs: Any) -> Any:
    """Objects merge key by key (the template's value winning at each leaf);
    anything else, lists included, is the template's: a template that sets only
    resources.limits.memory keeps the GPU and RDMA limits, one that sets
    securityContext.runAsUser keeps the capabilities RDMA needs."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        merged = dict(ours)
        for key, value in theirs.items():
            merged[key] = _merge_by_key(ours[key], value) if key in ours else value
        return merged
    return theirs


def _merge_container(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    merged = _merge_by_key(
        ours, {k: v for k, v in theirs.items() if k not in ("env", "volumeMounts")}
    )
    merged["env"] = _merge_env(ours.get("env", []), theirs.get("env") or [])
    mounts = {m["mountPath"]: m for m in ours.get("volumeMounts", [])}
    mounts.update({m["mountPath"]: m for m in theirs.get("volumeMounts") or []})
    merged["volumeMounts"] = list(mounts.values())
    merged["name"] = TRAINER_CONTAINER_NAME
    return merged


def _volumes(spec: TrainingJobSpec, job: str, default_shm_size: str | None) -> list[dict[str, Any]]:
    shm: dict[str, Any] = {"medium": "Memory"}
    # The job's own size wins; else the operator's default (Helm
    # operator.defaults.shmSize); else unbounded up to the pod's memory limit.
    shm_size = spec.resources.shm_size if spec.resources.shm_size is not None else default_shm_size
    if shm_size:
        shm["sizeLimit"] = str(shm_size)
    volumes: list[dict[str, Any]] = [{"name": SHM_VOLUME, "emptyDir": shm}]
    if spec.checkpoint:
        claim = spec.checkpoint.claim_name or names.checkpoint_claim_name(job)
        volumes.append({"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": claim}})
    if hostfile.wanted(spec):
        volumes.append(hostfile.volume())
    return volumes


def _gang_affinity(
    job: str, spec: TrainingJobSpec, template_affinity: dict[str, Any] | None
) -> dict[str, Any] | None:
    """scheduling.topology: pack the gang into one domain of ``key``, added to the
    template's own affinity (Required is a hard podAffinity, Preferred a weighted one)."""
    topology = spec.scheduling.topology
    affinity = copy.deepcopy(template_affinity) if template_affinity else None
    if topology is None:
        return affinity
    affinity = affinity or {}
    term = {"labelSelector": {"matchLabels": labels.job_selector(job)}, "topologyKey": topology.key}
    pod_affinity = affinity.setdefault("podAffinity", {})
    if topology.mode == "Required":
        pod_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(term)
    else:
        pod_affinity.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(
            {"weight": 100, "podAffinityTerm": term}
        )
    return affinity


def _avoiding(affinity: dict[str, Any] | None, nodes: Sequence[str]) -> dict[str, Any] | None:
    """``affinity`` that also keeps the pod off ``nodes`` (status.health.avoidedNodes):
    a required node affinity on the node's name, ANDed into every nodeSelectorTerm
    of the template's own (the terms are ORed, so one term of its own would not
    do). Scoped to this job's pods: the nodes are not touched."""
    if not nodes:
        return affinity
    affinity = affinity or {}
    required = affinity.setdefault("nodeAffinity", {}).setdefault(
        "requiredDuringSchedulingIgnoredDuringExecution", {}
    )
    terms = required.get("nodeSelectorTerms") or [{}]
    avoid = {"key": "metadata.name", "operator": "NotIn", "values": sorted(set(nodes))}
    required["nodeSelectorTerms"] = [
        {**term, "matchFields": [*(term.get("matchFields") or []), avoid]} for term in terms
    ]
    return affinity


def _merge_volumes(
    ours: list[dict[str, Any]], theirs: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    by_name = {v["name"]: v for v in ours}
    by_name.update({v["name"]: v for v in theirs})
    return list(by_name.values())


def _default_checkpoint_ownership(pod_spec: dict[str, Any]) -> None:
    """fsGroup for the checkpoint volume unless the template chose one.

    OnRootMismatch: the kubelet chowns only a volume whose root is not yet
    right, never a terabyte checkpoint tree recursively on every gang restart."""
    context = pod_spec.setdefault("securityContext", {})
    if "fsGroup" not in context:
        context["fsGroup"] = CHECKPOINT_FS_GROUP
        context.setdefault("fsGroupChangePolicy", "OnRootMismatch")


def _pod_security_context(pod_spec: dict[str, Any], template_spec: dict[str, Any]) -> None:
    """The operator's pod-level securityContext, the template's merged over it."""
    pod_spec["securityContext"] = _merge_by_key(
        security.pod_security_context(), template_spec.get("securityContext") or {}
    )


def _add_scratch(pod_spec: dict[str, Any], trainer: dict[str, Any], default_image: bool) -> None:
    """A read-only root filesystem's writable place: an emptyDir over /tmp (unless
    the template mounts something there itself) and the caches that would go
    under HOME pointed into it, each unless the template's env names it."""
    if not security.has_read_only_root(trainer):
        return
    if all(m["mountPath"] != security.SCRATCH_PATH for m in trainer["volumeMounts"]):
        trainer["volumeMounts"].append(security.scratch_mount())
        if all(v["name"] != security.SCRATCH_VOLUME for v in pod_spec["volumes"]):
            pod_spec["volumes"].append(security.scratch_volume())
    named = {item["name"] for item in trainer["env"]}
    trainer["env"] += [
        {"name": name, "value": value}
        for name, value in security.scratch_env(default_image).items()
        if name not in named
    ]


def _add_hostfile_writer(
    job: str,
    namespace: str,
    spec: TrainingJobSpec,
    pod_spec: dict[str, Any],
    trainer: dict[str, Any],
) -> None:
    """The init container that writes the hostfile, after the template's own (a
    native sidecar among them starts first, as the template asked). Not where
    the template mounts a directory of its own at the hostfile's place, nor
    where it has an init container of that name: then it provides the file."""
    if not hostfile.wanted(spec) or hostfile.mount() not in trainer["volumeMounts"]:
        return
    inits = pod_spec.get("initContainers") or []
    if any(c.get("name") == hostfile.INIT_CONTAINER for c in inits):
        return
    pod_spec["initContainers"] = [
        *inits,
        hostfile.init_container(job, namespace, spec, trainer),
    ]


def build_pod(
    job: str,
    namespace: str,
    uid: str,
    spec: TrainingJobSpec,
    node_rank: int,
    restart: int,
    default_image: str,
    default_shm_size: str | None = None,
    avoid_nodes: Sequence[str] = (),
) -> dict[str, Any]:
    """The complete pod manifest for ``node_rank`` of gang number ``restart``, kept
    off ``avoid_nodes``."""
    role = role_of(node_rank)
    name = pod_name_for_rank(job, node_rank)
    template = template_for(spec, node_rank)
    template_spec = copy.deepcopy(template.spec) if template and template.spec else {}
    template_meta = template.metadata if template else None

    theirs, sidecars = trainer_and_sidecars(template_spec.pop("containers", None) or [])
    ours = _trainer_container(
        job, namespace, uid, spec, node_rank, restart, default_image, theirs.get("image")
    )

    # The kubelet gives a killed trainer this long to save before SIGKILL. A role
    # template's own value (merged below) can only differ where the job sets none.
    grace = spec.run_policy.termination_grace_period_seconds
    pod_spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": grace or DEFAULT_TERMINATION_GRACE_SECONDS,
        # The trainer never calls the API server: no token unless the template asks.
        "automountServiceAccountToken": False,
    }
    scheduler = podgroup.scheduler_name(spec)
    if scheduler:
        pod_spec["schedulerName"] = scheduler
    if spec.scheduling.priority_class_name:
        pod_spec["priorityClassName"] = spec.scheduling.priority_class_name
    if spec.network.host_network:
        pod_spec["hostNetwork"] = True
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    pod_spec.update(template_spec)
    _pod_security_context(pod_spec, template_spec)
    affinity = _avoiding(_gang_affinity(job, spec, template_spec.get("affinity")), avoid_nodes)
    if affinity:
        pod_spec["affinity"] = affinity
    pod_spec["volumes"] = _merge_volumes(
        _volumes(spec, job, default_shm_size), template_spec.get("volumes") or []
    )
    if spec.checkpoint:
        _default_checkpoint_ownership(pod_spec)
    trainer = _merge_container(ours, theirs)
    _add_scratch(pod_spec, trainer, runs_default_image(spec, theirs.get("image")))
    pod_spec["containers"] = [trainer, *sidecars]
    _add_hostfile_writer(job, namespace, spec, pod_spec, trainer)
    # Identity: the gang depends on these, so no template may change them.
    pod_spec["restartPolicy"] = "Never"  # the operator restarts the whole gang
    pod_spec["hostname"] = name
    pod_spec["subdomain"] = names.service_name(job)
    group = podgroup.scheduling_group(job, spec, restart)
    if group:
        pod_spec["schedulingGroup"] = group

    group_labels, group_annotations = podgroup.pod_membership(job, spec)
    # No kueue.x-k8s.io/queue-name on the pods: Kueue admits the job as one
    # Workload (policy/kueue.py); with Kueue's pod integration a labelled
    # pod would be queued on its own, splitting the gang.
    pod_labels = dict(template_meta.labels or {}) if template_meta else {}
    pod_labels.update(group_labels)
    pod_labels.update(labels.pod_labels(job, role, node_rank, restart))
    annotations = dict(template_meta.annotations or {}) if template_meta else {}
    annotations.update(group_annotations)
    annotations.update(
        {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(contract.DEFAULT_METRICS_PORT),
            "prometheus.io/path": "/metrics",
        }
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": pod_labels,
            "annotations": annotations,
            "ownerReferences": [labels.owner_reference(job, uid)],
        },
        "spec": pod_spec,
    }
