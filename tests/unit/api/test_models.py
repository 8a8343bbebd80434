"""The models: invalid specs named by field, defaults, derived values."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.api.cases import (
    DEEPSPEED_ACCEPTED,
    ELASTIC_ACCEPTED,
    INVALID,
    KNOBS_ACCEPTED,
    RICH_POD_SPEC,
    Invalid,
    Manifest,
    job,
    nested,
)
from torchfleet_operator.api import (
    InvalidSpecError,
    TrainingJobSpec,
    parse_spec,
    parse_training_job,
    to_manifest,
)

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("case", INVALID, ids=lambda case: case.id)
def test_invalid_spec_is_rejected_naming_the_field(case: Invalid) -> None:
    with pytest.raises(InvalidSpecError) as caught:
        parse_training_job(case.manifest())
    assert case.field in str(caught.value), str(caught.value)
    assert case.says in str(caught.value), str(caught.value)
    assert caught.value.field.startswith(case.field) or case.field.startswith(caught.value.field)


def test_every_problem_is_listed_with_its_path() -> None:
    spec = {"master": {"replicas": 3}, "worker": {"replicas": -2}, "suspend": "yes"}
    with pytest.raises(InvalidSpecError) as caught:
        parse_training_job(job(spec=spec))
    paths = [path for path, _ in caught.value.problems]
    assert paths == ["spec.master.replicas", "spec.worker.replicas", "spec.suspend"]


class _MappingView(Mapping[str, Any]):
    """Like a client's read-only view of an object (kopf's Body): not a dict."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        value = self._data[key]
        return _MappingView(value) if isinstance(value, dict) else value

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def test_mapping_views_parse_like_dicts() -> None:
    raw = job(spec={"worker": {"replicas": 2}, "command": ["torchrun", "x.py"]})
    assert parse_training_job(_MappingView(raw)) == parse_training_job(raw)


def test_parse_spec_prefixes_paths_with_spec() -> None:
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec({"network": {"gidIndex": -1}})
    assert caught.value.field == "spec.network.gidIndex"


def test_defaults_are_applied() -> None:
    spec = parse_training_job(job()).spec
    assert to_manifest(parse_training_job(job()))["spec"] == {
        "processesPerNode": "auto",
        "resources": {"gpus": 0, "gpuResourceName": "nvidia.com/gpu"},
        "master": {"replicas": 1},
        "worker": {"replicas": 0},
        "network": {"transport": "auto", "ibHCAMatch": "Exact", "hostNetwork": False},
        "runPolicy": {
            "backoffLimit": 3,
            "restartPolicy": "OnFailure",
            "cleanPodPolicy": "Running",
            "successPolicy": "Master",
            "stragglers": {
                "threshold": 1.3,
                "windows": 3,
                "action": "Report",
                "maxReplacements": 3,
            },
            "stall": {"stepTimeMultiple": 20.0, "minSeconds": 300, "action": "Report"},
        },
        "scheduling": {"podGroup": "None"},
        "suspend": False,
    }
    assert spec.runs_trainer and spec.trainer is None


def test_checkpoint_defaults() -> None:
    spec = parse_spec({"checkpoint": {"claimTemplate": {"size": "1Gi"}}})
    assert spec.checkpoint is not None and spec.checkpoint.claim_template is not None
    assert spec.checkpoint.mount_path == "/checkpoints"
    assert spec.checkpoint.claim_template.access_modes == ["ReadWriteMany"]
    assert spec.checkpoint.claim_template.retention_policy == "Delete"


@pytest.mark.parametrize(
    ("processes", "gpus", "workers", "per_node", "world"),
    [
        ("auto", 0, 0, 1, 1),
        ("auto", 8, 3, 8, 32),
        ("gpu", 4, 1, 4, 8),
        (3, 0, 2, 3, 9),
        (2, 8, 0, 2, 2),
    ],
)
def test_processes_per_node_and_world_size(
    processes: int | str, gpus: int, workers: int, per_node: int, world: int
) -> None:
    spec = parse_spec(
        {
            "processesPerNode": processes,
            "resources": {"gpus": gpus},
            **nested("worker.replicas", workers),
        }
    )
    assert spec.resolved_processes_per_node == per_node
    assert spec.nodes == workers + 1
    assert spec.world_size == world


def test_sharded_degree_minus_one_needs_divisible_world() -> None:
    fits = {"worker": {"replicas": 3}, "trainer": {"parallel": {"tensor": 2}}}
    assert parse_spec(fits).world_size == 4
    with pytest.raises(InvalidSpecError, match=r"spec\.trainer\.parallel"):
        parse_spec({"worker": {"replicas": 2}, "trainer": {"parallel": {"tensor": 2}}})


def test_command_mode_does_not_run_the_trainer() -> None:
    spec = parse_spec({"command": ["torchrun", "train.py"], "args": ["--lr", "3e-4"]})
    assert not spec.runs_trainer


