"""The pod contract: the environment the operator sets and the trainer reads.

This one module is shared by both packages (the operator imports it to build
pod env, the trainer to read it), so the two sides cannot drift apart; it lives
in torchfleet_contract, which both import and which imports neither. It
imports nothing beyond the standard library.

Names follow the tools users already run: torchrun reads its own ``PET_*``
variables, so an unmodified ``torchrun script.py`` inside the pod launches with
the right node count and rendezvous. ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK`` always mean per-process values, as in PyTorch; the operator sets
them on the pod only when one process runs per pod, otherwise torchrun (or our
own launcher) sets them for each process it starts.

Every variable that passes between operator and trainer is named here and
nowhere else, and the trainer reads its environment only through
``PodContract.from_env``. Nodes, node rank and processes per node carry the
API's names (``spec.nodes``, ``spec.processesPerNode``) on both sides.

What it owns, by section: pod identity and the rendezvous; the elastic
rendezvous; the checkpoint, trainer config and hostfile; recovery (collective
timeouts and kept logs); in-place restarts; exit codes and the run policy; the
env names a pod template may and may not set; the Prometheus metric names the
operator reads; the termination message; and the pod contract read and
written as a whole (``PodContract``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Collection, Mapping
from dataclasses import dataclass

# ---- the one error -------------------------------------------------------------------
# A pod env that breaks the contract: every refusal names the variable.


class ContractError(ValueError):
    """The pod environment does not satisfy the contract; names the variable."""


# ---- pod identity and rendezvous -----------------------------------------------------
# Who this pod is and where its gang meets: torchrun's names, torch's env://
# names and torchfleet's own, with the ports they meet on.

# torchrun's own variables (torch.distributed.run reads PET_<FLAG>).
PET_NNODES = "PET_NNODES"
PET_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
PET_NODE_RANK = "PET_NODE_RANK"
PET_MASTER_ADDR = "PET_MASTER_ADDR"
PET_MASTER_PORT = "PET_MASTER_PORT"
# torchrun's --rdzv-id: distinct per gang generation, so that a stale process
# of an old gang cannot join the new one's rendezvous. In an elastic job it is
# stable for the job instead: nodes that come and go join the same rendezvous.
PET_RDZV_ID = "PET_RDZV_ID"

# torch.distributed's env:// rendezvous and common launcher names.
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
NNODES = "NNODES"
NODE_RANK = "NODE_RANK"

# Per-process values; on the pod only when one process runs per pod.
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"

# torchfleet's own.
JOB_NAME = "TORCHFLEET_JOB_NAME"
NAMESPACE = "TORCHFLEET_NAMESPACE"
RESTART_COUNT = "TORCHFLEET_RESTART_COUNT"
NPROC_PER_NODE = "TORCHFLEET_NPROC_PER_NODE"

# The name of the Kubernetes node the pod runs on, for the trainer's per-node series.
# The operator sets it from the downward API (valueFrom.fieldRef: spec.nodeName);
# without it the trainer names a node by its host name (in a pod: the pod's name).
NODE_NAME = "TORCHFLEET_NODE_NAME"

DEFAULT_MASTER_PORT = 29500
# Gang generation g rendezvouses on DEFAULT_MASTER_PORT + g % RENDEZVOUS_PORTS:
# a process of an older gang, still alive on a lost node, dials a port nobody
# of the new gang listens on.
RENDEZVOUS_PORTS = 8


def rendezvous_port(restart_count: int) -> int:
    return DEFAULT_MASTER_PORT + restart_count % RENDEZVOUS_PORTS


def node_name(env: Mapping[str, str] | None = None) -> str:
    """The node this process runs on: $TORCHFLEET_NODE_NAME, else the host name."""
    env = os.environ if env is None else env
    return env.get(NODE_NAME) or socket.gethostname()


# ---- elastic rendezvous --------------------------------------------------------------
# An elastic job's (and an in-place budget's) c10d rendezvous, in torchrun's flags.

# Elastic jobs (torchrun's own flags, so a plain ``torchrun script.py`` joins
# elastically too): PET_RDZV_BACKEND=c10d makes the job elastic; PET_NNODES is
# then "min:max"; PET_RDZV_ENDPOINT is host:port of the rendezvous store (the
# master pod's stable name, whose agent hosts it); PET_MAX_RESTARTS is how many
# times the agents restart their workers after a failure (membership changes
# that add nodes do not count). PET_RDZV_CONF (optional, "key=value,...") tunes
# the rendezvous's timeouts; PET_LOCAL_ADDR (optional) is the address other
# nodes reach this one by, where the host name does not resolve.
PET_RDZV_BACKEND = "PET_RDZV_BACKEND"
PET_RDZV_ENDPOINT = "PET_RDZV_ENDPOINT"
PET_MAX_RESTARTS = "PET_MAX_RESTARTS"
PET_RDZV_CONF = "PET_RDZV_CONF"
PET_LOCAL_ADDR = "PET_LOCAL_ADDR"
ELASTIC_RDZV_BACKEND = "c10d"
# The PET_RDZV_CONF key that says whether this node's agent serves the c10d
# rendezvous store (1) or dials it (0). Unset, torch guesses by matching the
# endpoint's host against the node's own names, which a Service name need not match.
RDZV_IS_HOST = "is_host"
STATIC_RDZV_BACKEND = "static"


# ---- checkpoint, trainer config and hostfile -----------------------------------------
# What the job's spec hands the program it runs.

CHECKPOINT_DIR = "TORCHFLEET_CHECKPOINT_DIR"
# spec.checkpoint.intervalSteps / keepLast, for scripts the user brings; for
# torchfleet-train the operator writes them into TRAIN_CONFIG instead, where
# they win over spec.trainer.checkpoint (desired/env.py decides that, once).
CHECKPOINT_INTERVAL = "TORCHFLEET_CHECKPOINT_INTERVAL"
CHECKPOINT_KEEP = "TORCHFLEET_CHECKPOINT_KEEP"

# The inline trainer config (JSON) the operator renders from spec.trainer.
TRAIN_CONFIG = "TORCHFLEET_TRAIN_CONFIG"

# The gang's hostfile (`<pod DNS name> slots=<processes per node>`, one line per
# node in node-rank order), for launchers that read one: DeepSpeed's
# `--hostfile`, MPI's. A job running a command of its own gets it at
# HOSTFILE_PATH, DeepSpeed's default place; this variable names the path.
HOSTFILE = "TORCHFLEET_HOSTFILE"
HOSTFILE_PATH = "/etc/deepspeed/hostfile"


# ---- recovery: collective timeouts and kept logs -------------------------------------
# The trainer's own tuning (a pod template may set these; see USER_ENV_NAMES).

# How long a rank waits in a collective for a peer before it gives up and exits
# with the launcher's EXIT_COLLECTIVE_FAILED (202, retryable). Seconds, > 0.
# COLLECTIVE_INIT_TIMEOUT covers process-group set-up, the resume, preflight, the
# first steps (compilation) and every checkpoint save; after the first steps the
# trainer tightens it to COLLECTIVE_TRAIN_TIMEOUT, or 20 x the slowest rank's
# steady step time where that is longer (the value is the floor).
COLLECTIVE_INIT_TIMEOUT = "TORCHFLEET_COLLECTIVE_INIT_TIMEOUT_SECONDS"
COLLECTIVE_TRAIN_TIMEOUT = "TORCHFLEET_COLLECTIVE_TRAIN_TIMEOUT_SECONDS"
DEFAULT_COLLECTIVE_INIT_TIMEOUT = 600.0
DEFAULT_COLLECTIVE_TRAIN_TIMEOUT = 120.0

# Every rank's stdout and stderr is kept on the checkpoint volume, under
# <checkpoint dir>/logs/gen-<RESTART_COUNT>/round-<in-place round>/rank-<rank>.log
# (launcher/logtee.py says more): LOG_KEEP_GENERATIONS is how many gang
# generations keep theirs (the newest; 0 keeps none and writes none),
# LOG_MAX_BYTES caps each file (the tail is kept: past the cap the file moves to
# <name>.1, replacing the one before, and a new one starts).
LOG_KEEP_GENERATIONS = "TORCHFLEET_LOG_KEEP_GENERATIONS"
LOG_MAX_BYTES = "TORCHFLEET_LOG_MAX_BYTES"
DEFAULT_LOG_KEEP_GENERATIONS = 5
DEFAULT_LOG_MAX_BYTES = 8 * 1024 * 1024
LOGS_SUBDIR = "logs"


def kept_log_file(root: str, generation: int, round_: int, rank: int) -> str:
    """Where rank ``rank`` of gang ``generation``, in-place round ``round_``, keeps
    its output under the checkpoint directory ``root``: written by the trainer
    (launcher/logtee.py), named by the operator in a failure's condition and event."""
    return f"{root.rstrip('/')}/{LOGS_SUBDIR}/gen-{generation}/round-{round_}/rank-{rank}.log"


