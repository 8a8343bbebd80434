"""A runtime's spec merged under a job's: the precedence, in one place. Pure.

Both sides are wire data (camelCase dicts, as the API server stores them).

* The job's fields win, field by field: objects merge key by key down to
  their leaves (a job's ``resources.gpus`` and a runtime's ``resources.cpu``
  both stay).
* A leaf of the job that holds its schema default yields to the runtime's:
  the API server writes every default into a stored job, so there a default
  cannot be told from a value its author wrote (a job that wants
  ``backoffLimit: 3`` under a runtime's 10 cannot have it; set another value).
* Pod templates (``master``/``worker`` ``.template.spec``) merge as pod specs:
  containers (and init containers) by name, each container's env by variable
  name and volume mounts by mount path, volumes by name; a container, variable,
  mount or volume of the job's replaces the runtime's of the same name whole.
  Other lists (tolerations, args) are the job's when it has one.
* Lists elsewhere are the job's when it has one (not its default).

The merged spec is validated as a whole; :func:`source` tells which side a
field of it came from, for an error that names it.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from torchfleet_operator.api.constants import CLUSTER_RUNTIME_KIND

_MISSING = object()
# Lists of objects that merge by a key (pod specs and containers).
_KEYED_LISTS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
}
# Objects of these keys merge as pod specs.
_POD_SPEC_PATHS = (("master", "template", "spec"), ("worker", "template", "spec"))
# A checkpoint names one claim: the job's choice replaces the runtime's.
_CLAIM = ("claimName", "claimTemplate")

JOB = "the job"


def runtime_source(kind: str, name: str) -> str:
    """How an error names a runtime: ``ClusterTrainingRuntime gpu-nccl``."""
    return f"{kind} {name}"


def spec_hash(runtime_spec: dict[str, Any]) -> str:
    """A short, stable digest of a runtime's spec (status.runtime.hash)."""
    text = json.dumps(runtime_spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@lru_cache(maxsize=1)
def _job_spec_schema() -> dict[str, Any]:
    from torchfleet_operator.api.crdgen import openapi_schema  # the CRD's own defaults

    schema: dict[str, Any] = openapi_schema()["properties"]["spec"]
    return schema


def schema_default(path: tuple[str, ...]) -> Any:
    """The default the API server writes at ``path`` of a job's spec (or _MISSING)."""
    node: Any = _job_spec_schema()
    for key in path:
        properties = node.get("properties") or {}
        if key in properties:
            node = properties[key]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return _MISSING
    return node.get("default", _MISSING)


def merge_spec(job: dict[str, Any], runtime: dict[str, Any]) -> dict[str, Any]:
    """The job's spec over the runtime's (the module docstring's precedence)."""
    merged: dict[str, Any] = _merge(job, _applicable(job, runtime), ())
    return merged


def merged_over_record(body: dict[str, Any]) -> dict[str, Any] | None:
    """A stored job's spec merged over the runtime its status records
    (status.runtime, written when the runtime was resolved), when the record
    is of the runtime its spec.runtimeRef names; None without such a record.
    For readers of a stored job (the CLI) as much as for the operator."""
    spec = body.get("spec")
    ref = spec.get("runtimeRef") if isinstance(spec, dict) else None
    recorded = (body.get("status") or {}).get("runtime")
    if not isinstance(spec, dict) or not isinstance(ref, dict) or not isinstance(recorded, dict):
        return None
    if (ref.get("kind") or CLUSTER_RUNTIME_KIND, ref.get("name")) != (
        recorded.get("kind"),
        recorded.get("name"),
    ):
        return None
    runtime = recorded.get("spec")
    return merge_spec(spec, runtime if isinstance(runtime, dict) else {})


def _applicable(job: dict[str, Any], runtime: dict[str, Any]) -> dict[str, Any]:
    """The runtime's spec less what the job's own choices make moot: its
    trainer defaults for a job with a command of its own, and its checkpoint
    claim (claimName or claimTemplate) for a job that names one."""
    runtime = dict(runtime)
    if job.get("command") is not None:
        runtime.pop("trainer", None)
    ours, theirs = job.get("checkpoint"), runtime.get("checkpoint")
    if isinstance(ours, dict) and isinstance(theirs, dict) and set(ours) & set(_CLAIM):
        runtime["checkpoint"] = {k: v for k, v in theirs.items() if k not in _CLAIM}
    return runtime


def _merge(job: Any, runtime: Any, path: tuple[str, ...]) -> Any:
    if job is _MISSING:
        return copy.deepcopy(runtime)
    if runtime is _MISSING:
        return copy.deepcopy(job)
    if path in _POD_SPEC_PATHS and isinstance(job, dict) and isinstance(runtime, dict):
        return merge_pod_spec(job, runtime)
    if isinstance(job, dict) and isinstance(runtime, dict):
        return {
            key: _merge(job.get(key, _MISSING), runtime.get(key, _MISSING), (*path, key))
            for key in (*runtime, *(k for k in job if k not in runtime))
        }
    default = schema_default(path)
    if default is not _MISSING and job == default:
        return copy.deepcopy(runtime)
    return copy.deepcopy(job)


def merge_pod_spec(job: dict[str, Any], runtime: dict[str, Any]) -> dict[str, Any]:
    """Two pod specs: containers by name, volumes by name, objects key by key."""
    return _merge_plain(job, runtime, _merge_container)


def _merge_container(job: dict[str, Any], runtime: dict[str, Any]) -> dict[str, Any]:
    return _merge_plain(job, runtime, None)


def _merge_plain(
    job: dict[str, Any],
    runtime: dict[str, Any],
    item_merge: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] | None,
) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for key in (*runtime, *(k for k in job if k not in runtime)):
        ours, theirs = job.get(key, _MISSING), runtime.get(key, _MISSING)
        if ours is _MISSING or theirs is _MISSING:
            merged[key] = copy.deepcopy(theirs if ours is _MISSING else ours)
        elif key in _KEYED_LISTS and isinstance(ours, list) and isinstance(theirs, list):
            merge = item_merge if key in ("containers", "initContainers") else None
            merged[key] = _merge_keyed(ours, theirs, _KEYED_LISTS[key], merge)
        elif isinstance(ours, dict) and isinstance(theirs, dict):
            merged[key] = _merge_plain(ours, theirs, None)
        else:
            merged[key] = copy.deepcopy(ours)
    return merged


