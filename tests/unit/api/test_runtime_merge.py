"""The precedence of a job's spec over its runtime's (api/runtime_merge.py), as
a table, and the side an error names (api/runtime_merge.source)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from torchfleet_operator.api.parse import (
    InvalidSpecError,
    parse_spec,
    parse_training_job,
    to_manifest,
)
from torchfleet_operator.api.runtime import ClusterTrainingRuntime, TrainingRuntimeSpec
from torchfleet_operator.api.runtime_merge import (
    JOB,
    merge_spec,
    schema_default,
    source,
    spec_hash,
)

RT = "ClusterTrainingRuntime gpu"


def _pod(*containers: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"template": {"spec": {"containers": list(containers), **fields}}}


@pytest.mark.parametrize(
    ("job", "runtime", "merged"),
    [
        # Absent in the job: the runtime's.
        ({}, {"image": "rt:1"}, {"image": "rt:1"}),
        # Set in both: the job's.
        ({"image": "job:1"}, {"image": "rt:1"}, {"image": "job:1"}),
        # Objects merge key by key down to their leaves.
        (
            {"resources": {"gpus": 2}},
            {"resources": {"cpu": 8, "memory": "64Gi", "gpus": 8}},
            {"resources": {"cpu": 8, "memory": "64Gi", "gpus": 2}},
        ),
        # A leaf holding its schema default (written by the API server) yields.
        (
            {"runPolicy": {"backoffLimit": 3, "cleanPodPolicy": "All"}},
            {"runPolicy": {"backoffLimit": 10, "cleanPodPolicy": "None"}},
            {"runPolicy": {"backoffLimit": 10, "cleanPodPolicy": "All"}},
        ),
        ({"processesPerNode": "auto"}, {"processesPerNode": 4}, {"processesPerNode": 4}),
        ({"processesPerNode": 2}, {"processesPerNode": 4}, {"processesPerNode": 2}),
        # A job's list replaces the runtime's; its default does not.
        (
            {"network": {"ibHCAs": ["mlx5_1"]}},
            {"network": {"ibHCAs": ["mlx5_0", "mlx5_2"], "transport": "infiniband"}},
            {"network": {"ibHCAs": ["mlx5_1"], "transport": "infiniband"}},
        ),
        # Maps (ncclEnv, nodeSelector, labels) merge key by key.
        (
            {"network": {"ncclEnv": {"NCCL_DEBUG": "INFO"}}},
            {"network": {"ncclEnv": {"NCCL_DEBUG": "WARN", "NCCL_ALGO": "Ring"}}},
            {"network": {"ncclEnv": {"NCCL_DEBUG": "INFO", "NCCL_ALGO": "Ring"}}},
        ),
        # Containers by name; env by variable name; mounts by mountPath.
        (
            {
                "worker": {
                    "replicas": 3,
                    **_pod(
                        {
                            "name": "trainer",
                            "env": [{"name": "B", "value": "job"}, {"name": "C", "value": "job"}],
                            "volumeMounts": [{"name": "data2", "mountPath": "/data"}],
                        }
                    ),
                }
            },
            {
                "worker": _pod(
                    {
                        "name": "trainer",
                        "image": "rt:1",
                        "env": [{"name": "A", "value": "rt"}, {"name": "B", "value": "rt"}],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    },
                    {"name": "sidecar", "image": "side:1"},
                )
            },
            {
                "worker": {
                    **_pod(
                        {
                            "name": "trainer",
                            "image": "rt:1",
                            "env": [
                                {"name": "A", "value": "rt"},
                                {"name": "B", "value": "job"},
                                {"name": "C", "value": "job"},
                            ],
                            "volumeMounts": [{"name": "data2", "mountPath": "/data"}],
                        },
                        {"name": "sidecar", "image": "side:1"},
                    ),
                    "replicas": 3,
                }
            },
        ),
        # Volumes by name (the job's replaces the runtime's whole); other lists are the job's.
        (
            {
                "master": {
                    "template": {
                        "spec": {
                            "volumes": [{"name": "data", "emptyDir": {}}],
                            "tolerations": [{"key": "b", "operator": "Exists"}],
                            "nodeSelector": {"pool": "a100"},
                        }
                    }
                }
            },
            {
                "master": {
                    "template": {
                        "spec": {
                            "volumes": [
                                {"name": "data", "persistentVolumeClaim": {"claimName": "d"}},
                                {"name": "cache", "emptyDir": {}},
                            ],
                            "tolerations": [{"key": "a", "operator": "Exists"}],
                            "nodeSelector": {"pool": "h100", "zone": "z1"},
                        }
                    }
                }
            },
            {
                "master": {
                    "template": {
                        "spec": {
                            "volumes": [
                                {"name": "data", "emptyDir": {}},
                                {"name": "cache", "emptyDir": {}},
                            ],
                            "tolerations": [{"key": "b", "operator": "Exists"}],
                            "nodeSelector": {"pool": "a100", "zone": "z1"},
                        }
                    }
                }
            },
        ),
        # Trainer config: key by key, the job's leaves winning.
        (
            {"trainer": {"training": {"steps": 10}}},
            {"trainer": {"training": {"steps": 1000, "globalBatchSize": 64}}},
            {"trainer": {"training": {"steps": 10, "globalBatchSize": 64}}},
        ),
        # A command of the job's own: the runtime's trainer defaults are moot.
        (
            {"command": ["torchrun", "train.py"]},
            {"trainer": {"training": {"steps": 5}}, "image": "rt:1"},
            {"image": "rt:1", "command": ["torchrun", "train.py"]},
        ),
        # The job's claim replaces the runtime's claim (one of the two); the rest merges.
        (
            {"checkpoint": {"claimName": "mine", "mountPath": "/checkpoints"}},
            {"checkpoint": {"claimTemplate": {"size": "1Ti"}, "mountPath": "/ckpt"}},
            {"checkpoint": {"mountPath": "/ckpt", "claimName": "mine"}},
        ),
        # Scheduling: the queue from the runtime, the job's priority.
        (
            {"scheduling": {"podGroup": "None", "priorityClassName": "high"}},
            {"scheduling": {"podGroup": "Coscheduling", "queueName": "team-q"}},
            {
                "scheduling": {
                    "podGroup": "Coscheduling",
                    "queueName": "team-q",
                    "priorityClassName": "high",
                }
            },
        ),
    ],
)
def test_the_job_wins_field_by_field(
    job: dict[str, Any], runtime: dict[str, Any], merged: dict[str, Any]
) -> None:
    assert merge_spec(job, runtime) == merged


def test_the_merge_copies_and_leaves_both_sides_alone() -> None:
    job = {"worker": _pod({"name": "trainer", "env": [{"name": "A", "value": "1"}]})}
    runtime = {"worker": _pod({"name": "trainer", "env": [{"name": "B", "value": "2"}]})}
    before = (repr(job), repr(runtime))
    merged = merge_spec(job, runtime)
    merged["worker"]["template"]["spec"]["containers"][0]["env"].append({"name": "X"})
    assert (repr(job), repr(runtime)) == before


def test_schema_defaults_are_the_crds() -> None:
    assert schema_default(("runPolicy", "backoffLimit")) == 3
    assert schema_default(("network", "transport")) == "auto"
    # image has no default: the same answer as for a field that does not exist.
    assert schema_default(("image",)) is schema_default(("no", "such", "field"))


def test_the_hash_follows_the_spec_not_its_key_order() -> None:
    assert spec_hash({"a": 1, "b": {"c": 2}}) == spec_hash({"b": {"c": 2}, "a": 1})
    assert spec_hash({"a": 1}) != spec_hash({"a": 2})
    assert len(spec_hash({})) == 16


def _problems(job: dict[str, Any], runtime: dict[str, Any]) -> list[str]:
    merged = merge_spec(job, runtime)
    with pytest.raises(InvalidSpecError) as refused:
        parse_spec(merged)
    return [f"{path} ({source(path, job, runtime, RT)})" for path, _ in refused.value.problems]


@pytest.mark.parametrize(
    ("job", "runtime", "named"),
    [
        # The job's ibHCAs under the runtime's tcp transport: the rule blames ibHCAs, the job's.
        (
            {"network": {"transport": "auto", "ibHCAs": ["mlx5_0"]}},
            {"network": {"transport": "tcp"}},
            [f"spec.network.ibHCAs ({JOB})"],
        ),
        # The runtime's ibHCAs under the job's tcp: the runtime's.
        (
            {"network": {"transport": "tcp"}},
            {"network": {"transport": "infiniband", "ibHCAs": ["mlx5_0"]}},
            [f"spec.network.ibHCAs ({RT})"],
        ),
        # processesPerNode 'gpu' from the runtime, no GPUs anywhere.
        (
            {"processesPerNode": "auto"},
            {"processesPerNode": "gpu"},
            [f"spec.processesPerNode ({RT})"],
        ),
        # A field inside a merged container: found by the container's name.
        (
            {"worker": _pod({"name": "trainer", "env": [{"name": "A", "value": "1"}]})},
            {"worker": _pod({"name": "side", "image": 5}, {"name": "trainer"})},
            [f"spec.worker.template.spec.containers[0].image ({RT})"],
        ),
    ],
)
def test_an_invalid_merge_names_the_field_and_its_side(
    job: dict[str, Any], runtime: dict[str, Any], named: list[str]
) -> None:
    assert _problems(job, runtime) == named


def test_a_runtime_validates_with_the_jobs_models() -> None:
    spec = TrainingRuntimeSpec.model_validate(
        {"image": "rt:1", "network": {"transport": "tcp"}, "processesPerNode": 2}
    )
    assert spec.network is not None and spec.network.transport == "tcp"
    with pytest.raises(ValueError, match="needs an RDMA transport"):
        TrainingRuntimeSpec.model_validate({"network": {"transport": "tcp", "ibHCAs": ["x"]}})
    with pytest.raises(ValueError, match="replicas"):  # a runtime holds no size
        TrainingRuntimeSpec.model_validate({"worker": {"replicas": 2}})
    with pytest.raises(ValueError, match="command"):  # nor an entrypoint
        ClusterTrainingRuntime.model_validate({"spec": {"command": ["x"]}})


EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def test_the_example_job_on_its_runtime_is_the_full_manifest_it_replaces() -> None:
    """examples/runtimes/: a runtime and a short job naming it; merged (the job
    as the API server stores it, every default written) they are
    examples/byo-torchrun.yaml's spec."""
    runtime = ClusterTrainingRuntime.model_validate(
        yaml.safe_load((EXAMPLES / "runtimes" / "cluster-runtime.yaml").read_text())
    )
    short = parse_training_job(yaml.safe_load((EXAMPLES / "runtimes" / "job.yaml").read_text()))
    assert short.spec.runtime_ref is not None
    assert short.spec.runtime_ref.name == runtime.metadata.name
    stored = to_manifest(short)["spec"]  # every default written, as the API server does
    runtime_spec = runtime.model_dump(mode="json", by_alias=True, exclude_unset=True)["spec"]
    merged = parse_spec(merge_spec(stored, runtime_spec))

    full = parse_training_job(yaml.safe_load((EXAMPLES / "byo-torchrun.yaml").read_text()))
    assert merged.model_copy(update={"runtime_ref": None}) == full.spec
    # The short job really is short: it leaves the runtime's parts out.
    assert short.spec.image is None and short.spec.checkpoint is None
