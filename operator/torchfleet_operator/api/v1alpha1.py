"""TrainingJob v1alpha1: the models that are the only source of the CRD schema.

Field names are Kubernetes-style camelCase on the wire (aliases) and
snake_case in Python. Every field has a description: it becomes the
``kubectl explain`` text. Cross-field rules are :class:`Rule` objects, written
once as CEL for the API server and once in Python, side by side.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    StringConstraints,
    WithJsonSchema,
    field_validator,
)

from torchfleet_contract.trainer_config import TrainConfig
from torchfleet_operator.api import constants as c
from torchfleet_operator.api import podspec
from torchfleet_operator.api.base import (
    ApiModel,
    DnsSubdomain,
    LabelKey,
    LabelValue,
    Quantity,
    ResourceName,
    Rule,
    StatusModel,
    section,
    unique_list,
)
from torchfleet_operator.api.elastic import elastic_rules
from torchfleet_operator.api.shape import SpecShape
from torchfleet_operator.api.world import world_size_rules

# ---- pod templates ----------------------------------------------------------------------


class TemplateMetadata(ApiModel):
    """Labels and annotations added to the role's pods."""

    labels: dict[str, Annotated[str, StringConstraints(max_length=63)]] | None = Field(
        None, max_length=64, description="Labels added to the pods (the operator's own win)."
    )
    annotations: dict[str, Annotated[str, StringConstraints(max_length=4096)]] | None = Field(
        None, max_length=64, description="Annotations added to the pods."
    )


def _check_pod_spec(pod_spec: dict[str, Any]) -> dict[str, Any]:
    podspec.validate(pod_spec)
    return pod_spec


_POD_SPEC_DESCRIPTION = (
    "A core/v1 PodSpec merged over the operator's pod: fields such as nodeSelector, "
    "tolerations, affinity, volumes and serviceAccountName are taken as given; the "
    f"container named '{c.TRAINER_CONTAINER_NAME}' (created if absent) is merged with the "
    "job's image, command, env, resources, securityContext and mounts key by key, its own "
    "values winning; other containers are added as sidecars. Its env may not set the pod "
    "contract's variables (PET_*, TORCHFLEET_*, MASTER_ADDR, MASTER_PORT, NNODES, "
    "NODE_RANK, RANK, WORLD_SIZE, LOCAL_RANK). Schema: Kubernetes "
    f"{podspec.kubernetes_version()} PodSpec without descriptions (kubectl explain "
    'pod.spec); resource quantities are integers or strings ("500m", "0.5").'
)

# The API server's own PodSpec schema (podspec.py), so a bad template is refused at
# apply time naming the field; what no schema can check (a mount naming a missing
# volume) the operator's server-side dry-run of the first pod catches.
PodSpecFields = Annotated[
    dict[str, Any],
    AfterValidator(_check_pod_spec),
    WithJsonSchema(podspec.structural_schema(_POD_SPEC_DESCRIPTION)),
]


class PodTemplate(ApiModel):
    """A pod template merged over the operator's defaults for this role."""

    metadata: TemplateMetadata | None = Field(
        None, description="Labels and annotations for the role's pods."
    )
    spec: PodSpecFields | None = Field(None, description=_POD_SPEC_DESCRIPTION)


