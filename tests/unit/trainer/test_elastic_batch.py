"""An elastic job's batch: the global batch stays fixed as the world changes.

The per-rank micro batch is fixed (training.microBatchSize, else what
gradAccumSteps gives at maxNodes) and gradient accumulation absorbs the
data-parallel degree. A layout that cannot keep the global batch exact at
every node count from minNodes to maxNodes is refused at launch, before any
process group or device, with the field named. The agent's launch config is
torchrun's, read from the contract's PET_* variables.
"""

from __future__ import annotations

import os

import pytest

from torchfleet_contract import pod as contract
from torchfleet_contract.trainer_config import ConfigError, TrainConfig, load_config, pod_contract
from torchfleet_trainer.launcher.launch import ELASTIC_RDZV_DEFAULTS, elastic_launch_config, launch
from torchfleet_trainer.launcher.outcomes import EXIT_CONFIG


def config(*overrides: str) -> TrainConfig:
    return load_config(None, ["model.layers=4", "model.heads=4", "model.dim=64", *overrides])


def accum_by_nodes(cfg: TrainConfig, nodes: range, processes: int = 1) -> dict[int, int]:
    largest = nodes[-1] * processes
    return {
        n: cfg.grad_accum_steps(cfg.check_world(n * processes, largest), largest) for n in nodes
    }


def test_a_fixed_gang_accumulates_as_configured() -> None:
    cfg = config("training.globalBatchSize=64", "training.gradAccumSteps=2")
    assert cfg.grad_accum_steps(cfg.check_world(4)) == 2
    assert cfg.micro_batch_size(cfg.check_world(4)) == 8


def test_micro_batch_size_derives_accumulation_from_the_world() -> None:
    cfg = config("training.globalBatchSize=12", "training.microBatchSize=1")
    assert {w: cfg.grad_accum_steps(cfg.check_world(w)) for w in (2, 3, 4, 6)} == {
        2: 6,
        3: 4,
        4: 3,
        6: 2,
    }


def test_elastic_micro_batch_is_the_one_of_the_largest_world() -> None:
    # 48 / (4 ranks x 3 micro-steps) = 4 sequences per rank per micro-step, at every size.
    cfg = config("training.globalBatchSize=48", "training.gradAccumSteps=3")
    cfg.check_elastic(range(2, 5), processes_per_node=1)
    assert accum_by_nodes(cfg, range(2, 5)) == {2: 6, 3: 4, 4: 3}


def test_elastic_degree_is_data_parallel_under_tensor_parallelism() -> None:
    cfg = config("training.globalBatchSize=24", "training.microBatchSize=2", "parallel.tensor=2")
    cfg.check_elastic(range(2, 5), processes_per_node=2)  # dp 2, 3, 4
    assert accum_by_nodes(cfg, range(2, 5), processes=2) == {2: 6, 3: 4, 4: 3}


@pytest.mark.parametrize(
    ("overrides", "nodes", "processes", "message"),
    [
        (
            # Micro batch 16 (at 4 ranks): 3 ranks x 16 does not divide 64.
            ["training.globalBatchSize=64"],
            range(2, 5),
            1,
            r"training.globalBatchSize: 64 is not divisible by data-parallel degree 3 x micro "
            r"batch 16 .* fails at 3 nodes x 1 processes; globalBatchSize must be a multiple "
            r"of 12",
        ),
        (
            ["training.globalBatchSize=48"],
            range(2, 5),
            1,
            r"degree 3 x micro batch 12 .* a training.microBatchSize that divides 4 keeps it exact",
        ),
        (
            ["training.globalBatchSize=48", "training.microBatchSize=3"],
            range(2, 5),
            1,
            r"training.globalBatchSize: 48 is not divisible by data-parallel degree 3 x micro "
            r"batch 3",
        ),
        (
            ["training.globalBatchSize=60", "training.gradAccumSteps=4"],
            range(2, 5),
            1,
            r"training.globalBatchSize: 60 is not divisible by data-parallel degree 4 at "
            r"maxNodes x gradAccumSteps 4",
        ),
        (
            ["training.globalBatchSize=24", "parallel.tensor=2"],
            range(2, 4),
            1,
            r"parallel: world size 3 is not divisible by dataParallelReplicate\*tensor\*pipeline "
            r"= 2 .* fails at 3 nodes",
        ),
        (
            ["training.globalBatchSize=24", "parallel.dataParallelShard=2"],
            range(2, 4),
            1,
            r"parallel.dataParallelShard: 2 is fixed",
        ),
        (
            [
                "training.globalBatchSize=24",
                "training.microBatchSize=2",
                "parallel.pipeline=2",
                "parallel.pipelineMicrobatches=4",
            ],
            range(1, 3),
            2,
            r"parallel.pipelineMicrobatches: 4 does not divide the per-rank micro-batch of 2",
        ),
    ],
)
def test_a_layout_that_cannot_follow_the_world_is_refused(
    overrides: list[str], nodes: range, processes: int, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        config(*overrides).check_elastic(nodes, processes)


def test_micro_batch_size_and_accumulation_exclude_each_other() -> None:
    with pytest.raises(ConfigError, match=r"training\.microBatchSize: set either"):
        config("training.microBatchSize=2", "training.gradAccumSteps=2")


def elastic_env(**changes: str) -> dict[str, str]:
    rendezvous = contract.ElasticRendezvous(
        min_nodes=2, max_nodes=4, endpoint="127.0.0.1:1", run_id="unit", max_restarts=1
    )
    return rendezvous.to_env() | {contract.NPROC_PER_NODE: "1"} | changes


def test_launch_refuses_before_starting_anything(capsys: pytest.CaptureFixture[str]) -> None:
    # Port 1: an agent that started would fail to reach the rendezvous, not exit 2.
    cfg = config("training.globalBatchSize=64")
    assert launch(cfg, env=elastic_env()) == EXIT_CONFIG
    assert "training.globalBatchSize: 64 is not divisible" in capsys.readouterr().err


def test_bad_elastic_env_is_a_config_error_naming_the_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(ConfigError, match="PET_NNODES must be n or min:max, got 'two:four'"):
        pod_contract(elastic_env(PET_NNODES="two:four"))
    assert launch(config(), env=elastic_env(PET_MAX_RESTARTS="x")) == EXIT_CONFIG
    assert "PET_MAX_RESTARTS must be an integer" in capsys.readouterr().err


def test_elastic_launch_is_torchruns_from_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "0")  # a user's value wins
    pod = pod_contract(elastic_env(PET_RDZV_CONF="last_call_timeout=1,is_host=0"))
    launched = elastic_launch_config(pod, processes=2)
    assert (launched.min_nodes, launched.max_nodes, launched.nproc_per_node) == (2, 4, 2)
    assert (launched.rdzv_backend, launched.rdzv_endpoint) == ("c10d", "127.0.0.1:1")
    assert (launched.run_id, launched.max_restarts) == ("unit", 1)
    # PET_RDZV_CONF over the launcher's defaults, key by key.
    configs = launched.rdzv_configs
    assert (configs["last_call_timeout"], configs["is_host"]) == ("1", "0")
    assert configs["keep_alive_interval"] == ELASTIC_RDZV_DEFAULTS["keep_alive_interval"]
    assert os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "0"
