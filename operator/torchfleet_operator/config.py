"""Operator settings, read from ``TORCHFLEET_OPERATOR_*`` variables; the
command line (main.py) takes its defaults from here and may override them.

Defaults suit a real cluster; tests shrink the back-offs through the same
variables so that restart scenarios take seconds, not minutes.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from torchfleet_contract import pod as contract

ENV_PREFIX = "TORCHFLEET_OPERATOR_"
# The image of pods whose job names none (spec.image, the templates' trainer).
DEFAULT_TRAINER_IMAGE = "ghcr.io/torchfleet/trainer:0.1.0"
_TRUE = ("1", "true", "yes")


@dataclasses.dataclass(frozen=True)
class OperatorConfig:
    # Gang restart back-off: base * 2**(restarts so far), capped.
    restart_backoff_seconds: float = 10.0
    restart_backoff_max_seconds: float = 300.0
    # Back-off for a job whose children the apiserver refuses (quota, admission).
    apply_backoff_seconds: float = 1.0
    apply_backoff_max_seconds: float = 120.0
    # A pod whose node has been NotReady this long counts as lost.
    node_lost_grace_seconds: float = 30.0
    # A pod on a NotReady/Unknown node (or one tainted out-of-service) that is
    # still terminating this long after the node went is force-deleted: a dead
    # kubelet never confirms a deletion, and the next gang waits for it.
    node_loss_force_delete_seconds: float = 60.0
    # A trainer container stuck in image pull back-off this long after the
    # kubelet took its pod fails the gang (retryable, counted): a gang that
    # cannot start must not hold the other nodes for ever.
    image_pull_bound_seconds: float = 300.0
    # A failure that would end the job (a permanent exit) is decided only once
    # the gang's other pods have ended, or this long after it: kubelets report
    # independently, and the OOM kill that took the peers down with exit 1 can
    # arrive after their exits (the first to end decides; policy/failure.py).
    failure_settle_seconds: float = 10.0
    # How often the master's /metrics is read for status.progress; 0 disables.
    progress_interval_seconds: float = 15.0
    # The port it is read on: the pod contract's metrics port, unless a
    # job's own script serves /metrics elsewhere.
    progress_port: int = contract.DEFAULT_METRICS_PORT
    # Pod events wake their job this long after the first one, so that a gang's
    # burst of events (created, scheduled, Running x 9) is one pass and one
    # status write, not nine (the Job controller's podUpdateBatchPeriod).
    pod_event_batch_seconds: float = 1.0
    # A status change of pod counts alone (nodesReady, replicaStatuses) is
    # written at most this often per job; any other change goes at once
    # (status/pacing.py). 0 writes every change.
    status_counts_interval_seconds: float = 5.0
    # Every job is reconciled at least this often, whatever the events say.
    resync_seconds: float = 300.0
    # Leader election (with --leader-elect): client-go's defaults. A leader
    # that cannot renew for the deadline exits; a standby takes an expired lease.
    lease_duration_seconds: int = 15
    lease_renew_deadline_seconds: float = 10.0
    lease_retry_period_seconds: float = 2.0
    # Concurrent reconciles, and concurrent API calls within one reconcile.
    workers: int = 8
    api_concurrency: int = 16
    # Pods of jobs that name no image run this one.
    trainer_image: str = DEFAULT_TRAINER_IMAGE
    # /dev/shm of jobs that set no spec.resources.shmSize (a quantity, e.g.
    # 16Gi); empty: bounded only by the pod's memory limit.
    default_shm_size: str = ""
    # kopf's liveness endpoint and the operator's Prometheus /metrics (0: off).
    health_port: int = 8080
    metrics_port: int = 9090
    # Run as one of several replicas; the holder of this Lease reconciles.
    leader_elect: bool = False
    lease_name: str = "torchfleet-operator"
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, (int, float)) and value < 0:
                raise ValueError(f"{ENV_PREFIX}{field.name.upper()} must be >= 0, got {value}")
        if self.workers < 1 or self.api_concurrency < 1:
            raise ValueError(f"{ENV_PREFIX}WORKERS and {ENV_PREFIX}API_CONCURRENCY must be >= 1")
        for name in ("progress_port", "health_port", "metrics_port"):
            port = getattr(self, name)
            lowest = 0 if name == "metrics_port" else 1  # metrics: 0 turns them off
            if not lowest <= port <= 65535:
                raise ValueError(f"{ENV_PREFIX}{name.upper()} must be a TCP port, got {port}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        """Reads every field from ``TORCHFLEET_OPERATOR_<FIELD>``; bad values are named."""
        env = os.environ if env is None else env
        values: dict[str, float | int | str | bool] = {}
        for field in dataclasses.fields(cls):
            name = f"{ENV_PREFIX}{field.name.upper()}"
            raw = env.get(name)
            if raw is None or raw == "":
                continue
            if field.type in (str, "str"):
                values[field.name] = raw
            elif field.type in (bool, "bool"):
                values[field.name] = raw.lower() in _TRUE
            else:
                kind = int if field.type in (int, "int") else float
                try:
                    values[field.name] = kind(raw)
                except ValueError:
                    expected = "an integer" if kind is int else "a number"
                    raise ValueError(f"{name} must be {expected}, got {raw!r}") from None
        return cls(**values)  # type: ignore[arg-type]