def trainer_and_sidecars(
    containers: list[dict[str, Any]],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A template's containers as the operator reads them: the one named
    'trainer' ({} where there is none) and the others, its sidecars."""
    name = c.TRAINER_CONTAINER_NAME
    trainer = next((each for each in containers if each.get("name") == name), {})
    return trainer, [each for each in containers if each.get("name") != name]


# ---- roles --------------------------------------------------------------------------------


_ONE_MASTER = "master.replicas must be 1: a job has exactly one master"


class MasterSpec(ApiModel):
    """The master role: exactly one pod, node rank 0, the rendezvous address."""

    replicas: int = Field(
        1,
        description="Number of master pods; always 1 (it hosts the rendezvous).",
        json_schema_extra={
            "x-kubernetes-validations": [{"rule": "self == 1", "message": _ONE_MASTER}]
        },
    )
    template: PodTemplate | None = Field(
        None, description="Pod template merged over the operator's defaults for the master."
    )

    @field_validator("replicas")
    @classmethod
    def _one_master(cls, replicas: int) -> int:
        if replicas != 1:
            raise ValueError(_ONE_MASTER)
        return replicas


class WorkerSpec(ApiModel):
    """The worker role: node ranks 1..replicas."""

    replicas: int = Field(
        0,
        ge=0,
        le=c.MAX_WORKERS,
        description="Number of worker pods (one node each). With spec.elastic it is the "
        "desired size, and may change while the job runs (within minNodes..maxNodes).",
    )
    template: PodTemplate | None = Field(
        None, description="Pod template merged over the operator's defaults for workers."
    )


# ---- resources ----------------------------------------------------------------------------


class ResourcesSpec(ApiModel):
    """What each pod (one per node) requests and is limited to."""

    gpus: int = Field(
        0, ge=0, le=c.MAX_GPUS_PER_NODE, description="GPUs per pod (requests = limits)."
    )
    gpu_resource_name: ResourceName = Field(
        c.DEFAULT_GPU_RESOURCE,
        description="Extended resource that counts GPUs, e.g. nvidia.com/gpu or amd.com/gpu.",
    )
    cpu: Quantity | None = Field(None, description="CPU per pod, e.g. 8 or 7500m.")
    memory: Quantity | None = Field(None, description="Memory per pod, e.g. 64Gi.")
    shm_size: Quantity | None = Field(
        None,
        description="Size of the memory-backed /dev/shm (NCCL and data-loader workers need "
        "more than the container runtime's 64Mi). Unset: as large as the pod's memory "
        "limit allows.",
    )


_PROCESSES_PER_NODE = "processesPerNode must be an integer 1..1024, 'gpu' or 'auto'"


def _check_processes_per_node(value: int | str) -> int | str:
    if isinstance(value, int) and 1 <= value <= 1024:
        return value
    if value in ("gpu", "auto"):
        return value
    raise ValueError(_PROCESSES_PER_NODE)


# processesPerNode: an integer, or "gpu"/"auto" (one per GPU; "auto" is 1 without GPUs).
ProcessesPerNode = Annotated[
    StrictInt | StrictStr,
    AfterValidator(_check_processes_per_node),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-validations": [
                {
                    "rule": "type(self) == int ? self >= 1 && self <= 1024 "
                    ": self == 'gpu' || self == 'auto'",
                    "message": _PROCESSES_PER_NODE,
                }
            ],
        }
    ),
]


# ---- network ------------------------------------------------------------------------------


_NCCL_NAME = "^NCCL_[A-Z0-9_]+$"
_NCCL_KEYS = "network.ncclEnv keys must be NCCL_* variable names (NCCL_ then A-Z, 0-9, _)"


# Variables that a network field sets, so ncclEnv may not set them as well.
_NCCL_VARIABLE_OF_FIELD = {
    "socketInterface": "NCCL_SOCKET_IFNAME",
    "ibHCAs": "NCCL_IB_HCA",
    "gidIndex": "NCCL_IB_GID_INDEX",
    "gpuDirectRDMALevel": "NCCL_NET_GDR_LEVEL",
}
_RDMA_FIELDS = ("ibHCAs", "gidIndex", "gpuDirectRDMALevel", "rdmaResources")


def _wire_value(model: BaseModel, wire_name: str) -> Any:
    """A field's value looked up by its camelCase (wire) name."""
    for name, info in type(model).model_fields.items():
        if (info.alias or name) == wire_name:
            return getattr(model, name)
    raise KeyError(wire_name)


def _nccl_env_leaves_alone(field: str, variable: str) -> Rule:
    def check(network: NetworkSpec) -> bool:
        return _wire_value(network, field) is None or variable not in (network.nccl_env or {})

    return Rule(
        cel=f"!has(self.{field}) || !has(self.ncclEnv) || !('{variable}' in self.ncclEnv)",
        message=f"network.ncclEnv.{variable} conflicts with network.{field}: set one",
        check=check,
        field_path=".ncclEnv",
    )


def _needs_rdma_transport(field: str) -> Rule:
    def check(network: NetworkSpec) -> bool:
        return network.transport != "tcp" or _wire_value(network, field) is None

    return Rule(
        cel=f"self.transport != 'tcp' || !has(self.{field})",
        message=f"network.{field} needs an RDMA transport, not transport tcp",
        check=check,
        field_path=f".{field}",
    )


# ASCII classes, never \w: pydantic's regex engine reads \w as Unicode, the API
# server's (RE2) as ASCII, and the two must agree.
_INTERFACE_LIST = r"^[=^]?[A-Za-z0-9_.:-]+(,[A-Za-z0-9_.:-]+)*$"
_HCA = r"^[A-Za-z0-9_.-]+(:[0-9]+)?$"

# With an RDMA transport the operator sets these itself (NCCL_NET=IB makes NCCL
# fail fast instead of falling back to sockets), so ncclEnv may not.
_TRANSPORT_VARIABLES = ("NCCL_NET", "NCCL_IB_DISABLE")
_RDMA_TRANSPORTS = ("infiniband", "roce")


def _nccl_env_leaves_transport_alone() -> Rule:
    names = ", ".join(_TRANSPORT_VARIABLES)
    in_env = " || ".join(f"'{name}' in self.ncclEnv" for name in _TRANSPORT_VARIABLES)

    def check(network: NetworkSpec) -> bool:
        return network.transport == "auto" or not set(_TRANSPORT_VARIABLES) & set(
            network.nccl_env or {}
        )

    return Rule(
        cel=f"self.transport == 'auto' || !has(self.ncclEnv) || !({in_env})",
        message=f"network.ncclEnv may not set {names} when network.transport is not auto "
        "(the transport sets them)",
        check=check,
        field_path=".ncclEnv",
    )


class NetworkSpec(ApiModel):
    """How ranks talk: transport, NICs, RDMA, NCCL environment."""

    transport: Literal["auto", "tcp", "infiniband", "roce"] = Field(
        "auto",
        description="Inter-node transport. 'auto' lets NCCL pick; 'tcp' disables IB "
        "(NCCL_IB_DISABLE=1); 'infiniband' and 'roce' require the IB transport "
        "(NCCL_NET=IB: NCCL fails at start rather than falling back to sockets). Pod "
        "Security: tcp and auto pods pass the restricted level; with rdmaResources the "
        "pods add the IPC_LOCK capability, which needs the privileged level (baseline "
        "allows no added capability beyond its default set).",
    )
    socket_interface: (
        Annotated[str, StringConstraints(max_length=256, pattern=_INTERFACE_LIST)] | None
    ) = Field(
        None,
        description="Interface(s) for bootstrap and socket traffic, NCCL syntax "
        "(e.g. eth0, eth0,eth1, ^lo,docker, =ib0); sets NCCL_SOCKET_IFNAME. A plain list "
        "of exact names also sets GLOO_SOCKET_IFNAME; NCCL's ^ (exclude) and = (exact) "
        "forms do not, since gloo reads only interface names and would fail to start.",
    )
    ib_hcas: list[Annotated[str, StringConstraints(max_length=64, pattern=_HCA)]] | None = Field(
        None,
        alias="ibHCAs",
        min_length=1,
        max_length=32,
        description="InfiniBand/RoCE adapters (and optional port) to use, e.g. mlx5_0:1; "
        "sets NCCL_IB_HCA (matched as ibHCAMatch says).",
    )
    ib_hca_match: Literal["Exact", "Prefix"] = Field(
        "Exact",
        alias="ibHCAMatch",
        description="How NCCL matches ibHCAs: Exact (NCCL_IB_HCA gets NCCL's '=' prefix, so "
        "mlx5_1 is only mlx5_1) or Prefix (NCCL's default: mlx5_1 also selects "
        "mlx5_10..mlx5_19).",
    )
    gid_index: int | None = Field(
        None, ge=0, le=255, description="RoCE GID index; sets NCCL_IB_GID_INDEX."
    )
    gpu_direct_rdma_level: Literal["LOC", "PIX", "PXB", "PHB", "SYS"] | None = Field(
        None,
        alias="gpuDirectRDMALevel",
        description="Farthest PCI distance at which GPUDirect RDMA is used; sets "
        "NCCL_NET_GDR_LEVEL.",
    )
    rdma_resources: dict[ResourceName, Annotated[int, Field(ge=1, le=1024)]] | None = Field(
        None,
        max_length=8,
        description="RDMA device-plugin resources requested per pod, e.g. {rdma/ib: 8}.",
    )
    host_network: bool = Field(
        False, description="Run the pods in the node's network namespace (opt-in)."
    )
    nccl_env: (
        dict[
            Annotated[str, StringConstraints(max_length=128)],
            Annotated[str, StringConstraints(max_length=1024)],
        ]
        | None
    ) = Field(
        None,
        max_length=64,
        description="Extra NCCL_* environment variables for every pod; only the NCCL_ "
        "prefix is accepted, and none that a field above sets.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": f"self.all(k, k.matches('{_NCCL_NAME}'))", "message": _NCCL_KEYS}
            ]
        },
    )

    @field_validator("nccl_env")
    @classmethod
    def _only_nccl_variables(cls, env: dict[str, str] | None) -> dict[str, str] | None:
        if env is not None and not all(re.fullmatch(_NCCL_NAME, key) for key in env):
            raise ValueError(_NCCL_KEYS)
        return env

    rules = (
        *(_nccl_env_leaves_alone(field, var) for field, var in _NCCL_VARIABLE_OF_FIELD.items()),
        *(_needs_rdma_transport(field) for field in _RDMA_FIELDS),
        _nccl_env_leaves_transport_alone(),
    )


# ---- checkpoints --------------------------------------------------------------------------

AccessMode = Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"]


class ClaimTemplate(ApiModel):
    """A PersistentVolumeClaim the operator creates for the job and owns."""

    storage_class_name: DnsSubdomain | None = Field(
        None, description="StorageClass of the claim; unset uses the cluster default."
    )
    size: Quantity = Field(description="Requested capacity, e.g. 500Gi.")
    access_modes: unique_list(AccessMode) = Field(  # type: ignore[valid-type]
        ["ReadWriteMany"],  # a plain default (not a factory) so the CRD carries it
        min_length=1,
        max_length=3,
        description="Access modes; every node writes its shards, so more than one node "
        "needs ReadWriteMany.",
    )
    retention_policy: Literal["Delete", "Retain"] = Field(
        "Delete",
        description="Delete: the claim goes with the job (owner reference). Retain: it "
        "outlives the job, for a later job to resume from.",
    )