def _merge_keyed(
    job: list[Any],
    runtime: list[Any],
    key: str,
    merge: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] | None,
) -> list[Any]:
    """The runtime's items in their order (each merged with, or replaced by,
    the job's of the same key), then the job's others in theirs."""
    jobs = {_key(item, key): item for item in job}
    merged = []
    for item in runtime:
        ours = jobs.pop(_key(item, key), _MISSING)
        if ours is _MISSING:
            merged.append(copy.deepcopy(item))
        elif merge is not None and isinstance(ours, dict) and isinstance(item, dict):
            merged.append(merge(ours, item))
        else:
            merged.append(copy.deepcopy(ours))
    taken = {id(item) for item in jobs.values()}
    merged.extend(copy.deepcopy(item) for item in job if id(item) in taken)
    return merged


def _key(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, dict) else json.dumps(item, sort_keys=True)


# ---- which side a field came from ------------------------------------------------------


def source(path: str, job: dict[str, Any], runtime: dict[str, Any], runtime_name: str) -> str:
    """Which side a field of the merged spec came from, for an error naming it:
    ``runtime_name`` when the runtime set it and the job did not (or held only
    its default), else the job. ``path`` is a validation error's dotted path
    (``spec.network.ibHCAs``, ``spec.worker.template.spec.containers[0].image``)."""
    parts = _split(path)
    if parts[:1] == ["spec"]:
        parts = parts[1:]
    runtime = _applicable(job, runtime)
    ours, theirs = _walk(parts, job, runtime, merge_spec(job, runtime))
    if ours is not _MISSING and not _is_default(ours, parts):
        return JOB
    return runtime_name if theirs is not _MISSING else JOB


def _walk(parts: list[str | int], job: Any, runtime: Any, merged: Any) -> tuple[Any, Any]:
    """The job's and runtime's values at ``parts`` of the merged spec (list
    items found by their merge key), as deep as the path exists in either."""
    walked: tuple[str, ...] = ()
    for part in parts:
        if isinstance(part, int):
            if not isinstance(merged, list) or part >= len(merged):
                break
            item = merged[part]
            key = _KEYED_LISTS.get(walked[-1] if walked else "", "")
            job = _find(job, key, item)
            runtime = _find(runtime, key, item)
            merged = item
            continue
        nxt = merged.get(part, _MISSING) if isinstance(merged, dict) else _MISSING
        if nxt is _MISSING:
            break
        job = job.get(part, _MISSING) if isinstance(job, dict) else _MISSING
        runtime = runtime.get(part, _MISSING) if isinstance(runtime, dict) else _MISSING
        merged = nxt
        walked = (*walked, part)
    return job, runtime


def _find(items: Any, key: str, like: Any) -> Any:
    if not isinstance(items, list) or not key or not isinstance(like, dict):
        return _MISSING
    return next((i for i in items if isinstance(i, dict) and i.get(key) == like.get(key)), _MISSING)


def _is_default(value: Any, parts: list[str | int]) -> bool:
    if any(isinstance(p, int) for p in parts):
        return False
    if isinstance(value, dict):
        return all(_is_default(v, [*parts, k]) for k, v in value.items())
    default = schema_default(tuple(str(p) for p in parts))
    return default is not _MISSING and value == default


def _split(path: str) -> list[str | int]:
    parts: list[str | int] = []
    for piece in path.split("."):
        name, *indices = piece.split("[")
        if name:
            parts.append(name)
        parts.extend(int(index.rstrip("]")) for index in indices if index.rstrip("]").isdigit())
    return parts