def test_snake_case_names_work_in_python() -> None:
    spec = TrainingJobSpec(processes_per_node=4, suspend=True)
    assert to_manifest_spec(spec)["processesPerNode"] == 4


def to_manifest_spec(spec: TrainingJobSpec) -> dict[str, object]:
    return spec.model_dump(mode="json", by_alias=True, exclude_none=True)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_parse_and_round_trip(path: Path) -> None:
    raw = yaml.safe_load(path.read_text())
    parsed = parse_training_job(raw)
    assert parse_training_job(to_manifest(parsed)) == parsed


def test_the_five_named_examples_exist() -> None:
    named = {"3d-parallel", "byo-torchrun", "ddp-cpu", "fsdp-ib", "kueue-suspended"}
    assert named <= {p.stem for p in EXAMPLES}


def test_status_written_by_the_operator_parses_leniently() -> None:
    raw = job()
    raw["status"] = {
        "phase": "Running",
        "conditions": [
            {
                "type": "Running",
                "status": "True",
                "reason": "AllPodsRunning",
                "lastTransitionTime": "2026-11-20T23:00:00Z",
                "observedGeneration": 2,
            }
        ],
        "replicaStatuses": {"master": {"active": 1, "ready": 1}, "worker": {"failed": 1}},
        "nodesReady": "1/2",
        "progress": {"step": 50, "totalSteps": 200, "percent": 25, "loss": 2.5},
        "fieldFromANewerOperator": True,
    }
    status = parse_training_job(raw).status
    assert status is not None and status.conditions is not None
    assert status.conditions[0].last_transition_time == datetime(2026, 11, 20, 23, tzinfo=UTC)
    assert status.replica_statuses is not None
    assert status.replica_statuses.worker.failed == 1
    assert status.progress is not None and status.progress.percent == 25


def test_api_imports_without_kopf_kubernetes_or_torch() -> None:
    code = (
        "import sys, torchfleet_operator.api, torchfleet_operator.api.crdgen\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('kopf', 'kubernetes', 'torch'))\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_templates_take_the_whole_pod_spec() -> None:
    """What the API server's PodSpec schema accepts, the models accept too."""
    body = job(spec={"worker": {"template": {"spec": RICH_POD_SPEC}}})
    template = parse_training_job(body).spec.worker.template
    assert template is not None and template.spec == RICH_POD_SPEC


# A template schedulerName that agrees with spec.scheduling, or one that
# spec.scheduling leaves to the cluster, is accepted (the contradicting ones
# are rows of the INVALID table).
TEMPLATE_SCHEDULERS_ACCEPTED = [
    ({"podGroup": "Volcano"}, "volcano"),
    ({"podGroup": "Coscheduling", "schedulerName": "gang"}, "gang"),
    ({"podGroup": "Coscheduling"}, "scheduler-plugins-scheduler"),
    ({}, "my-scheduler"),
]


@pytest.mark.parametrize(("scheduling", "template_scheduler"), TEMPLATE_SCHEDULERS_ACCEPTED)
def test_a_template_scheduler_that_agrees_is_accepted(
    scheduling: dict[str, str], template_scheduler: str
) -> None:
    spec = {
        "scheduling": scheduling,
        "worker": {"replicas": 1, "template": {"spec": {"schedulerName": template_scheduler}}},
    }
    parse_training_job(job("tj-ok", spec))


@pytest.mark.parametrize(("id", "spec"), ELASTIC_ACCEPTED, ids=[id for id, _ in ELASTIC_ACCEPTED])
def test_an_elastic_spec_within_its_bounds_is_accepted(id: str, spec: Manifest) -> None:
    parsed = parse_training_job(job("tj-elastic", spec)).spec
    assert parsed.elastic is not None
    assert parsed.elastic.min_nodes <= parsed.nodes <= parsed.elastic.max_nodes


@pytest.mark.parametrize(("id", "spec"), KNOBS_ACCEPTED, ids=[i for i, _ in KNOBS_ACCEPTED])
def test_a_template_may_set_the_trainers_knobs(id: str, spec: Manifest) -> None:
    wanted = spec["worker"]["template"]["spec"]["containers"][0]["env"]
    parsed = parse_training_job(job("tj-knob", spec)).spec
    assert parsed.worker is not None and parsed.worker.template is not None
    (container,) = parsed.worker.template.spec["containers"]
    assert container["env"] == wanted


@pytest.mark.parametrize(("id", "spec"), DEEPSPEED_ACCEPTED, ids=[i for i, _ in DEEPSPEED_ACCEPTED])
def test_a_deepspeed_command_launching_its_own_node_is_accepted(id: str, spec: Manifest) -> None:
    assert parse_training_job(job("tj-deepspeed", spec)).spec.command == spec["command"]


def test_elastic_max_restarts_defaults_to_three() -> None:
    spec = parse_spec({"elastic": {"minNodes": 1, "maxNodes": 1}})
    assert spec.elastic is not None and spec.elastic.max_restarts == 3