class CheckpointSpec(ApiModel):
    """Where checkpoints live and how often they are written."""

    claim_name: DnsSubdomain | None = Field(
        None, description="An existing PersistentVolumeClaim to mount (or set claimTemplate)."
    )
    claim_template: ClaimTemplate | None = Field(
        None, description="A claim the operator creates and owns (or set claimName)."
    )
    mount_path: Annotated[
        str, StringConstraints(max_length=1024, pattern=r"^(/[A-Za-z0-9._-]+)+$")
    ] = Field(
        c.DEFAULT_CHECKPOINT_MOUNT_PATH,
        description="Absolute path of the volume in every pod; exported as "
        "TORCHFLEET_CHECKPOINT_DIR.",
    )
    interval_steps: int | None = Field(
        None,
        ge=1,
        le=10_000_000,
        description="Save every this many steps; exported to the pods as "
        "TORCHFLEET_CHECKPOINT_INTERVAL and, for torchfleet-train, taking precedence over "
        "trainer.checkpoint.interval.",
    )
    keep_last: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="Complete checkpoints kept; exported as TORCHFLEET_CHECKPOINT_KEEP and, "
        "for torchfleet-train, taking precedence over trainer.checkpoint.keepLast.",
    )

    rules = (
        Rule(
            cel="has(self.claimName) != has(self.claimTemplate)",
            message="checkpoint: set exactly one of claimName (an existing claim) and "
            "claimTemplate (a claim the operator creates)",
            check=lambda s: (s.claim_name is None) != (s.claim_template is None),
            field_path=".claimName",
        ),
    )


# ---- run policy ---------------------------------------------------------------------------

ExitCode = Annotated[int, Field(ge=1, le=255)]


class StragglerPolicy(ApiModel):
    """A node that computes slower than the gang's median (policy/health.py)."""

    threshold: float = Field(
        1.3,
        gt=1.0,
        le=100.0,
        description="A node whose straggler score (its compute time per step over the "
        "median node's) is above this is slow in that log interval.",
    )
    windows: int = Field(
        3,
        ge=1,
        le=1000,
        description="Log intervals in a row a node must be slow before it is reported.",
    )
    action: Literal["Report", "Replace"] = Field(
        "Report",
        description="Report: the Straggler condition and an event. Replace: also restart "
        "the gang away from the node (this job's pods avoid it; the node is not touched), "
        "as a disruption; also for a node that fails trainer.preflight.",
    )
    max_replacements: int = Field(
        3,
        ge=0,
        le=1000,
        description="Gang restarts action Replace may make over the job's life "
        "(status.health.replacements). A Replace is a disruption, never counted toward "
        "backoffLimit, so this bounds a detector that keeps naming healthy nodes: once spent, "
        "a slow node is only reported, and its condition says so (reason "
        "MaxReplacementsReached). 0: Replace only reports.",
    )


class StallPolicy(ApiModel):
    """A gang whose step counter stands still while it trains (policy/health.py)."""

    step_time_multiple: float = Field(
        20.0,
        ge=2.0,
        le=100000.0,
        description="Stalled: the step stood still this many mean step times (at least "
        "minSeconds) while training (not starting, evaluating or saving).",
    )
    min_seconds: int = Field(
        300,
        ge=5,
        le=2**31 - 1,
        description="The shortest stall reported.",
    )
    action: Literal["Report", "Restart"] = Field(
        "Report",
        description="Report: the Stalled condition and an event. Restart: also restart the "
        "gang, counted toward backoffLimit.",
    )


class RunPolicy(ApiModel):
    """Restarts, deadlines and clean-up."""

    backoff_limit: int = Field(
        3,
        ge=0,
        le=1000,
        description="Gang restarts allowed before the job fails; every restart recreates "
        "all pods and resumes from the last checkpoint.",
    )
    restart_policy: Literal["OnFailure", "Never", "ExitCode"] = Field(
        "OnFailure",
        description="OnFailure: any failure restarts the gang. Never: the first failure "
        "fails the job. ExitCode: exit codes 1-127 are permanent (the job fails), 128 and "
        "above (signals: OOM kill, preemption) are retryable.",
    )
    retryable_exit_codes: unique_list(ExitCode) | None = Field(  # type: ignore[valid-type]
        None,
        max_length=255,
        description="Exit codes that always restart the gang, overriding restartPolicy's "
        "classification.",
    )
    permanent_exit_codes: unique_list(ExitCode) | None = Field(  # type: ignore[valid-type]
        None,
        max_length=255,
        description="Exit codes that always fail the job, overriding restartPolicy's "
        "classification.",
    )
    active_deadline_seconds: int | None = Field(
        None,
        ge=1,
        le=2**31 - 1,
        description="Fail the job this long after it started running, restarts included.",
    )
    ttl_seconds_after_finished: int | None = Field(
        None,
        ge=0,
        le=2**31 - 1,
        description="Delete the job this long after it succeeded or failed.",
    )
    clean_pod_policy: Literal["All", "Running", "None"] = Field(
        "Running",
        description="Pods deleted when the job finishes: All, Running (still running ones; "
        "finished pods stay for their logs) or None.",
    )
    success_policy: Literal["Master", "AllWorkers"] = Field(
        "Master",
        description="Master: the job succeeds when the master pod succeeds. AllWorkers: "
        "when the master and every worker have succeeded.",
    )
    termination_grace_period_seconds: int | None = Field(
        None,
        ge=1,
        le=c.MAX_TERMINATION_GRACE_SECONDS,
        description="Seconds every pod gets between SIGTERM (preemption, suspension, "
        "deletion) and SIGKILL, for the trainer's checkpoint save; set as each pod's "
        "terminationGracePeriodSeconds. Unset: a role template's "
        "spec.terminationGracePeriodSeconds for its pods, else "
        f"{c.DEFAULT_TERMINATION_GRACE_SECONDS}. A template that sets a different value "
        "is refused. Give a big model its save time (torchfleet_checkpoint_save_seconds) "
        "plus a step or two.",
    )
    in_place_restarts: int | None = Field(
        None,
        ge=0,
        le=1000,
        description="Failures of the program a fixed gang of the built-in trainer recovers "
        "from in place: each pod's launcher restarts its processes, the gang meets in a new "
        "rendezvous round and resumes from the last checkpoint, with no new pods. Counted "
        "toward backoffLimit (status.inPlaceRestarts). Spent, or a pod or node lost: a gang "
        "restart. 0: every failure is a gang restart. Unset: "
        f"{c.DEFAULT_IN_PLACE_RESTARTS} (at most backoffLimit; 0 under restartPolicy Never) "
        "for a fixed gang of the built-in trainer, 0 for an elastic job or a command of "
        "your own, which restart through their own launchers.",
    )
    stragglers: StragglerPolicy = section(
        StragglerPolicy,
        "Straggler detection from torchfleet-train's per-node compute time.",
    )
    stall: StallPolicy = section(
        StallPolicy, "Hang detection: a step that stands still while training."
    )

    rules = (
        Rule(
            cel="!has(self.retryableExitCodes) || !has(self.permanentExitCodes) || "
            "!self.retryableExitCodes.exists(x, x in self.permanentExitCodes)",
            message="runPolicy: an exit code cannot be in both retryableExitCodes and "
            "permanentExitCodes",
            check=lambda r: (
                not set(r.retryable_exit_codes or ()) & set(r.permanent_exit_codes or ())
            ),
            field_path=".retryableExitCodes",
        ),
        Rule(
            cel="self.restartPolicy != 'Never' || !has(self.retryableExitCodes)",
            message="runPolicy.retryableExitCodes cannot be used with restartPolicy Never",
            check=lambda r: r.restart_policy != "Never" or r.retryable_exit_codes is None,
            field_path=".retryableExitCodes",
        ),
    )


