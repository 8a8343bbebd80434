"""TrainingRuntime and ClusterTrainingRuntime v1alpha1: what a platform team
fixes once (image, pod templates, resources, NCCL/IB, checkpoints, scheduling,
run policy, trainer defaults) and a TrainingJob names in ``spec.runtimeRef``.

The parts are the TrainingJob's own models (v1alpha1.py), so a runtime's
fields mean, validate and explain exactly as a job's do. A runtime holds no
size (replicas, elastic), no entrypoint (command, args) and no lifecycle
(suspend, managedBy): those are each job's. How a runtime merges under a
job: api/runtime_merge.py.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from torchfleet_contract.trainer_config import TrainConfig
from torchfleet_operator.api import constants as c
from torchfleet_operator.api.base import ApiModel, DnsSubdomain
from torchfleet_operator.api.v1alpha1 import (
    CheckpointSpec,
    Image,
    NetworkSpec,
    PodTemplate,
    ProcessesPerNode,
    ResourcesSpec,
    RunPolicy,
    SchedulingSpec,
)


class RoleDefaults(ApiModel):
    """A role's pod template defaults (its size is each job's)."""

    template: PodTemplate | None = Field(
        None, description="Pod template merged under the job's template for this role."
    )


class TrainingRuntimeSpec(ApiModel):
    """Defaults for the jobs that name this runtime; a job's own fields win."""

    image: Image | None = Field(None, description="Container image of every pod.")
    processes_per_node: ProcessesPerNode | None = Field(
        None, description="Processes (ranks) per pod: an integer, 'gpu' or 'auto'."
    )
    resources: ResourcesSpec | None = Field(
        None, description="Resources of every pod (GPUs, CPU, memory, /dev/shm)."
    )
    master: RoleDefaults | None = Field(None, description="The master's pod template.")
    worker: RoleDefaults | None = Field(None, description="The workers' pod template.")
    trainer: TrainConfig | None = Field(
        None, description="Defaults of the built-in trainer's config (torchfleet-train)."
    )
    network: NetworkSpec | None = Field(
        None, description="Transport, NICs, RDMA and NCCL settings."
    )
    checkpoint: CheckpointSpec | None = Field(
        None, description="Checkpoint volume (claim or claim template), mount path, cadence."
    )
    run_policy: RunPolicy | None = Field(None, description="Restarts, deadlines and clean-up.")
    scheduling: SchedulingSpec | None = Field(
        None, description="Scheduler, gang scheduling, Kueue queue, priority."
    )


class RuntimeMeta(BaseModel):
    """The parts of a runtime's metadata the operator reads."""

    model_config = ConfigDict(alias_generator=None, populate_by_name=True, extra="allow")

    name: DnsSubdomain | None = Field(None, description="The runtime's name.")
    namespace: str | None = None
    generation: int | None = None


class TrainingRuntime(ApiModel):
    """Defaults for the TrainingJobs of its namespace that name it in spec.runtimeRef."""

    api_version: Literal["torchfleet.dev/v1alpha1"] = Field(
        "torchfleet.dev/v1alpha1", description="torchfleet.dev/v1alpha1"
    )
    kind: Literal["TrainingRuntime"] = Field(c.RUNTIME_KIND, description=c.RUNTIME_KIND)
    metadata: RuntimeMeta = Field(default_factory=RuntimeMeta, description="Standard metadata.")
    spec: TrainingRuntimeSpec = Field(description="What the jobs naming it default to.")


class ClusterTrainingRuntime(ApiModel):
    """Defaults for the TrainingJobs of any namespace that name it in spec.runtimeRef."""

    api_version: Literal["torchfleet.dev/v1alpha1"] = Field(
        "torchfleet.dev/v1alpha1", description="torchfleet.dev/v1alpha1"
    )
    kind: Literal["ClusterTrainingRuntime"] = Field(
        c.CLUSTER_RUNTIME_KIND, description=c.CLUSTER_RUNTIME_KIND
    )
    metadata: RuntimeMeta = Field(default_factory=RuntimeMeta, description="Standard metadata.")
    spec: TrainingRuntimeSpec = Field(description="What the jobs naming it default to.")
