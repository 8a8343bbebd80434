"""Reading TrainingJobs from the API server into the models, and back."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from torchfleet_operator.api.base import RuleViolation
from torchfleet_operator.api.podspec import PodSpecViolation
from torchfleet_operator.api.v1alpha1 import TrainingJob, TrainingJobSpec, TrainingJobStatus


class InvalidSpecError(ValueError):
    """A TrainingJob the models reject. ``field`` is the first offending field's
    dotted path (e.g. ``spec.worker.replicas``); the message lists every problem
    as ``path: message``, ready for a condition with reason InvalidSpec."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        self.field = problems[0][0] if problems else ""
        super().__init__("; ".join(f"{path}: {message}" for path, message in problems))


def _join_path(loc: tuple[int | str, ...], prefix: str) -> str:
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path


def _problems(error: ValidationError, prefix: str) -> list[tuple[str, str]]:
    problems = []
    for item in error.errors(include_url=False):
        path = _join_path(item["loc"], prefix)
        cause = (item.get("ctx") or {}).get("error")
        if isinstance(cause, RuleViolation) and cause.rule.field_path:
            # A model-level rule blames one field below the model.
            path = (path + cause.rule.field_path).lstrip(".")
        elif isinstance(cause, PodSpecViolation):
            path += cause.path  # the field inside a template's pod spec
        message = str(cause) if cause is not None else item["msg"]
        problems.append((path, message.removeprefix("Value error, ")))
    return problems


def _plain(value: Any) -> Any:
    """Plain dicts and lists all the way down: the models validate strictly, like
    the API server, and a client's mapping views (kopf's Body) are not dicts."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def parse_training_job(raw: Mapping[str, Any]) -> TrainingJob:
    """A TrainingJob (as read from the API server) as models with every default
    applied; raises :class:`InvalidSpecError` naming the offending fields."""
    try:
        return TrainingJob.model_validate(_plain(raw))
    except ValidationError as error:
        raise InvalidSpecError(_problems(error, "")) from None


def parse_spec(raw: Mapping[str, Any]) -> TrainingJobSpec:
    """Only ``spec``, for callers that hold it alone; paths start with ``spec``."""
    try:
        return TrainingJobSpec.model_validate(_plain(raw))
    except ValidationError as error:
        raise InvalidSpecError(_problems(error, "spec")) from None


def to_manifest(job: TrainingJob) -> dict[str, Any]:
    """The job as plain JSON-ready data with camelCase keys, unset fields left out."""
    return job.model_dump(mode="json", by_alias=True, exclude_none=True)


def read_status(raw: Any) -> TrainingJobStatus:
    """A stored status as the typed model. Read, not trusted: a field the model
    refuses (written by hand, or by an operator that knew it otherwise) is left
    out, as if it was never written, and the rest is kept. Strictly, as JSON: a
    count is a JSON integer (not a bool, not a string of digits)."""
    status = _plain(raw) if isinstance(raw, Mapping) else {}
    for _ in range(len(status) + 1):
        try:
            return TrainingJobStatus.model_validate_json(json.dumps(status), strict=True)
        except ValidationError as error:
            refused = {item["loc"][0] for item in error.errors() if item["loc"]}
            status = {key: value for key, value in status.items() if key not in refused}
    return TrainingJobStatus()


def wire(model: BaseModel) -> dict[str, Any]:
    """A status model as the API server stores it: camelCase, JSON values, only
    the fields that were read or written (a default never written stays
    unwritten) and none that is null."""
    return model.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude_none=True)


def status_wire(status: TrainingJobStatus) -> dict[str, Any]:
    """The whole status, as the one write of a pass sends it."""
    return wire(status)
