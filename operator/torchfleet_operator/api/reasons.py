"""Every condition type, condition reason and event reason the operator writes.

One home, so that a reason a user greps for in ``kubectl describe tj`` is
spelled once, and so that code deciding on a reason it wrote earlier (a
Failed reason that deletes every pod, a refusal that is permanent) compares
against the same constant. Reasons copied from another component's object
(a pod's, the scheduler's, Kueue's) are written as that component spelled
them and are not listed here, except where the operator falls back to one.
"""

from typing import Final

# ---- condition types of a TrainingJob (one condition per type) ----
CONDITION_CREATED: Final = "Created"
CONDITION_RUNNING: Final = "Running"
CONDITION_RESTARTING: Final = "Restarting"
CONDITION_SUSPENDED: Final = "Suspended"
CONDITION_SUCCEEDED: Final = "Succeeded"
CONDITION_FAILED: Final = "Failed"
# The apiserver refused a child; the message is its own.
CONDITION_CHILDREN: Final = "ChildrenRejected"
# The stored spec no longer parses under this operator's models; the job goes on as is.
CONDITION_SPEC_NOT_UNDERSTOOD: Final = "SpecNotUnderstood"
# False while a pod of the gang is unscheduled: the scheduler's reason and message.
CONDITION_SCHEDULED: Final = "Scheduled"
# The PodGroup's phase and its gang scheduler's reason (status/podgroup.py).
CONDITION_GANG_SCHEDULED: Final = "GangScheduled"
# spec.runtimeRef resolved (True, once) or its runtime not found (False: the job waits).
CONDITION_RUNTIME_RESOLVED: Final = "RuntimeResolved"

# Node health (policy/health.py): a node slower than the gang's median, the
# trainer's preflight check of a new gang, a step counter that stands still.
CONDITION_STRAGGLER: Final = "Straggler"
CONDITION_PREFLIGHT: Final = "Preflight"
CONDITION_STALLED: Final = "Stalled"
# True while the kubelet reports a device of a gang's pod Unhealthy (KEP-4680).
CONDITION_DEVICE_UNHEALTHY: Final = "DeviceUnhealthy"

# ---- Kueue's Workload condition types (kueue.x-k8s.io/v1beta1) ----
# QuotaReserved, Admitted and Evicted are mirrored onto the job as well.
WORKLOAD_QUOTA_RESERVED: Final = "QuotaReserved"
WORKLOAD_ADMITTED: Final = "Admitted"
WORKLOAD_EVICTED: Final = "Evicted"
WORKLOAD_FINISHED: Final = "Finished"
WORKLOAD_REQUEUED: Final = "Requeued"
WORKLOAD_PREEMPTED: Final = "Preempted"
WORKLOAD_DEACTIVATED: Final = "Deactivated"  # Evicted: spec.active false
WORKLOAD_DEACTIVATION_TARGET: Final = "DeactivationTarget"
# Reasons Kueue's jobframework writes when it takes a reservation back.
WORKLOAD_REASON_PENDING: Final = "Pending"
WORKLOAD_REASON_NO_RESERVATION: Final = "NoReservation"

# ---- reasons: the job's lifecycle ----
REASON_INVALID_SPEC: Final = "InvalidSpec"  # rejected before any pod exists
REASON_SUCCEEDED: Final = "Succeeded"
REASON_FAILED: Final = "Failed"
REASON_DEADLINE_EXCEEDED: Final = "DeadlineExceeded"
REASON_BACKOFF_LIMIT_EXCEEDED: Final = "BackoffLimitExceeded"
REASON_POD_FAILED_PERMANENTLY: Final = "PodFailedPermanently"
# Counted worker replacements of an elastic job passed elastic.maxRestarts.
REASON_ELASTIC_RESTARTS_EXCEEDED: Final = "ElasticRestartsExceeded"
REASON_SUSPENDED: Final = "Suspended"
REASON_RESUMED: Final = "Resumed"
REASON_WAITING: Final = "Waiting"  # the previous gang's pods are still terminating
REASON_GANG_CREATED: Final = "GangCreated"
REASON_GANG_RUNNING: Final = "GangRunning"
REASON_GANG_SCHEDULED: Final = "GangScheduled"
REASON_GANG_WAITING: Final = "GangWaiting"
REASON_BELOW_MIN_NODES: Final = "BelowMinNodes"
REASON_UNDERSTOOD: Final = "Understood"
REASON_PARSE_ERROR: Final = "ParseError"
REASON_RUNTIME_RESOLVED: Final = "RuntimeResolved"
REASON_RUNTIME_NOT_FOUND: Final = "RuntimeNotFound"

