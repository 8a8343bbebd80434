"""checkov over the pods the operator builds for every job in examples/: each
finding is fixed or has its reason in tests/checkov-skips.yaml (scope: pods)."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.fixtures.checkov import assert_explained, load_skips, scan, write_documents
from torchfleet_operator.api.v1alpha1 import TrainingJob
from torchfleet_operator.config import DEFAULT_TRAINER_IMAGE
from torchfleet_operator.desired.pods import build_pod

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
NAMESPACE = "team"
# The chart's operator.defaults.shmSize.
SHM_SIZE = "16Gi"


def example_jobs() -> dict[str, TrainingJob]:
    jobs = {}
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for body in yaml.safe_load_all(path.read_text()):
            if body and body.get("kind") == "TrainingJob":
                body["metadata"] |= {"namespace": NAMESPACE, "uid": "uid-1"}
                jobs[path.stem] = TrainingJob.model_validate(body)
    return jobs


def test_the_pods_of_every_example_pass_checkov_or_say_why(tmp_path: Path) -> None:
    jobs = example_jobs()
    assert len(jobs) >= 10, sorted(jobs)
    for stem, job in jobs.items():
        name = job.metadata.name
        # The master and a worker: their templates may differ.
        pods = [
            build_pod(name, NAMESPACE, "uid-1", job.spec, rank, 0, DEFAULT_TRAINER_IMAGE, SHM_SIZE)
            for rank in (0, 1)
        ]
        write_documents(tmp_path / f"{stem}.yaml", pods)
    assert_explained(scan(tmp_path), load_skips("pods"))