# ---- scheduling ---------------------------------------------------------------------------


class TopologySpec(ApiModel):
    """Pack the job's pods into one topology domain (rack, block, zone). Queued in
    Kueue, it is also the Workload's topology request (Kueue's topology-aware
    scheduling): Kueue admits the gang only where the domain has room and the
    pods are created on the nodes it assigned."""

    key: LabelKey = Field(
        description="Node label naming the domain (the topology level), e.g. "
        "topology.kubernetes.io/zone or cloud.provider.com/topology-block. Queued in "
        "Kueue, it must be a level of the Topology of the ResourceFlavor it admits from.",
    )
    mode: Literal["Preferred", "Required"] = Field(
        "Preferred",
        description="Preferred: a scheduling preference. Required: every pod must land in "
        "the same domain (a hard podAffinity). With a gang scheduler (podGroup Coscheduling "
        "or Volcano) that means all pods in one domain or none bound. Without one the "
        "default scheduler places pods one at a time: the first pod picks the domain, and "
        "pods that do not fit there stay Pending while the placed ones hold their GPUs. "
        "Queued in Kueue: the PodSets' topologyRequest.required or .preferred; Required "
        "waits in the queue (Kueue's reason in the QuotaReserved condition) until one "
        "domain holds the whole gang, Preferred lets Kueue go up a level and spread it.",
    )


class SchedulingSpec(ApiModel):
    """Which scheduler places the pods and how they are gang-scheduled."""

    scheduler_name: DnsSubdomain | None = Field(
        None,
        description="Scheduler for the pods; unset: 'volcano' with podGroup Volcano, "
        "otherwise the cluster default (scheduler-plugins installed as the only scheduler "
        "runs Coscheduling under the default name; installed as a second scheduler, name "
        "it here, e.g. scheduler-plugins-scheduler). A role template's "
        "spec.schedulerName must agree with it.",
    )
    pod_group: Literal["None", "Coscheduling", "Volcano", "Kubernetes"] = Field(
        "None",
        description="Gang scheduling: the PodGroup kind created for the job, with "
        "minMember = every pod. Coscheduling: scheduling.x-k8s.io; Volcano: "
        "scheduling.volcano.sh; Kubernetes: kube-scheduler's own (scheduling.k8s.io/v1beta1 on "
        "Kubernetes 1.37, v1alpha2 on 1.36: the one the cluster serves).",
    )
    schedule_timeout_seconds: int | None = Field(
        None,
        ge=1,
        le=2**31 - 1,
        description="Coscheduling: how long the gang's placed pods wait at the scheduler "
        "for their siblings before the whole gang is released and retried (the PodGroup's "
        "scheduleTimeoutSeconds); unset: 300. Volcano's PodGroup has no timeout: its gang "
        "waits in its queue until it fits as a whole.",
    )
    queue_name: LabelValue | None = Field(
        None,
        description="Kueue LocalQueue to admit the job from (like the "
        f"{c.KUEUE_QUEUE_LABEL} label on the job): no pods until Kueue admits its "
        "Workload. With podGroup Volcano it names the PodGroup's Volcano queue instead.",
    )
    priority_class_name: DnsSubdomain | None = Field(
        None, description="PriorityClass of the pods (and of the PodGroup)."
    )
    topology: TopologySpec | None = Field(
        None, description="Topology packing hint for the whole gang."
    )

    rules = (
        Rule(
            cel="self.podGroup == 'Coscheduling' || !has(self.scheduleTimeoutSeconds)",
            message="scheduling.scheduleTimeoutSeconds needs podGroup Coscheduling (Volcano's "
            "PodGroup has no timeout)",
            check=lambda s: s.pod_group == "Coscheduling" or s.schedule_timeout_seconds is None,
            field_path=".scheduleTimeoutSeconds",
        ),
    )

    @property
    def resolved_scheduler_name(self) -> str | None:
        """The pods' scheduler; None leaves it to the cluster's default."""
        if self.scheduler_name:
            return self.scheduler_name
        return c.VOLCANO_SCHEDULER if self.pod_group == "Volcano" else None


# ---- elastic training ---------------------------------------------------------------------


class ElasticSpec(ApiModel):
    """Elastic training: the job keeps running between minNodes and maxNodes nodes."""

    min_nodes: int = Field(
        ge=1,
        le=1 + c.MAX_WORKERS,
        description="Fewest nodes (pods) the job trains on. While at least this many of the "
        "gang run, a lost worker pod is recreated alone and the survivors keep training "
        "(torchrun's c10d rendezvous re-forms the world); losing the master, which hosts the "
        "rendezvous, restarts the whole gang. A gang scheduler's PodGroup gets minMember = "
        "minNodes.",
    )
    max_nodes: int = Field(
        ge=1,
        le=1 + c.MAX_WORKERS,
        description="Most nodes the job trains on; the desired size (1 + worker.replicas) "
        "lies between minNodes and maxNodes.",
    )
    max_restarts: int = Field(
        3,
        ge=0,
        le=1000,
        description="Worker pods the operator may recreate (a failed, evicted or lost worker "
        "replaced alone) before the job fails with reason ElasticRestartsExceeded; also "
        "torchrun's --max-restarts (PET_MAX_RESTARTS) for each node's agent.",
    )

    rules = (
        Rule(
            cel="self.minNodes <= self.maxNodes",
            message="elastic.minNodes must not exceed elastic.maxNodes",
            check=lambda e: e.min_nodes <= e.max_nodes,
            field_path=".minNodes",
        ),
    )


# ---- the spec -----------------------------------------------------------------------------


def _template_scheduler_agrees(role: str) -> Rule:
    """A role template's schedulerName may not send the gang past its gang scheduler."""

    def check(spec: Any) -> bool:
        template = getattr(spec, role).template
        theirs = ((template.spec if template else None) or {}).get("schedulerName")
        ours = spec.scheduling.resolved_scheduler_name
        return theirs is None or ours is None or theirs == ours

    pod_spec = f"self.{role}.template.spec"
    ours = (
        "(has(self.scheduling.schedulerName) ? self.scheduling.schedulerName : "
        f"self.scheduling.podGroup == 'Volcano' ? '{c.VOLCANO_SCHEDULER}' : '')"
    )
    return Rule(
        cel=f"!has(self.{role}.template) || !has({pod_spec}) || "
        f"!has({pod_spec}.schedulerName) || {ours} == '' || "
        f"{pod_spec}.schedulerName == {ours}",
        message=f"spec.{role}.template.spec.schedulerName contradicts spec.scheduling "
        "(schedulerName, or 'volcano' for podGroup Volcano): set the scheduler in "
        "spec.scheduling.schedulerName only",
        check=check,
        field_path=f".{role}.template.spec.schedulerName",
    )