# ---- reasons: why a pod ended the gang (policy/failure.py) ----
REASON_POD_FAILED: Final = "PodFailed"
REASON_POD_DELETED: Final = "PodDeleted"
REASON_NODE_LOST: Final = "NodeLost"
REASON_NEVER_STARTED: Final = "NeverStarted"
REASON_DISRUPTION_TARGET: Final = "DisruptionTarget"
REASON_IMAGE_PULL_BACK_OFF: Final = "ImagePullBackOff"
# Reasons the kubelet or control plane put on a pod it took away.
REASON_EVICTED: Final = "Evicted"
REASON_PREEMPTED: Final = "Preempted"

# ---- reasons: node health (policy/health.py) ----
REASON_SLOW_NODE: Final = "SlowNode"  # Straggler True; the Replace restart's reason too
REASON_NODES_EVEN: Final = "NodesEven"  # Straggler False
REASON_PREFLIGHT_PASSED: Final = "PreflightPassed"
REASON_PREFLIGHT_SLOW_NODE: Final = "PreflightSlowNode"  # Preflight False; Replace's reason
REASON_PREFLIGHT_COLLECTIVE_FAILED: Final = "PreflightCollectiveFailed"  # Preflight False
# Straggler True or Preflight False: the slow node is only reported, as
# runPolicy.stragglers.maxReplacements is spent.
REASON_MAX_REPLACEMENTS_REACHED: Final = "MaxReplacementsReached"
REASON_STEP_STALLED: Final = "StepStalled"  # Stalled True; the Restart's reason too
REASON_STEP_MOVING: Final = "StepMoving"  # Stalled False
REASON_UNHEALTHY_DEVICE: Final = "UnhealthyDevice"  # DeviceUnhealthy True; Replace's reason
REASON_DEVICES_HEALTHY: Final = "DevicesHealthy"  # DeviceUnhealthy False

# ---- reasons: children the apiserver refused (ChildrenRejected) ----
REASON_ACCEPTED: Final = "Accepted"
REASON_CREATE_REJECTED: Final = "CreateRejected"
# The apiserver found a pod invalid (400/422): creating it again fails the same way.
REASON_POD_INVALID: Final = "PodInvalid"
# A child's name is held by an object this job does not control; it is not used.
REASON_NAME_CONFLICT: Final = "NameConflict"
REASON_POD_GROUP_CRD_MISSING: Final = "PodGroupCRDMissing"
REASON_POD_SECURITY_REJECTED: Final = "PodSecurityRejected"

# ---- reasons: Kueue (policy/kueue.py) ----
REASON_KUEUE_MISSING: Final = "KueueNotInstalled"
REASON_WORKLOAD_PENDING: Final = "WorkloadCreated"  # mirrored when Kueue gave none
REASON_WAITING_FOR_ADMISSION: Final = "WaitingForAdmission"
# The job's kueue.x-k8s.io/priority-class label names no WorkloadPriorityClass (yet).
REASON_PRIORITY_CLASS_MISSING: Final = "WorkloadPriorityClassNotFound"
# The job's PodSets changed while its Workload waited: a new Workload replaces it.
REASON_WORKLOAD_REPLACED: Final = "WorkloadReplaced"
# Admitted, but its topology assignment cannot be used (yet) for the pods.
REASON_WAITING_FOR_TOPOLOGY: Final = "WaitingForTopologyAssignment"
REASON_ADMITTED: Final = "Admitted"  # Evicted goes False: admitted again

# ---- event reasons (besides a phase change's, which is its condition's reason) ----
EVENT_GANG_RESUMED: Final = "GangResumed"
EVENT_WORKER_REPLACED: Final = "WorkerReplaced"
EVENT_IN_PLACE_RESTART: Final = "InPlaceRestart"  # the gang's processes, no new pods
EVENT_SCALED_DOWN: Final = "ScaledDown"
EVENT_SCALED_UP: Final = "ScaledUp"
EVENT_SPEC_NOT_UNDERSTOOD: Final = CONDITION_SPEC_NOT_UNDERSTOOD
# spec.managedBy names another controller: this operator leaves the job alone.
EVENT_MANAGED_ELSEWHERE: Final = "ManagedElsewhere"
# MultiKueue dispatched the job to a worker cluster (the manager's job says which).
EVENT_DISPATCHED: Final = "DispatchedToCluster"

# Failed reasons that delete every pod whatever cleanPodPolicy says: the job
# ended for a reason its pods cannot explain further.
HOLDS_NOTHING: Final = (
    REASON_DEADLINE_EXCEEDED,
    REASON_BACKOFF_LIMIT_EXCEEDED,
    REASON_ELASTIC_RESTARTS_EXCEEDED,
    REASON_INVALID_SPEC,
)