@dataclass(frozen=True)
class RecoverySettings:
    """The trainer's side of recovery: collective timeouts and kept logs."""

    collective_init_timeout: float = DEFAULT_COLLECTIVE_INIT_TIMEOUT
    collective_train_timeout: float = DEFAULT_COLLECTIVE_TRAIN_TIMEOUT
    log_keep_generations: int = DEFAULT_LOG_KEEP_GENERATIONS
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES

    def __post_init__(self) -> None:
        for name, seconds in (
            (COLLECTIVE_INIT_TIMEOUT, self.collective_init_timeout),
            (COLLECTIVE_TRAIN_TIMEOUT, self.collective_train_timeout),
        ):
            if not seconds > 0:
                raise ContractError(f"{name} must be > 0 seconds, got {seconds}")
        if self.log_keep_generations < 0:
            raise ContractError(
                f"{LOG_KEEP_GENERATIONS} must be >= 0, got {self.log_keep_generations}"
            )
        if self.log_max_bytes < 1024:
            raise ContractError(f"{LOG_MAX_BYTES} must be >= 1024, got {self.log_max_bytes}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RecoverySettings:
        env = os.environ if env is None else env
        return cls(
            collective_init_timeout=_float(
                env, COLLECTIVE_INIT_TIMEOUT, DEFAULT_COLLECTIVE_INIT_TIMEOUT
            ),
            collective_train_timeout=_float(
                env, COLLECTIVE_TRAIN_TIMEOUT, DEFAULT_COLLECTIVE_TRAIN_TIMEOUT
            ),
            log_keep_generations=_int(env, LOG_KEEP_GENERATIONS, DEFAULT_LOG_KEEP_GENERATIONS),
            log_max_bytes=_int(env, LOG_MAX_BYTES, DEFAULT_LOG_MAX_BYTES),
        )


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ContractError(f"{name} must be a number, got {raw!r}") from None


# ---- in-place restarts ---------------------------------------------------------------
# A fixed gang's restarts of its workers without new pods, and why each happened.

# A fixed gang's in-place restart budget: how many times every pod's launcher
# restarts its workers after a failure, all pods' workers meeting again in a new
# round of a c10d rendezvous hosted by node rank 0's launcher (the elastic
# path's: torchrun's max_restarts) and resuming from the last checkpoint,
# before the launcher gives up and exits with the failure's code. 0 (the
# default) is the behaviour before it: the launcher exits at the first failure.
# With a budget, ranks come from each round, so RANK/WORLD_SIZE are not set on
# a pod even with one process per pod (the launcher starts that process).
IN_PLACE_RESTARTS = "TORCHFLEET_IN_PLACE_RESTARTS"

# torchelastic's own (agent -> worker): how many times the agent restarted its
# workers after a failure; the in-place round of the logs' folder.
TORCHELASTIC_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
TORCHELASTIC_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"

# Why an in-place restart happened (METRIC_IN_PLACE_RESTART_REASON's reason
# label, the termination message's REPORTED_IN_PLACE_REASON), most telling
# first: the gang agrees on the most telling one any pod saw among its own
# workers of the failed round.
RESTART_REASON_WORKER_KILLED = "worker_killed"  # died by a signal or crashed unreported (OOM kill)
RESTART_REASON_WORKER_FAILED = "worker_failed"  # the program exited with an error of its own
RESTART_REASON_PEER_LOST = "peer_lost"  # only a collective timing out or losing a peer was seen
RESTART_REASONS = (
    RESTART_REASON_PEER_LOST,
    RESTART_REASON_WORKER_FAILED,
    RESTART_REASON_WORKER_KILLED,
)


def in_place_round(env: Mapping[str, str] | None = None) -> int:
    """This worker's in-place round: its agent's restarts after a failure so far."""
    env = os.environ if env is None else env
    return _int(env, TORCHELASTIC_RESTART_COUNT, 0)


def in_place_restarts_left(env: Mapping[str, str] | None = None) -> int:
    """How many more times this worker's agent would restart it after a failure."""
    env = os.environ if env is None else env
    return _int(env, TORCHELASTIC_MAX_RESTARTS, 0) - in_place_round(env)


# ---- exit codes and the run policy ---------------------------------------------------
# The codes both sides give a meaning to, and the one rule that says which are
# retried (the launcher in place, the operator as a gang).

# torchfleet-train's exit code when a collective of the preflight check failed or
# timed out: a node or link of the gang is at fault; >= 128, so restartPolicy
# ExitCode retries it, and the operator names it in the Preflight condition.
EXIT_PREFLIGHT_FAILED = 201
# torchfleet-train's exit code when a collective timed out waiting on a peer or
# lost one: a consequence of another rank's failure, not this rank's. >= 128, so
# ExitCode retries it; the operator looks past it for the failure that caused it.
EXIT_COLLECTIVE_FAILED = 202

# Exit codes from 128 up mean "killed by signal (code - 128)": 137 = SIGKILL
# (often the OOM killer), 143 = SIGTERM (preemption, drain).
FIRST_SIGNAL_EXIT_CODE = 128

# The run policy's verdict on exit codes (spec.runPolicy.restartPolicy and its
# retryable/permanent code lists), so that a launcher never restarts in place
# what the operator would not restart as a gang: a worker that exits with a
# permanent code stops its launcher, which exits with that code. Unset: every
# failure is retried (OnFailure), torchrun's own behaviour. The operator's
# gang restarts apply the same rule, exit_is_retryable below.
RESTART_POLICY = "TORCHFLEET_RESTART_POLICY"  # OnFailure | ExitCode | Never
RETRYABLE_EXIT_CODES = "TORCHFLEET_RETRYABLE_EXIT_CODES"  # comma-separated, e.g. "1,42"
PERMANENT_EXIT_CODES = "TORCHFLEET_PERMANENT_EXIT_CODES"  # comma-separated
RESTART_POLICIES = ("OnFailure", "ExitCode", "Never")


def exit_is_retryable(
    restart_policy: str,
    exit_code: int | None,
    retryable_codes: Collection[int] = (),
    permanent_codes: Collection[int] = (),
) -> bool:
    """Whether the run policy retries a program that exited with ``exit_code``."""
    if exit_code is not None and exit_code in permanent_codes:
        return False
    if exit_code is not None and exit_code in retryable_codes:
        return True
    if restart_policy == "Never":
        return False
    if restart_policy == "ExitCode":
        # No exit code (e.g. the container never started): not the program's verdict.
        return exit_code is None or exit_code >= FIRST_SIGNAL_EXIT_CODE
    return True  # OnFailure


@dataclass(frozen=True)
class ExitCodePolicy:
    """The run policy's exit-code rule, as the pod's environment carries it."""

    restart_policy: str = "OnFailure"
    retryable_codes: frozenset[int] = frozenset()
    permanent_codes: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if self.restart_policy not in RESTART_POLICIES:
            raise ContractError(
                f"{RESTART_POLICY} must be one of {', '.join(RESTART_POLICIES)}, "
                f"got {self.restart_policy!r}"
            )

    def retries(self, exit_code: int | None) -> bool:
        return exit_is_retryable(
            self.restart_policy, exit_code, self.retryable_codes, self.permanent_codes
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ExitCodePolicy:
        env = os.environ if env is None else env
        return cls(
            restart_policy=env.get(RESTART_POLICY) or "OnFailure",
            retryable_codes=_codes(env, RETRYABLE_EXIT_CODES),
            permanent_codes=_codes(env, PERMANENT_EXIT_CODES),
        )


def _codes(env: Mapping[str, str], name: str) -> frozenset[int]:
    raw = env.get(name) or ""
    try:
        return frozenset(int(part) for part in raw.split(",") if part.strip())
    except ValueError:
        raise ContractError(f"{name} must be comma-separated integers, got {raw!r}") from None


# ---- reserved env names --------------------------------------------------------------
# Which env names the operator owns, and which of them a pod template may set.

# The prefixes of the contract's variables: a pod template may not set one of its
# own under them (the operator owns that namespace of names).
TORCHRUN_ENV_PREFIX = "PET_"
TORCHFLEET_ENV_PREFIX = "TORCHFLEET_"
RESERVED_ENV_PREFIXES = (TORCHRUN_ENV_PREFIX, TORCHFLEET_ENV_PREFIX)

# The TORCHFLEET_* names a pod template may set itself (see RESERVED_ENV_PREFIXES):
# everything under these prefixes is the trainer's tuning, never the operator's.
USER_ENV_PREFIXES = ("TORCHFLEET_COLLECTIVE_", "TORCHFLEET_LOG_")
USER_ENV_NAMES = (
    COLLECTIVE_INIT_TIMEOUT,
    COLLECTIVE_TRAIN_TIMEOUT,
    LOG_KEEP_GENERATIONS,
    LOG_MAX_BYTES,
)
assert all(name.startswith(USER_ENV_PREFIXES) for name in USER_ENV_NAMES)


# ---- metric names --------------------------------------------------------------------
# The trainer's Prometheus series the operator scrapes, with their labels.

METRICS_PORT = "TORCHFLEET_METRICS_PORT"
DEFAULT_METRICS_PORT = 9400

# The trainer's Prometheus series on that port which the operator reads into
# status.progress and status.lastCheckpoint (torchfleet_trainer/metrics.py
# exports them; torchfleet_operator/status/progress.py parses them).
METRIC_STEP = "torchfleet_train_step"
METRIC_TOTAL_STEPS = "torchfleet_train_total_steps"
METRIC_LOSS = "torchfleet_train_loss"
METRIC_TOKENS_PER_SECOND = "torchfleet_train_tokens_per_second"
METRIC_STEP_SECONDS = "torchfleet_train_step_seconds"  # a histogram: its _sum and _count
METRIC_CHECKPOINT_STEP = "torchfleet_checkpoint_step"
METRIC_MFU = "torchfleet_train_mfu_ratio"  # 0-1
METRIC_EVAL_LOSS = "torchfleet_train_eval_loss"  # the last evaluation's validation loss
# A histogram of each checkpoint save's seconds: its _sum and _count.
METRIC_CHECKPOINT_SAVE_SECONDS = "torchfleet_checkpoint_save_seconds"

# Rank 0's per-node series, one sample per node of the gang, labelled with the
# node's rank and name: the mean seconds per step its slowest process spent
# computing (apart from waiting on its peers in collectives) over the last log
# interval, and that over the median of the gang's nodes (1.0 = typical; a
# straggler's is above 1).
METRIC_NODE_COMPUTE_SECONDS = "torchfleet_train_node_compute_seconds"
METRIC_NODE_STRAGGLER_SCORE = "torchfleet_train_node_straggler_score"
LABEL_NODE_RANK = "node_rank"
LABEL_NODE = "node"

# What the trainer is doing now: one sample per phase, labelled phase, 1 for the
# current one and 0 for the others, and the Unix time the current one began. A
# step counter that stands still in "eval" or "checkpoint" is no hang.
METRIC_PHASE = "torchfleet_train_phase"
METRIC_PHASE_STARTED = "torchfleet_train_phase_started_timestamp_seconds"
LABEL_PHASE = "phase"
PHASE_STARTING = "starting"  # process group, model, data, resuming a checkpoint
PHASE_PREFLIGHT = "preflight"
PHASE_TRAIN = "train"
PHASE_EVAL = "eval"
PHASE_CHECKPOINT = "checkpoint"  # a save that blocks the loop
PHASE_DONE = "done"
PHASES = (
    PHASE_STARTING,
    PHASE_PREFLIGHT,
    PHASE_TRAIN,
    PHASE_EVAL,
    PHASE_CHECKPOINT,
    PHASE_DONE,
)

# The preflight check's figures (rank 0's /metrics): per node, its slowest
# process's matmul throughput, that over the gang's median, and whether it
# passed (1) or fell below preflight.minMatmulFraction (0); for the gang, the
# all-reduce bus bandwidth (nccl-tests' busbw: bytes x 2(n-1)/n per second),
# whether every node and collective passed, and how long the check took.
METRIC_PREFLIGHT_MATMUL_FLOPS = "torchfleet_preflight_matmul_flops_per_second"
METRIC_PREFLIGHT_MATMUL_RATIO = "torchfleet_preflight_matmul_median_ratio"
METRIC_PREFLIGHT_NODE_PASSED = "torchfleet_preflight_node_passed"
METRIC_PREFLIGHT_BUS_BANDWIDTH = "torchfleet_preflight_allreduce_bus_bytes_per_second"
METRIC_PREFLIGHT_PASSED = "torchfleet_preflight_passed"
METRIC_PREFLIGHT_SECONDS = "torchfleet_preflight_seconds"

# What each pod's /metrics says about in-place restarts (rank 0's and every
# local rank 0's, the same on every pod): how many this gang generation has had
# (the most any pod's launcher counted: each counts the rounds its own workers
# failed in), and why the last one happened, one sample per reason, 1 for the
# last one and 0 for the others (all 0 before the first restart).
METRIC_IN_PLACE_RESTARTS = "torchfleet_train_in_place_restarts"
METRIC_IN_PLACE_RESTART_REASON = "torchfleet_train_in_place_restart_reason"
LABEL_REASON = "reason"


# ---- termination message -------------------------------------------------------------
# What the trainer leaves in its pod's terminated container status.

# The trainer's termination message: what it knew last that the operator's
# last scrape may have missed, in the pod's terminated container status. One
# JSON object, whose fields are written when they happen:
# * after a preemption it saved for, the step and time of that save (made in
#   the grace period after the last scrape);
# * after an in-place restart, the gang's count and the last one's reason (a
#   job can end within a scrape interval of its restart), by every pod's local
#   rank 0, in a container that has the file (the kubelet makes it);
# * when the run ends (every step done, or stopped by SIGTERM), rank 0's final
#   figures: the last step, its loss, throughput and the last validation loss,
#   and the step and time of the newest save this gang completed. A job can
#   end within a scrape interval of its last save and its last steps: these,
#   not the last scrape, are what the operator's final status shows.
# * when it fails, the same figures, and the failed rank's last log lines
#   (logTail), which the kubelet gives only for an empty message
#   (terminationMessagePolicy FallbackToLogsOnError); a launcher that has no
#   such lines to give (no kept logs) empties the message unless it reports a
#   saved preemption, so a crash still gets the kubelet's log tail.
# For example
# {"step": 300, "totalSteps": 300, "loss": 1.4021, "valLoss": 1.5230,
#  "tokensPerSecond": 10240.5, "mfu": 0.41, "reportTime": "2026-11-26T17:02:04Z",
#  "checkpointStep": 300, "checkpointTime": "2026-11-26T17:02:03Z",
#  "inPlaceRestarts": 1, "inPlaceReason": "worker_killed"}.
TERMINATION_MESSAGE_PATH = "/dev/termination-log"  # Kubernetes' default path
TERMINATION_MESSAGE_PATH_ENV = "TORCHFLEET_TERMINATION_MESSAGE_PATH"  # elsewhere (tests)
SAVED_CHECKPOINT_STEP = "checkpointStep"
SAVED_CHECKPOINT_TIME = "checkpointTime"
REPORTED_IN_PLACE_RESTARTS = "inPlaceRestarts"
REPORTED_IN_PLACE_REASON = "inPlaceReason"
REPORTED_STEP = "step"
REPORTED_TOTAL_STEPS = "totalSteps"
REPORTED_LOSS = "loss"
REPORTED_VAL_LOSS = "valLoss"
REPORTED_TOKENS_PER_SECOND = "tokensPerSecond"
REPORTED_MFU = "mfu"  # 0-1; absent where no peak is known (a CPU)
REPORTED_TIME = "reportTime"  # when rank 0 wrote its final figures
REPORTED_LOG_TAIL = "logTail"  # a failed run's last log lines: the failure's message


def reported_in_place_restarts(report: object) -> tuple[int, str | None] | None:
    """(restarts, reason) from a termination message's JSON object; None where it
    has none (or not as the trainer writes them)."""
    if not isinstance(report, dict):
        return None
    count = report.get(REPORTED_IN_PLACE_RESTARTS)
    reason = report.get(REPORTED_IN_PLACE_REASON)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        return None
    if reason is not None and reason not in RESTART_REASONS:
        return None
    return count, reason


# ---- the pod contract as a whole -----------------------------------------------------
# The env above, read (the trainer) and written (the operator) in one place.


@dataclass(frozen=True)
class ProcessRanks:
    """One process's place: torchrun's per-process variables (or the operator's,
    with one process per pod)."""

    rank: int
    world_size: int
    local_rank: int = 0
    # Processes on this node: an elastic job's world is nodes x this.
    local_world_size: int = 1


@dataclass(frozen=True)
class ElasticRendezvous:
    """An elastic job's rendezvous: torchrun's c10d backend between min and max nodes.

    Ranks come from the rendezvous, not from the pod: each round numbers the
    nodes that joined it, so NODE_RANK and the per-process values are not set."""

    min_nodes: int
    max_nodes: int
    endpoint: str  # host:port
    run_id: str
    max_restarts: int = 0
    # torchrun's --rdzv-conf: "key=value,key=value"; empty for the launcher's defaults.
    conf: str = ""
    local_addr: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.min_nodes <= self.max_nodes:
            raise ContractError(
                f"{PET_NNODES} must be min:max with 1 <= min <= max, "
                f"got {self.min_nodes}:{self.max_nodes}"
            )
        host, _, port = self.endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ContractError(f"{PET_RDZV_ENDPOINT} must be host:port, got {self.endpoint!r}")
        if not self.run_id:
            raise ContractError(f"{PET_RDZV_ID} must be set for an elastic job")
        if self.max_restarts < 0:
            raise ContractError(f"{PET_MAX_RESTARTS} must be >= 0, got {self.max_restarts}")
        rendezvous_configs(self.conf)  # raises on a malformed value

    @classmethod
    def fixed_gang(cls, pod: PodContract) -> ElasticRendezvous:
        """A fixed gang's rendezvous for in-place restarts: min = max = its nodes,
        hosted by node rank 0's launcher at the master address, one run per gang
        generation (each round of it gets a store prefix of its own)."""
        return cls(
            min_nodes=pod.nodes,
            max_nodes=pod.nodes,
            endpoint=f"{pod.master_addr}:{pod.master_port}",
            run_id=pod.rendezvous_id,
            max_restarts=pod.in_place_restarts,
            conf=f"{RDZV_IS_HOST}={int(pod.node_rank == 0)}",
        )

    @property
    def node_counts(self) -> range:
        return range(self.min_nodes, self.max_nodes + 1)

    def to_env(self) -> dict[str, str]:
        env = {
            PET_NNODES: f"{self.min_nodes}:{self.max_nodes}",
            PET_RDZV_BACKEND: ELASTIC_RDZV_BACKEND,
            PET_RDZV_ENDPOINT: self.endpoint,
            PET_RDZV_ID: self.run_id,
            PET_MAX_RESTARTS: str(self.max_restarts),
        }
        if self.conf:
            env[PET_RDZV_CONF] = self.conf
        if self.local_addr:
            env[PET_LOCAL_ADDR] = self.local_addr
        return env


def rendezvous_configs(conf: str) -> dict[str, str]:
    """torchrun's --rdzv-conf ("key=value,key=value") as a dict; names the variable."""
    configs = {}
    for item in filter(None, (part.strip() for part in conf.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ContractError(f"{PET_RDZV_CONF} must be key=value,..., got {conf!r}")
        configs[key.strip()] = value.strip()
    return configs


@dataclass(frozen=True)
class PodContract:
    """Everything a pod needs to join its gang, independent of how it launches."""

    job_name: str
    namespace: str
    master_addr: str
    master_port: int
    nodes: int
    node_rank: int
    processes_per_node: int
    restart_count: int = 0
    checkpoint_dir: str | None = None
    checkpoint_interval: int | None = None
    checkpoint_keep: int | None = None
    metrics_port: int = DEFAULT_METRICS_PORT
    # The rendered trainer config (JSON); None for a command of the user's own.
    train_config: str | None = None
    # Set by torchrun for each process it starts; None in a launcher's own env.
    process: ProcessRanks | None = None
    # Set for an elastic job (PET_RDZV_BACKEND=c10d); None for a fixed gang.
    elastic: ElasticRendezvous | None = None
    termination_message_path: str = TERMINATION_MESSAGE_PATH
    in_place_restarts: int = 0

    def __post_init__(self) -> None:
        if self.in_place_restarts < 0:
            raise ContractError(f"{IN_PLACE_RESTARTS} must be >= 0, got {self.in_place_restarts}")
        if self.nodes < 1:
            raise ContractError(f"{NNODES} must be >= 1, got {self.nodes}")
        if not 0 <= self.node_rank < self.nodes:
            raise ContractError(f"{NODE_RANK} must be in [0, {self.nodes}), got {self.node_rank}")
        if self.processes_per_node < 1:
            raise ContractError(f"{NPROC_PER_NODE} must be >= 1, got {self.processes_per_node}")
        if not 0 < self.master_port < 65536:
            raise ContractError(f"{MASTER_PORT} must be a TCP port, got {self.master_port}")
        for name, value in (
            (CHECKPOINT_INTERVAL, self.checkpoint_interval),
            (CHECKPOINT_KEEP, self.checkpoint_keep),
        ):
            if value is not None and value < 1:
                raise ContractError(f"{name} must be >= 1, got {value}")
        if self.process is not None and not 0 <= self.process.rank < self.process.world_size:
            raise ContractError(
                f"{RANK} must be in [0, {WORLD_SIZE}={self.process.world_size}), "
                f"got {self.process.rank}"
            )

    @property
    def world_size(self) -> int:
        return self.nodes * self.processes_per_node

    @property
    def rendezvous_id(self) -> str:
        return f"{self.job_name}-gen{self.restart_count}"

    @property
    def local_rank(self) -> int:
        return self.process.local_rank if self.process else 0

    @property
    def ranks(self) -> ProcessRanks | None:
        """This process's ranks; with one process per pod of a fixed gang the pod's
        own are known (an elastic job's come from each rendezvous round)."""
        alone = self.processes_per_node == 1 and self.elastic is None
        if self.process is None and alone and self.in_place_restarts == 0:
            return ProcessRanks(rank=self.node_rank, world_size=self.nodes)
        return self.process

    def to_env(self) -> dict[str, str]:
        """The variables the operator puts on the pod, as strings."""
        env = {
            PET_NNODES: str(self.nodes),
            PET_NPROC_PER_NODE: str(self.processes_per_node),
            PET_NODE_RANK: str(self.node_rank),
            PET_MASTER_ADDR: self.master_addr,
            PET_MASTER_PORT: str(self.master_port),
            PET_RDZV_ID: self.rendezvous_id,
            MASTER_ADDR: self.master_addr,
            MASTER_PORT: str(self.master_port),
            NNODES: str(self.nodes),
            NODE_RANK: str(self.node_rank),
            NPROC_PER_NODE: str(self.processes_per_node),
            JOB_NAME: self.job_name,
            NAMESPACE: self.namespace,
            RESTART_COUNT: str(self.restart_count),
            METRICS_PORT: str(self.metrics_port),
        }
        optional = {
            CHECKPOINT_DIR: self.checkpoint_dir,
            CHECKPOINT_INTERVAL: self.checkpoint_interval,
            CHECKPOINT_KEEP: self.checkpoint_keep,
            TRAIN_CONFIG: self.train_config,
            IN_PLACE_RESTARTS: self.in_place_restarts,
        }
        env.update({name: str(value) for name, value in optional.items() if value})
        if self.elastic is not None:
            # Each rendezvous round numbers the nodes that joined it: a pod has
            # no node rank, so a recreated worker's pod is the same whoever survives.
            del env[PET_NODE_RANK], env[NODE_RANK]
            env.update(self.elastic.to_env())
        ranks = self.ranks
        if ranks is not None:
            # One process per pod: it is its own launcher, so the per-process
            # values are known here and plain env:// scripts work unmodified.
            env[RANK] = str(ranks.rank)
            env[WORLD_SIZE] = str(ranks.world_size)
            env[LOCAL_RANK] = str(ranks.local_rank)
            env[LOCAL_WORLD_SIZE] = str(self.processes_per_node)
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PodContract:
        """Reads the contract back; a missing or malformed variable is named."""
        env = os.environ if env is None else env
        return cls(
            job_name=env.get(JOB_NAME, "local"),
            namespace=env.get(NAMESPACE, "default"),
            master_addr=env.get(MASTER_ADDR, "127.0.0.1"),
            master_port=_int(env, MASTER_PORT, DEFAULT_MASTER_PORT),
            nodes=_int(env, NNODES, 1),
            node_rank=_int(env, NODE_RANK, 0),
            processes_per_node=_int(env, NPROC_PER_NODE, 1),
            restart_count=_int(env, RESTART_COUNT, 0),
            checkpoint_dir=env.get(CHECKPOINT_DIR) or None,
            checkpoint_interval=_optional_int(env, CHECKPOINT_INTERVAL),
            checkpoint_keep=_optional_int(env, CHECKPOINT_KEEP),
            metrics_port=_int(env, METRICS_PORT, DEFAULT_METRICS_PORT),
            train_config=env.get(TRAIN_CONFIG) or None,
            process=_process_ranks(env),
            elastic=_elastic(env),
            termination_message_path=env.get(TERMINATION_MESSAGE_PATH_ENV)
            or TERMINATION_MESSAGE_PATH,
            in_place_restarts=_int(env, IN_PLACE_RESTARTS, 0),
        )


def _elastic(env: Mapping[str, str]) -> ElasticRendezvous | None:
    """The elastic rendezvous when PET_RDZV_BACKEND is c10d; None for a fixed gang."""
    backend = env.get(PET_RDZV_BACKEND) or STATIC_RDZV_BACKEND
    if backend not in (ELASTIC_RDZV_BACKEND, STATIC_RDZV_BACKEND):
        raise ContractError(
            f"{PET_RDZV_BACKEND} must be {ELASTIC_RDZV_BACKEND!r} (elastic) or "
            f"{STATIC_RDZV_BACKEND!r}, got {backend!r}"
        )
    low, high = _node_range(env.get(PET_NNODES) or "1")
    if backend == STATIC_RDZV_BACKEND:
        if low != high:
            raise ContractError(
                f"{PET_RDZV_BACKEND} must be {ELASTIC_RDZV_BACKEND!r} when {PET_NNODES} is a "
                f"range ({low}:{high})"
            )
        return None
    return ElasticRendezvous(
        min_nodes=low,
        max_nodes=high,
        endpoint=env.get(PET_RDZV_ENDPOINT, ""),
        run_id=env.get(PET_RDZV_ID, ""),
        max_restarts=_int(env, PET_MAX_RESTARTS, 0),
        conf=env.get(PET_RDZV_CONF, ""),
        local_addr=env.get(PET_LOCAL_ADDR) or None,
    )


def _node_range(raw: str) -> tuple[int, int]:
    """torchrun's --nnodes: "n" or "min:max"."""
    low, sep, high = raw.partition(":")
    try:
        return int(low), int(high if sep else low)
    except ValueError:
        raise ContractError(f"{PET_NNODES} must be n or min:max, got {raw!r}") from None


def _process_ranks(env: Mapping[str, str]) -> ProcessRanks | None:
    """torchrun sets RANK and WORLD_SIZE together; without both this is a launcher."""
    if not env.get(RANK) or not env.get(WORLD_SIZE):
        return None
    return ProcessRanks(
        rank=_int(env, RANK, 0),
        world_size=_int(env, WORLD_SIZE, 1),
        local_rank=_int(env, LOCAL_RANK, 0),
        local_world_size=_int(env, LOCAL_WORLD_SIZE, 1),
    )


def _optional_int(env: Mapping[str, str], name: str) -> int | None:
    return _int(env, name, 0) if env.get(name) else None


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ContractError(f"{name} must be an integer, got {raw!r}") from None
