"""Small builders for operator unit tests: a job body, observed pods, a clock,
and what a plan creates and deletes."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError

from torchfleet_operator.api.parse import parse_training_job, status_wire
from torchfleet_operator.api.v1alpha1 import TrainingJobSpec, TrainingJobStatus
from torchfleet_operator.config import OperatorConfig
from torchfleet_operator.desired.pods import pod_name_for_rank
from torchfleet_operator.observed import Observed, ObservedPod
from torchfleet_operator.planning import Pass, Plan

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
CONFIG = OperatorConfig(
    restart_backoff_seconds=10, restart_backoff_max_seconds=300, node_lost_grace_seconds=30
)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def stamp(seconds: float) -> str:
    return at(seconds).strftime("%Y-%m-%dT%H:%M:%SZ")


def job(
    name: str = "llm", workers: int = 2, status: dict[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "torchfleet.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": "team", "uid": "uid-1", "generation": 1},
        "spec": {"worker": {"replicas": workers}, **copy.deepcopy(spec)},
    }
    if status is not None:
        body["status"] = status
    return body


def pod(
    job_name: str, rank: int, restart: int = 0, phase: str = "Running", **fields: Any
) -> ObservedPod:
    return ObservedPod(
        name=pod_name_for_rank(job_name, rank),
        uid=f"{job_name}-{rank}-{restart}",
        role="master" if rank == 0 else "worker",
        node_rank=rank,
        restart=restart,
        phase=phase,
        node_name=fields.pop("node_name", "node-a"),
        **fields,
    )


def gang(
    job_name: str = "llm",
    nodes: int = 3,
    restart: int = 0,
    phase: str = "Running",
    **overrides: ObservedPod,
) -> tuple[ObservedPod, ...]:
    """All pods of one generation; ``overrides`` replaces pods by name."""
    pods = [pod(job_name, rank, restart, phase) for rank in range(nodes)]
    return tuple(overrides.get(p.name, p) for p in pods)


def observed(*pods: ObservedPod, **fields: Any) -> Observed:
    return Observed(pods=tuple(pods), has_service=True, **fields)


def running_status(restart: int = 0, **extra: Any) -> dict[str, Any]:
    return {"phase": "Running", "restartCount": restart, "startTime": stamp(0), **extra}


def created_names(plan: Plan) -> list[str]:
    """The pods a plan creates, in the order it creates them."""
    return [m["metadata"]["name"] for m in plan.create if m["kind"] == "Pod"]


def deleted_names(plan: Plan) -> list[str]:
    """The children a plan deletes, sorted."""
    return sorted(ref.name for ref in plan.delete)


def spec_of(workers: int = 2, **spec: Any) -> TrainingJobSpec:
    """The parsed spec of ``job(workers=workers, **spec)``."""
    return parse_training_job(job(workers=workers, **spec)).spec


def a_pass(
    seen: Observed | None = None,
    status: dict[str, Any] | None = None,
    now: float = 0,
    workers: int = 2,
    **spec: Any,
) -> Pass:
    """A planning pass over ``job(workers=workers, **spec)``, for one policy to decide in."""
    body = job(workers=workers, **spec)
    return Pass(body, dict(status or {}), seen or observed(), at(now), CONFIG)


def status_of(step: Pass) -> dict[str, Any]:
    """The status a pass has decided so far, as its write would send it."""
    return status_wire(step.status)


def literal_env(pod: dict[str, Any]) -> dict[str, str]:
    """The trainer container's env set by value (a valueFrom entry is the
    downward API's, resolved only on the node)."""
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if "value" in e}


def status_wire_problem(status: dict[str, Any]) -> str | None:
    """What keeps ``status`` from being exactly what the typed status model reads
    and writes back (its keys and values, as JSON); None when nothing does."""
    wire = json.loads(json.dumps(status))
    try:
        model = TrainingJobStatus.model_validate(wire)
    except ValidationError as exc:
        return f"the status model refuses: {exc}"
    back = model.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude_none=True)
    changed = sorted(k for k in wire.keys() | back.keys() if wire.get(k) != back.get(k))
    if changed:
        shown = "; ".join(f"{k}: {wire.get(k)!r} reads back as {back.get(k)!r}" for k in changed)
        return f"the status model changes: {shown}"
    return None