def _template_grace_agrees(role: str) -> Rule:
    """A role template's terminationGracePeriodSeconds may not contradict the job's."""
    field = "terminationGracePeriodSeconds"

    def check(spec: Any) -> bool:
        template = getattr(spec, role).template
        theirs = ((template.spec if template else None) or {}).get(field)
        ours = spec.run_policy.termination_grace_period_seconds
        return theirs is None or ours is None or theirs == ours

    pod_spec = f"self.{role}.template.spec"
    return Rule(
        cel=f"!has(self.runPolicy.{field}) || !has(self.{role}.template) || "
        f"!has({pod_spec}) || !has({pod_spec}.{field}) || "
        f"{pod_spec}.{field} == self.runPolicy.{field}",
        message=f"spec.{role}.template.spec.{field} contradicts "
        f"spec.runPolicy.{field}: set one of them, or both to the same value",
        check=check,
        field_path=f".{role}.template.spec.{field}",
    )


# Fields that shape the pods: changing them would need new pods, so they may
# change only while the job is suspended (Kueue rewrites them then).
IMMUTABLE_WHILE_RUNNING = (
    "image",
    "processesPerNode",
    "resources",
    "master",
    "worker",
    "network",
    "checkpoint",
    "trainer",
    "command",
    "args",
    "elastic",
)


def _worker_resizes_only_when_elastic() -> Rule:
    """spec.worker shapes the pods, so it is fixed while the job runs; an elastic
    job's worker.replicas alone may change (the elastic rules keep it within
    minNodes..maxNodes): the operator adds or removes workers in the same gang."""
    same_template = (
        "has(self.worker.template) == has(oldSelf.worker.template) && "
        "(!has(self.worker.template) || self.worker.template == oldSelf.worker.template)"
    )
    return Rule(
        cel="oldSelf.suspend || (has(self.worker) == has(oldSelf.worker) && "
        "(!has(self.worker) || self.worker == oldSelf.worker || "
        f"(has(self.elastic) && has(oldSelf.elastic) && {same_template})))",
        message="spec.worker may change only while the job is suspended "
        "(an elastic job's worker.replicas may change while it runs)",
        check=None,
        field_path=".worker",
        reason="FieldValueForbidden",
    )


def _managed_by_is_immutable() -> Rule:
    """spec.managedBy is fixed at creation (KEP-4368): set, changed or removed
    later, two controllers would each take the other's job for their own."""
    return Rule(
        cel="has(self.managedBy) == has(oldSelf.managedBy) && "
        "(!has(self.managedBy) || self.managedBy == oldSelf.managedBy)",
        message="spec.managedBy is immutable: it cannot be set, changed or removed "
        "after the job is created",
        check=None,
        field_path=".managedBy",
        reason="FieldValueInvalid",
    )


# Set by torchrun per process, so wrong in a pod's command when it runs several.
_PER_PROCESS_VARIABLES = ("$(RANK)", "$(WORLD_SIZE)")
_PER_PROCESS_MESSAGE = (
    "spec.command/spec.args use $(RANK) or $(WORLD_SIZE), which are per process and set "
    "by torchrun, while processesPerNode is not 1: use $(NODE_RANK)/$(NNODES), or plain "
    "`torchrun train.py` (it reads the pod's PET_* variables)"
)


# DeepSpeed's launcher reaches the other hosts of its hostfile over ssh (pdsh)
# unless told --no_ssh; in a TrainingJob every pod runs the command for its own
# node, which --no_ssh with that pod's --node_rank does.
_DEEPSPEED_MESSAGE = (
    "spec.command runs DeepSpeed's launcher on several nodes (or with --hostfile) without "
    "--no_ssh and --node_rank: every pod runs the command for its own node, so add "
    "--no_ssh --node_rank=$(NODE_RANK) --master_port=$(MASTER_PORT) (README, Launchers)"
)


def _deepspeed_launches_its_own_node() -> Rule:
    words = "((has(self.command) ? self.command : []) + (has(self.args) ? self.args : []))"
    launcher = (
        "has(self.command) && size(self.command) > 0 && "
        "(self.command[0] == 'deepspeed' || self.command[0].endsWith('/deepspeed'))"
    )
    several = f"(self.worker.replicas > 0 || {words}.exists(a, a.startsWith('--hostfile')))"
    own_node = (
        f"({words}.exists(a, a == '--no_ssh') && {words}.exists(a, a.startsWith('--node_rank')))"
    )

    def check(spec: TrainingJobSpec) -> bool:
        if not spec.command or PurePosixPath(spec.command[0]).name != "deepspeed":
            return True
        words = [*spec.command, *(spec.args or ())]
        several = spec.worker.replicas > 0 or any(w.startswith("--hostfile") for w in words)
        return not several or (
            "--no_ssh" in words and any(w.startswith("--node_rank") for w in words)
        )

    return Rule(
        cel=f"!({launcher}) || !{several} || {own_node}",
        message=_DEEPSPEED_MESSAGE,
        check=check,
        field_path=".command",
    )


def _runtime_ref_is_immutable() -> Rule:
    """spec.runtimeRef is fixed at creation: the runtime is resolved once, when
    the job is first reconciled, and the job keeps what it resolved to."""
    return Rule(
        cel="has(self.runtimeRef) == has(oldSelf.runtimeRef) && "
        "(!has(self.runtimeRef) || self.runtimeRef == oldSelf.runtimeRef)",
        message="spec.runtimeRef is immutable: it cannot be set, changed or removed "
        "after the job is created",
        check=None,
        field_path=".runtimeRef",
        reason="FieldValueInvalid",
    )


class RuntimeRef(ApiModel):
    """The TrainingRuntime or ClusterTrainingRuntime a job takes its defaults from."""

    kind: Literal["TrainingRuntime", "ClusterTrainingRuntime"] = Field(
        c.CLUSTER_RUNTIME_KIND,
        description="TrainingRuntime (in the job's namespace) or ClusterTrainingRuntime.",
    )
    name: DnsSubdomain = Field(description="The runtime's name.")


# The container image of every pod (a job's, or a runtime's default).
Image = Annotated[str, StringConstraints(min_length=1, max_length=512)]


