"""runtimes: the ClusterTrainingRuntimes the chart ships, off by default; on,
four a platform team can start from, each valid against the runtime model
the CRD is generated from (the cluster tier applies them to a real API server
and runs a job on one: tests/cluster/test_helm_runtimes.py)."""

from __future__ import annotations

import pytest

from tests.fixtures.helm import Helm, find_objects
from torchfleet_operator.api.runtime import ClusterTrainingRuntime

NAMES = ["cpu-gloo", "gpu-nccl", "gpu-nccl-ib", "deepspeed"]


def test_no_runtime_by_default(helm: Helm) -> None:
    assert find_objects(helm.template(), "ClusterTrainingRuntime") == []


def test_four_valid_runtimes_when_installed(helm: Helm) -> None:
    objects = helm.template(set_values={"runtimes.install": True, "runtimes.namePrefix": "ml-"})
    runtimes = {r["metadata"]["name"]: r for r in find_objects(objects, "ClusterTrainingRuntime")}
    assert sorted(runtimes) == sorted(f"ml-{name}" for name in NAMES)
    for body in runtimes.values():
        ClusterTrainingRuntime.model_validate(body)  # raises naming a bad field
        assert body["metadata"]["labels"]["app.kubernetes.io/component"] == "runtime"
        assert body["metadata"]["annotations"]["torchfleet.dev/description"]
    specs = {name.removeprefix("ml-"): body["spec"] for name, body in runtimes.items()}
    assert specs["cpu-gloo"]["processesPerNode"] == 1 and "resources" not in specs["cpu-gloo"]
    for gpu in ("gpu-nccl", "gpu-nccl-ib", "deepspeed"):
        assert specs[gpu]["processesPerNode"] == "gpu"
        assert specs[gpu]["resources"] == {"gpus": 8, "shmSize": "64Gi"}
    assert specs["gpu-nccl"]["network"] == {"transport": "tcp"}
    assert specs["gpu-nccl-ib"]["network"] == {
        "transport": "infiniband",
        "rdmaResources": {"rdma/ib": 1},
    }
    assert specs["gpu-nccl"]["image"] == "ghcr.io/torchfleet/trainer:0.1.0"
    assert specs["deepspeed"]["image"] == "ghcr.io/torchfleet/trainer-deepspeed:0.1.0"


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"operator.defaults.trainerImage": "reg.example/t:1"}, "reg.example/t:1"),
        ({"runtimes.image": "reg.example/own:2"}, "reg.example/own:2"),
    ],
)
def test_the_torchrun_runtimes_take_the_trainer_image_unless_given_one(
    helm: Helm, values: dict[str, str], expected: str
) -> None:
    objects = helm.template(set_values={"runtimes.install": True, **values})
    images = {
        r["metadata"]["name"]: r["spec"]["image"]
        for r in find_objects(objects, "ClusterTrainingRuntime")
    }
    assert images == {
        "cpu-gloo": expected,
        "gpu-nccl": expected,
        "gpu-nccl-ib": expected,
        "deepspeed": "ghcr.io/torchfleet/trainer-deepspeed:0.1.0",
    }


def test_infiniband_queue_and_sizes_come_from_the_values(helm: Helm) -> None:
    objects = helm.template(
        set_values={
            "runtimes.install": True,
            "runtimes.gpusPerNode": 4,
            "runtimes.queueName": "team",
            "runtimes.infiniband": {
                "ibHCAs": ["mlx5_0"],
                "rdmaResource": "rdma/hca",
                "rdmaPerNode": 2,
            },
        }
    )
    runtimes = {
        r["metadata"]["name"]: r["spec"] for r in find_objects(objects, "ClusterTrainingRuntime")
    }
    assert runtimes["gpu-nccl-ib"]["network"] == {
        "transport": "infiniband",
        "ibHCAs": ["mlx5_0"],
        "rdmaResources": {"rdma/hca": 2},
    }
    assert all(spec["scheduling"] == {"queueName": "team"} for spec in runtimes.values())
    assert runtimes["deepspeed"]["resources"]["gpus"] == 4


def test_a_bad_value_is_refused_naming_its_key(helm: Helm) -> None:
    out = helm.run(*helm.template_args(set_values={"runtimes.gpusPerNode": 0}), check=False)
    assert out.returncode != 0 and "/runtimes/gpusPerNode" in out.stderr, out.stderr
