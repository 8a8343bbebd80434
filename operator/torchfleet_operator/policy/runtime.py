"""spec.runtimeRef: the runtime a job takes its defaults from. Pure.

Resolved once: the first pass that finds the runtime records its spec,
generation and hash in ``status.runtime`` (condition RuntimeResolved), and
every later pass merges the job's spec over that record, never over the
runtime as it is now. Editing or deleting a runtime therefore changes no job
that resolved it, and an operator restarted mid-run reads the record back from
the job itself. The status holds it, not an annotation: only the operator
writes a status (the one write of its pass), so the record cannot be edited
by the job's author nor cost a second write.

A job whose runtime is not there yet waits, Pending, with RuntimeResolved
False (reason RuntimeNotFound); the runtime's watch queues it once it appears.
The merge (api/runtime_merge.py) is validated as a whole by the caller, its
errors naming each field's side (:attr:`Resolved.source`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torchfleet_operator.api import constants as c
from torchfleet_operator.api import reasons as r
from torchfleet_operator.api.runtime_merge import (
    merge_spec,
    merged_over_record,
    runtime_source,
    source,
    spec_hash,
)
from torchfleet_operator.api.v1alpha1 import ResolvedRuntime
from torchfleet_operator.observed import ObservedRuntime
from torchfleet_operator.planning import Pass, Plan


@dataclass(frozen=True)
class Resolved:
    """The job to plan for: its body with the merged spec, and (with a
    runtime) which side a field of that spec came from."""

    body: dict[str, Any]
    source: Callable[[str], str] | None = None


def reference(spec: Any) -> tuple[str, str] | None:
    """(kind, name) that ``spec.runtimeRef`` names; None without one. Read
    from the raw spec: the job has not been parsed yet."""
    ref = spec.get("runtimeRef") if isinstance(spec, dict) else None
    if not isinstance(ref, dict) or not isinstance(ref.get("name"), str):
        return None
    kind = ref.get("kind")
    return (kind if isinstance(kind, str) else c.CLUSTER_RUNTIME_KIND), ref["name"]


def resolve(step: Pass, body: dict[str, Any]) -> Resolved | Plan:
    """The job merged over its recorded runtime (recorded now, when this pass
    is the first to find it); a finished waiting Plan when it is not there."""
    spec = body.get("spec")
    ref = reference(spec)
    if ref is None or not isinstance(spec, dict):
        return Resolved(body)
    kind, name = ref
    recorded = step.status.runtime
    if recorded is None or (recorded.kind, recorded.name) != ref:
        found = step.observed.runtime
        if found is None or (found.kind, found.name) != ref:
            return _wait(step, kind, name)
        recorded = ResolvedRuntime(
            kind=kind,
            name=name,
            generation=found.generation,
            hash=spec_hash(found.spec),
            spec=found.spec,
        )
        step.status.runtime = recorded
        step.set_condition(
            r.CONDITION_RUNTIME_RESOLVED,
            True,
            r.REASON_RUNTIME_RESOLVED,
            f"{runtime_source(kind, name)} generation {found.generation} (spec hash "
            f"{recorded.hash}) resolved; later changes to it do not apply to this job",
        )
    runtime_spec = recorded.spec
    label = runtime_source(kind, name)
    merged = {**body, "spec": merge_spec(spec, runtime_spec)}
    return Resolved(merged, lambda path: source(path, spec, runtime_spec, label))


def merged_spec(body: dict[str, Any], found: ObservedRuntime | None) -> dict[str, Any]:
    """The job's spec as this pass will plan it, read before the pass: merged
    over the recorded runtime, else over the one the watch has (the pass
    records it), else the job's own (no runtime, or waiting for it). For what
    the shell looks up by a name the spec holds (the PriorityClass of Kueue's
    Workload), so that a runtime's value counts as the job's own."""
    spec = body.get("spec")
    if not isinstance(spec, dict):
        return {}
    ref = reference(spec)
    if ref is None:
        return spec
    recorded = merged_over_record(body)
    if recorded is not None:
        return recorded
    if found is not None and (found.kind, found.name) == ref:
        return merge_spec(spec, found.spec)
    return spec


def _wait(step: Pass, kind: str, name: str) -> Plan:
    where = "" if kind == c.CLUSTER_RUNTIME_KIND else f" in namespace {step.namespace}"
    step.set_condition(
        r.CONDITION_RUNTIME_RESOLVED,
        False,
        r.REASON_RUNTIME_NOT_FOUND,
        f"spec.runtimeRef names {kind} {name}, which does not exist{where}: the job "
        "waits and starts once it is created",
    )
    if step.phase is None:
        step.set_phase(c.PHASE_PENDING)
    return step.finalize()