class TrainingJobSpec(ApiModel):
    """A gang of one master and N workers running distributed PyTorch."""

    image: Image | None = Field(
        None,
        description="Container image of every pod; unset: the trainer image the operator "
        "is configured with. A role's template may override it.",
    )
    processes_per_node: ProcessesPerNode = Field(
        "auto",
        description="Processes (ranks) per pod: an integer, 'gpu' (one per GPU) or 'auto' "
        "(one per GPU, 1 without GPUs).",
    )
    resources: ResourcesSpec = section(ResourcesSpec, "Resources of every pod (one per node).")
    master: MasterSpec = section(MasterSpec, "The master role (node rank 0).")
    worker: WorkerSpec = section(WorkerSpec, "The worker role (node ranks 1..replicas).")
    trainer: TrainConfig | None = Field(
        None,
        description="Config of the built-in trainer (torchfleet-train), which runs when "
        "no command is given; unset: the trainer's defaults.",
    )
    command: list[Annotated[str, StringConstraints(max_length=4096)]] | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="Bring your own entrypoint instead of torchfleet-train, e.g. "
        "[torchrun, train.py]; torchrun reads its PET_* variables from the pod.",
    )
    args: list[Annotated[str, StringConstraints(max_length=4096)]] | None = Field(
        None, max_length=256, description="Arguments to command."
    )
    network: NetworkSpec = section(NetworkSpec, "Transport, NICs, RDMA and NCCL settings.")
    checkpoint: CheckpointSpec | None = Field(
        None,
        description=(
            "Checkpoint volume and cadence; unset: no checkpoint volume. Pods that mount it get "
            "securityContext.fsGroup 1000 with fsGroupChangePolicy OnRootMismatch, so a non-root "
            "trainer can write a root-owned volume, unless the role template sets fsGroup."
        ),
    )
    run_policy: RunPolicy = section(RunPolicy, "Restarts, deadlines and clean-up.")
    elastic: ElasticSpec | None = Field(
        None,
        description="Elastic training (torchrun's c10d rendezvous between minNodes and "
        "maxNodes): a lost worker is replaced alone while the rest keep training; unset: a "
        "fixed gang, restarted as a whole on any failure. With torchfleet-train the "
        "data-parallel degree is the elastic one (parallel.dataParallelShard -1) and the "
        "global batch stays fixed at every size.",
    )
    scheduling: SchedulingSpec = section(SchedulingSpec, "Scheduler, gang, queue, priority.")
    suspend: bool = Field(
        False,
        description="Suspended jobs have no pods (running ones are deleted). A job "
        "queued in Kueue waits for its Workload's admission instead (status conditions "
        "QuotaReserved and Admitted).",
    )
    managed_by: Annotated[str, StringConstraints(max_length=c.MAX_MANAGED_BY_LENGTH)] | None = (
        Field(
            None,
            description=f"The controller that runs this job; immutable, as a Job's and a "
            f"JobSet's. Unset, empty or '{c.MANAGED_BY_OPERATOR}': this operator. "
            f"'{c.MANAGED_BY_MULTIKUEUE}': Kueue's MultiKueue dispatches the job to a worker "
            "cluster and mirrors its status back. Any other value: another controller. This "
            "operator creates no pods, Services, claims or PodGroups for a job managed "
            "elsewhere and never writes its status (the other controller owns it).",
        )
    )

    runtime_ref: RuntimeRef | None = Field(
        None,
        description="A TrainingRuntime or ClusterTrainingRuntime whose spec fills in what "
        "this job leaves out (docs/tasks/runtimes.md): the job's fields win, pod templates "
        "merge by container name, env by variable name, volumes by name. Resolved once, "
        "when the job is first reconciled, and recorded in status.runtime; immutable.",
    )

    rules = (
        Rule(
            cel="!has(self.trainer) || !has(self.command)",
            message="set spec.trainer (torchfleet-train) or spec.command (your own "
            "entrypoint), not both",
            check=lambda s: s.trainer is None or s.command is None,
            field_path=".command",
        ),
        Rule(
            cel="!has(self.args) || has(self.command)",
            message="spec.args needs spec.command",
            check=lambda s: s.args is None or s.command is not None,
            field_path=".args",
        ),
        Rule(
            cel="self.processesPerNode != 'gpu' || self.resources.gpus > 0",
            message="processesPerNode 'gpu' needs resources.gpus > 0",
            check=lambda s: s.processes_per_node != "gpu" or s.resources.gpus > 0,
            field_path=".processesPerNode",
        ),
        Rule(
            cel="self.runPolicy.successPolicy != 'AllWorkers' || self.worker.replicas > 0",
            message="runPolicy.successPolicy AllWorkers needs worker.replicas > 0",
            check=lambda s: s.run_policy.success_policy != "AllWorkers" or s.worker.replicas > 0,
            field_path=".runPolicy.successPolicy",
        ),
        Rule(
            cel=f"self.processesPerNode == 1 || "
            f"((self.processesPerNode == 'auto' || self.processesPerNode == 'gpu') && "
            f"self.resources.gpus <= 1) || "
            f"((has(self.command) ? self.command : []) + (has(self.args) ? self.args : []))"
            f".all(a, {' && '.join(f'!a.contains({v!r})' for v in _PER_PROCESS_VARIABLES)})",
            message=_PER_PROCESS_MESSAGE,
            check=lambda s: (
                s.resolved_processes_per_node == 1
                or not any(
                    v in a
                    for a in [*(s.command or ()), *(s.args or ())]
                    for v in _PER_PROCESS_VARIABLES
                )
            ),
            field_path=".command",
        ),
        Rule(
            cel="!has(self.runPolicy.inPlaceRestarts) || self.runPolicy.inPlaceRestarts == 0 "
            "|| (!has(self.command) && !has(self.elastic))",
            message="runPolicy.inPlaceRestarts needs a fixed gang of the built-in trainer (no "
            "spec.command; an elastic job restarts in place through elastic.maxRestarts)",
            check=lambda s: (
                not s.run_policy.in_place_restarts or (s.command is None and s.elastic is None)
            ),
            field_path=".runPolicy.inPlaceRestarts",
        ),
        _deepspeed_launches_its_own_node(),
        *world_size_rules(),
        *elastic_rules(),
        *(_template_scheduler_agrees(role) for role in ("master", "worker")),
        *(_template_grace_agrees(role) for role in ("master", "worker")),
        *(
            Rule(
                cel=f"oldSelf.suspend || (has(self.{field}) == has(oldSelf.{field}) && "
                f"(!has(self.{field}) || self.{field} == oldSelf.{field}))",
                message=f"spec.{field} may change only while the job is suspended",
                check=None,
                field_path=f".{field}",
                reason="FieldValueForbidden",
            )
            for field in IMMUTABLE_WHILE_RUNNING
            if field != "worker"
        ),
        _worker_resizes_only_when_elastic(),
        _managed_by_is_immutable(),
        _runtime_ref_is_immutable(),
    )

    # ---- derived values the operator uses ----

    @property
    def nodes(self) -> int:
        """Pods (= nodes) in the gang: the master plus the workers."""
        return self.master.replicas + self.worker.replicas

    @property
    def resolved_processes_per_node(self) -> int:
        """Ranks per pod: 'gpu'/'auto' mean one per GPU; 'auto' is 1 on CPU."""
        if isinstance(self.processes_per_node, int):
            return self.processes_per_node
        return self.resources.gpus if self.resources.gpus > 0 else 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.resolved_processes_per_node

    @property
    def in_place_restarts(self) -> int:
        """The gang's in-place budget: runPolicy.inPlaceRestarts, or where unset
        the default for a fixed gang of the built-in trainer, within what the
        run policy would retry at all."""
        policy = self.run_policy
        if policy.in_place_restarts is not None:
            return policy.in_place_restarts
        if self.command is not None or self.elastic is not None:
            return 0
        if policy.restart_policy == "Never":
            return 0
        return min(c.DEFAULT_IN_PLACE_RESTARTS, policy.backoff_limit)

    @property
    def is_elastic(self) -> bool:
        return self.elastic is not None

    @property
    def runs_trainer(self) -> bool:
        """True when the pods run torchfleet-train (no command of the user's own)."""
        return self.command is None


def _has_the_rules_shape(spec: TrainingJobSpec) -> SpecShape:
    """Never called: mypy checks here that the model is what its rules read."""
    return spec


# ---- status -------------------------------------------------------------------------------


