"""Round trip: a job stored by the API server reads back into the models with
the same defaults the models apply, and nothing the author wrote is lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.api import TrainingJobs
from tests.unit.api.cases import job
from torchfleet_operator.api import parse_training_job, to_manifest

pytestmark = pytest.mark.cluster

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
MANIFESTS = [
    pytest.param(job("minimal"), id="minimal"),
    pytest.param(
        job("checkpointed", {"checkpoint": {"claimTemplate": {"size": "1Gi"}}}), id="claim-template"
    ),
    *(pytest.param(yaml.safe_load(p.read_text()), id=p.stem) for p in EXAMPLES),
]


@pytest.mark.parametrize("manifest", MANIFESTS)
def test_stored_job_parses_with_the_models_defaults(
    manifest: dict[str, Any], trainingjobs: TrainingJobs, namespace: str
) -> None:
    trainingjobs.create(namespace, manifest)
    stored = trainingjobs.get(namespace, manifest["metadata"]["name"])

    expected = parse_training_job(manifest)
    parsed = parse_training_job(stored)
    assert parsed.spec == expected.spec
    assert parsed.metadata.generation == 1 and parsed.metadata.namespace == namespace

    # The server applied every spec default itself (the trainer config has
    # none in the schema: it is stored as written, the image applies its own).
    want = to_manifest(expected)["spec"]
    want.pop("trainer", None)
    got = dict(stored["spec"])
    assert got.pop("trainer", None) == manifest["spec"].get("trainer")
    assert got == want
