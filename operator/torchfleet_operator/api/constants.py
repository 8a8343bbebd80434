"""Names of the TrainingJob API that other code and manifests refer to."""

from typing import Final

GROUP: Final = "torchfleet.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "TrainingJob"
LIST_KIND: Final = "TrainingJobList"
PLURAL: Final = "trainingjobs"
SINGULAR: Final = "trainingjob"
SHORT_NAMES: Final = ("tj",)
CATEGORIES: Final = ("all",)
CRD_NAME: Final = f"{PLURAL}.{GROUP}"

# Runtimes: what a platform team fixes once, named by a job's spec.runtimeRef.
RUNTIME_KIND: Final = "TrainingRuntime"
RUNTIME_PLURAL: Final = "trainingruntimes"
CLUSTER_RUNTIME_KIND: Final = "ClusterTrainingRuntime"
CLUSTER_RUNTIME_PLURAL: Final = "clustertrainingruntimes"

# Pod names are "<job>-worker-<index>" and must stay valid DNS labels (63
# characters, they are also the pods' hostnames): 48 leaves room for the
# longest role suffix with a four-digit index.
MAX_JOB_NAME_LENGTH: Final = 48
MAX_WORKERS: Final = 4095
# Nodes a job remembers to avoid (runPolicy.stragglers.action Replace); the oldest go first.
MAX_AVOIDED_NODES: Final = 32
MAX_GPUS_PER_NODE: Final = 64

# The container in a role's pod template that the operator merges its
# defaults (image, command, env, resources, mounts) into.
TRAINER_CONTAINER_NAME: Final = "trainer"
DEFAULT_CHECKPOINT_MOUNT_PATH: Final = "/checkpoints"
DEFAULT_GPU_RESOURCE: Final = "nvidia.com/gpu"
# Seconds between SIGTERM and SIGKILL for a pod whose job and template set none:
# the trainer's SIGTERM checkpoint save runs in it (runPolicy's description).
DEFAULT_TERMINATION_GRACE_SECONDS: Final = 30
MAX_TERMINATION_GRACE_SECONDS: Final = 86_400
# In-place restarts of a fixed gang of the built-in trainer whose run policy
# sets none (never more than backoffLimit). Not all of the budget: a failure of
# the program can be the host's (a GPU's Xid shows as a NCCL error), and the
# failure after these gets new pods, possibly elsewhere.
DEFAULT_IN_PLACE_RESTARTS: Final = 2

# Kueue admits a suspended job whose pods carry this label.
KUEUE_QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
# Set by MultiKueue on the copy of a job it creates on a worker cluster: the
# Workload it copied there too, which the job runs under (it makes no other).
KUEUE_PREBUILT_WORKLOAD_LABEL: Final = "kueue.x-k8s.io/prebuilt-workload-name"
# Kueue's WorkloadPriorityClass of a job: its Workload's priority (not the pods').
KUEUE_PRIORITY_CLASS_LABEL: Final = "kueue.x-k8s.io/priority-class"
VOLCANO_SCHEDULER: Final = "volcano"  # Volcano's scheduler name (its default --scheduler-name)

# spec.managedBy: who runs the job. Unset, empty or MANAGED_BY_OPERATOR: this
# operator; MANAGED_BY_MULTIKUEUE: Kueue's MultiKueue (it dispatches the job to a
# worker cluster and mirrors its status back); any other value: another
# controller. At most 63 characters, as a Job's and a JobSet's.
MANAGED_BY_OPERATOR: Final = "torchfleet.dev/operator"
MANAGED_BY_MULTIKUEUE: Final = "kueue.x-k8s.io/multikueue"
MAX_MANAGED_BY_LENGTH: Final = 63

# status.phase values.
PHASE_PENDING: Final = "Pending"
PHASE_RUNNING: Final = "Running"
PHASE_RESTARTING: Final = "Restarting"
PHASE_SUSPENDED: Final = "Suspended"
PHASE_SUCCEEDED: Final = "Succeeded"
PHASE_FAILED: Final = "Failed"
PHASES: Final = (
    PHASE_PENDING,
    PHASE_RUNNING,
    PHASE_RESTARTING,
    PHASE_SUSPENDED,
    PHASE_SUCCEEDED,
    PHASE_FAILED,
)

# Condition types and reasons: api/reasons.py.
