"""The TrainingJob API (torchfleet.dev/v1alpha1): pydantic models that are the
only source of the CRD schema, plus parsing helpers. Imports neither kopf, a
Kubernetes client nor torch."""

from torchfleet_operator.api.constants import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    VERSION,
)
from torchfleet_operator.api.parse import (
    InvalidSpecError,
    parse_spec,
    parse_training_job,
    to_manifest,
)
from torchfleet_operator.api.reasons import REASON_INVALID_SPEC
from torchfleet_operator.api.v1alpha1 import (
    CheckpointSpec,
    CheckpointStatus,
    ClaimTemplate,
    Condition,
    MasterSpec,
    NetworkSpec,
    PodTemplate,
    ProgressStatus,
    ReplicaStatus,
    ReplicaStatuses,
    ResourcesSpec,
    RunPolicy,
    SchedulingSpec,
    TopologySpec,
    TrainingJob,
    TrainingJobSpec,
    TrainingJobStatus,
    WorkerSpec,
)

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "REASON_INVALID_SPEC",
    "SHORT_NAMES",
    "VERSION",
    "CheckpointSpec",
    "CheckpointStatus",
    "ClaimTemplate",
    "Condition",
    "InvalidSpecError",
    "MasterSpec",
    "NetworkSpec",
    "PodTemplate",
    "ProgressStatus",
    "ReplicaStatus",
    "ReplicaStatuses",
    "ResourcesSpec",
    "RunPolicy",
    "SchedulingSpec",
    "TopologySpec",
    "TrainingJob",
    "TrainingJobSpec",
    "TrainingJobStatus",
    "WorkerSpec",
    "parse_spec",
    "parse_training_job",
    "to_manifest",
]