class Condition(StatusModel):
    """A Kubernetes-style condition (metav1.Condition)."""

    type: Annotated[str, StringConstraints(max_length=316)] = Field(
        description="Condition type. Lifecycle: Created, Running, Restarting, Suspended, "
        "Succeeded, Failed. Scheduled (False: a pod waits for the scheduler) and "
        "GangScheduled (the PodGroup's phase). ChildrenRejected (the apiserver refused a "
        "child). SpecNotUnderstood (the stored spec no longer parses; the job goes on). "
        "Kueue: QuotaReserved, Admitted, Evicted. Node health: Straggler, Preflight, Stalled. "
        "RuntimeResolved (spec.runtimeRef; False with RuntimeNotFound: the job waits)."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: Annotated[str, StringConstraints(max_length=1024)] | None = Field(
        None, description="CamelCase reason for the last transition, e.g. InvalidSpec."
    )
    message: Annotated[str, StringConstraints(max_length=32768)] | None = Field(
        None, description="Human-readable details."
    )
    last_transition_time: datetime | None = Field(None, description="When status last changed.")
    observed_generation: int | None = Field(
        None, ge=0, description="metadata.generation the condition was computed from."
    )


class ReplicaStatus(StatusModel):
    """Pod counts of one role."""

    active: int = Field(0, ge=0, description="Pods pending or running.")
    ready: int = Field(0, ge=0, description="Pods running and ready.")
    succeeded: int = Field(0, ge=0, description="Pods that exited 0.")
    failed: int = Field(0, ge=0, description="Pods that failed.")


class ReplicaStatuses(StatusModel):
    """Pod counts per role."""

    master: ReplicaStatus = Field(default_factory=ReplicaStatus, description="The master.")
    worker: ReplicaStatus = Field(default_factory=ReplicaStatus, description="The workers.")


class CheckpointStatus(StatusModel):
    """The newest complete checkpoint."""

    step: int = Field(ge=0, description="Training step the checkpoint holds.")
    time: datetime | None = Field(None, description="When it was completed.")
    path: Annotated[str, StringConstraints(max_length=4096)] | None = Field(
        None, description="Its directory inside the checkpoint volume."
    )


class ProgressStatus(StatusModel):
    """Training progress, as last reported by the trainer."""

    step: int = Field(0, ge=0, description="Optimizer steps done.")
    total_steps: int | None = Field(None, ge=0, description="Steps the run will take.")
    percent: int | None = Field(None, ge=0, le=100, description="step / totalSteps, in %.")
    loss: float | None = Field(None, description="Most recent training loss.")
    validation_loss: float | None = Field(
        None, ge=0, description="Validation loss of the most recent evaluation."
    )
    tokens_per_second: float | None = Field(
        None, ge=0, description="Training throughput over the whole gang."
    )
    eta_seconds: int | None = Field(None, ge=0, description="Estimated time to finish.")
    mfu: float | None = Field(
        None, ge=0, le=1, description="Model FLOPs utilisation against the peak (0-1)."
    )
    checkpoint_save_seconds: float | None = Field(
        None,
        ge=0,
        description="Time the current gang's training loop was blocked saving checkpoints.",
    )
    update_time: datetime | None = Field(
        None,
        description="When this was observed; a gang restart resets progress to the last "
        "checkpoint's step with this time, and older scrapes are then ignored.",
    )
    source: Literal["Metrics", "TrainerReport", "Checkpoint"] | None = Field(
        None,
        description="Where these figures come from: Metrics, the master's /metrics as last "
        "scraped (a running job, and a finished job whose program wrote no report); "
        "TrainerReport, the trainer's own figures as it ended (its termination message: "
        "the last step, loss and checkpoint, however soon after the last scrape it ended); "
        "Checkpoint, a gang that ended: the step the next gang resumes from.",
    )


class GangAccounting(StatusModel):
    """The current gang's share of the time accounting (what its end needs)."""

    start_step: int = Field(0, ge=0, description="The step this gang resumed from.")
    running_seconds: float = Field(0, ge=0, description="Time this gang ran whole.")
    checkpoint_seconds_before: float = Field(
        0, ge=0, description="Time blocked on checkpoint saves by the gangs before this one."
    )
    ending: bool = Field(
        False,
        description="This gang ended and its master still runs: the save it may make in "
        "its grace period decides the step the next gang resumes from, so its lost time and "
        "the progress reset wait for it.",
    )
    in_place_round: int | None = Field(
        None,
        ge=0,
        description="The in-place round (runPolicy.inPlaceRestarts) this account's time is "
        "the gang's in: a scrape from a later round ends this one.",
    )
    last_step: int | None = Field(None, ge=0, description="The round's last step a scrape showed.")
    last_step_time: datetime | None = Field(None, description="When that scrape was taken.")
    last_save_seconds: float | None = Field(
        None, ge=0, description="The round's time blocked saving, as that scrape showed."
    )


class TimeAccounting(StatusModel):
    """Where the job's wall time went (status/goodput.py). Every pass adds the
    time since ``until`` to the bucket of the phase the job was in, so the
    buckets always add up to wallSeconds: queued + suspended + restarting +
    running = wall, and running = productive + recomputed + checkpoint."""

    since: datetime | None = Field(None, description="When the accounting started.")
    until: datetime | None = Field(None, description="Time accounted up to.")
    wall_seconds: float = Field(0, ge=0, description="until - since.")
    queued_seconds: float = Field(
        0, ge=0, description="Pending: waiting for admission, scheduling or the first gang."
    )
    suspended_seconds: float = Field(0, ge=0, description="Suspended.")
    restarting_seconds: float = Field(
        0, ge=0, description="Restart latency: from a gang's end until the next one runs whole."
    )
    running_seconds: float = Field(0, ge=0, description="The whole gang running and training.")
    recomputed_seconds: float = Field(
        0,
        ge=0,
        description="Running time spent on steps a restart threw away (done after the last "
        "checkpoint, so done again).",
    )
    checkpoint_seconds: float = Field(
        0, ge=0, description="Running time the training loop was blocked saving checkpoints."
    )
    productive_seconds: float = Field(
        0, ge=0, description="Running time spent on steps that were kept."
    )
    gang: GangAccounting | None = Field(None, description="The current gang's bookkeeping.")


class ElasticStatus(StatusModel):
    """An elastic job's size and its replaced workers."""

    current_nodes: int = Field(0, ge=0, description="Pods of the gang running now.")
    desired_nodes: int = Field(0, ge=0, description="1 + worker.replicas.")
    replacements: int = Field(
        0,
        ge=0,
        description="Worker pods recreated alone (failed, evicted, lost with their node, "
        "deleted) while the rest of the gang kept training.",
    )
    counted_replacements: int = Field(
        0,
        ge=0,
        description="Replacements counted toward elastic.maxRestarts: the program's own "
        "failures (a pod the platform took away is not counted, as with backoffLimit).",
    )
    replacing: dict[str, Annotated[str, StringConstraints(max_length=64)]] | None = Field(
        None,
        max_length=4096,
        description="Workers being replaced: pod name to the uid of the pod replaced ('' "
        "when it was already gone), so that one loss is counted once.",
    )


class NodeHealthStatus(StatusModel):
    """One node of the current gang, as torchfleet-train measured it."""

    node: Annotated[str, StringConstraints(max_length=253)] = Field(description="Node name.")
    node_rank: int | None = Field(None, ge=0, description="Its node rank in the gang.")
    compute_seconds: float | None = Field(
        None,
        ge=0,
        description="Its compute seconds per step (not waiting on peers), last interval.",
    )
    straggler_score: float | None = Field(
        None, ge=0, description="computeSeconds over the median node's."
    )
    slow_windows: int = Field(
        0,
        ge=0,
        description="Log intervals in a row its score was above the threshold.",
    )
    preflight_ratio: float | None = Field(
        None,
        ge=0,
        description="Its preflight matmul throughput over the median node's.",
    )
    preflight_passed: bool | None = Field(
        None, description="Whether it passed the preflight check."
    )


class StepSeenStatus(StatusModel):
    """The step counter's last move (hang detection)."""

    step: int = Field(ge=0, description="The step last seen.")
    since: datetime = Field(description="When it was first seen at that step.")


class HealthStatus(StatusModel):
    """Node health of the current gang and the nodes the job avoids (policy/health.py)."""

    gang: int = Field(0, ge=0, description="The gang (restartCount) the figures are of.")
    nodes: list[NodeHealthStatus] | None = Field(
        None, max_length=c.MAX_WORKERS + 1, description="Per node of the gang."
    )
    avoided_nodes: list[Annotated[str, StringConstraints(max_length=253)]] | None = Field(
        None,
        max_length=c.MAX_AVOIDED_NODES,
        description="Nodes this job's pods avoid (stragglers.action Replace), oldest first.",
    )
    replacements: int = Field(
        0,
        ge=0,
        description="Gang restarts stragglers.action Replace made, over every gang so far "
        "(at most runPolicy.stragglers.maxReplacements).",
    )
    step_seen: StepSeenStatus | None = Field(None, description="The step's last move.")


class InPlaceRestartsStatus(StatusModel):
    """Restarts of the gang's processes in place (runPolicy.inPlaceRestarts)."""

    total: int = Field(0, ge=0, description="In-place restarts over every gang so far.")
    gang: int = Field(0, ge=0, description="The gang (restartCount) of inGang.")
    in_gang: int = Field(0, ge=0, description="The current gang's, as its pods report.")
    last_reason: Annotated[str, StringConstraints(max_length=64)] | None = Field(
        None, description="Why the last one happened: worker_killed, worker_failed, peer_lost."
    )
    last_time: datetime | None = Field(None, description="When the operator saw it.")


JobPhase = Literal["Pending", "Running", "Restarting", "Suspended", "Succeeded", "Failed"]


class ResolvedRuntime(StatusModel):
    """The runtime a job resolved, once, when it was first reconciled: its
    spec as it was then is what the job keeps, whatever happens to it since."""

    kind: Annotated[str, StringConstraints(max_length=64)] = Field(
        description="TrainingRuntime or ClusterTrainingRuntime."
    )
    name: Annotated[str, StringConstraints(max_length=253)] = Field(
        description="The runtime's name."
    )
    generation: int | None = Field(
        None, ge=0, description="The runtime's metadata.generation when it was resolved."
    )
    hash: Annotated[str, StringConstraints(max_length=64)] = Field(
        description="sha256 of the runtime's spec as resolved (its first 16 hex digits)."
    )
    spec: dict[str, Any] = Field(
        description="The runtime's spec as resolved, merged under the job's on every pass.",
        json_schema_extra={"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    )


class TrainingJobStatus(StatusModel):
    """What the operator observed; written only by the operator."""

    phase: JobPhase | None = Field(
        None,
        description="Pending, Running, Restarting, Suspended, Succeeded or Failed.",
    )
    conditions: list[Condition] | None = Field(
        None,
        max_length=32,
        description="Latest observations, one per type.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    replica_statuses: ReplicaStatuses | None = Field(None, description="Pod counts per role.")
    nodes_ready: Annotated[str, StringConstraints(max_length=32)] | None = Field(
        None,
        description="Ready pods / pods in the gang, e.g. 3/4 (one pod per node); for an "
        "elastic job the nodes it trains on now / the desired size.",
    )
    restart_count: int = Field(0, ge=0, description="Gang restarts so far.")
    elastic: ElasticStatus | None = Field(
        None, description="An elastic job's current and desired nodes and replaced workers."
    )
    disruptions: int = Field(
        0,
        ge=0,
        description="Times something other than the program stopped the gang (preemption, "
        "eviction, a lost node, a deleted pod, a Kueue eviction); never counted toward "
        "backoffLimit. A disruption that restarts the gang also advances restartCount; a "
        "Kueue eviction does not (the job waits to be admitted again).",
    )
    counted_restarts: int | None = Field(
        None,
        ge=0,
        description="Restarts counted toward runPolicy.backoffLimit: the program's own "
        "failures (restartCount less the disruptions that restarted the gang).",
    )
    in_place_restarts: InPlaceRestartsStatus | None = Field(
        None, description="The gang's processes restarted in place (no new pods)."
    )
    restarts: int = Field(
        0, ge=0, description="restartCount plus the in-place restarts: kubectl's Restarts."
    )
    start_time: datetime | None = Field(
        None,
        description="When the job was last allowed to run: its first unsuspended pass, "
        "reset at each resume; activeDeadlineSeconds counts from it.",
    )
    completion_time: datetime | None = Field(None, description="When the job succeeded or failed.")
    last_checkpoint: CheckpointStatus | None = Field(
        None, description="The newest complete checkpoint."
    )
    progress: ProgressStatus | None = Field(None, description="Training progress.")
    goodput: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Fraction of the time the job was allowed to run (running + restarting) "
        "spent on steps that were kept: timeAccounting.productiveSeconds over that time.",
    )
    time_accounting: TimeAccounting | None = Field(
        None, description="Where the job's wall time went; goodput's components."
    )
    health: HealthStatus | None = Field(
        None,
        description="The gang's per-node figures and the nodes the job avoids.",
    )
    runtime: ResolvedRuntime | None = Field(
        None,
        description="The runtime spec.runtimeRef resolved to, recorded when the job was "
        "first reconciled: editing or deleting the runtime since changes nothing here.",
    )
    observed_generation: int | None = Field(
        None, ge=0, description="metadata.generation last reconciled."
    )


# ---- the object ---------------------------------------------------------------------------


# A DNS label starting with a letter (it names the job's headless Service), short
# enough for the pod names and hostnames derived from it.
JobName = Annotated[
    str,
    StringConstraints(
        min_length=1, max_length=c.MAX_JOB_NAME_LENGTH, pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
    ),
]


class ObjectMeta(BaseModel):
    """The parts of metadata the operator reads; everything else is kept."""

    model_config = ConfigDict(alias_generator=None, populate_by_name=True, extra="allow")

    name: JobName | None = Field(
        None,
        description=f"The job's name: a DNS label starting with a letter, at most "
        f"{c.MAX_JOB_NAME_LENGTH} characters (pod names and hostnames are derived from it).",
    )
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = Field(None, alias="resourceVersion")
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class TrainingJob(ApiModel):
    """Distributed PyTorch training: a gang of master and worker pods wired for
    torch.distributed, restarted as a whole and resumed from checkpoints."""

    api_version: Literal["torchfleet.dev/v1alpha1"] = Field(
        "torchfleet.dev/v1alpha1", description="torchfleet.dev/v1alpha1"
    )
    kind: Literal["TrainingJob"] = Field("TrainingJob", description="TrainingJob")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta, description="Standard metadata.")
    spec: TrainingJobSpec = Field(description="What to run and how.")
    status: TrainingJobStatus | None = Field(None, description="What the operator observed.")
