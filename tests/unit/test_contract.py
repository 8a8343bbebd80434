"""The pod contract: what the operator writes is what the trainer reads."""

from __future__ import annotations

import pytest

from torchfleet_trainer import contract
from torchfleet_trainer.contract import ContractError, PodContract


def make(**overrides: object) -> PodContract:
    fields: dict[str, object] = dict(
        job_name="llama",
        namespace="ml",
        master_addr="llama-master-0.llama.ml.svc",
        master_port=29500,
        nodes=4,
        node_rank=2,
        processes_per_node=8,
        restart_count=1,
        checkpoint_dir="/ckpt",
        metrics_port=9400,
    )
    fields.update(overrides)
    return PodContract(**fields)  # type: ignore[arg-type]


def test_round_trip_through_env() -> None:
    original = make()
    assert PodContract.from_env(original.to_env()) == original


def test_torchrun_reads_its_own_variables() -> None:
    env = make().to_env()
    assert env["PET_NNODES"] == "4"
    assert env["PET_NPROC_PER_NODE"] == "8"
    assert env["PET_NODE_RANK"] == "2"
    assert env["PET_MASTER_ADDR"] == env["MASTER_ADDR"] == "llama-master-0.llama.ml.svc"
    assert env["PET_MASTER_PORT"] == env["MASTER_PORT"] == "29500"


@pytest.mark.parametrize("var", [contract.RANK, contract.WORLD_SIZE, contract.LOCAL_RANK])
def test_per_process_values_absent_when_a_launcher_runs_several(var: str) -> None:
    # torchrun sets them per process; a pod-level value would mean the wrong thing.
    assert var not in make(processes_per_node=8).to_env()


def test_one_process_per_pod_gets_per_process_values() -> None:
    env = make(processes_per_node=1, nodes=3, node_rank=2).to_env()
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("2", "3", "0")


def test_world_size_is_nodes_times_processes() -> None:
    assert make(nodes=4, processes_per_node=8).world_size == 32


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"nodes": 0}, "NNODES"),
        ({"node_rank": 4}, "NODE_RANK"),
        ({"processes_per_node": 0}, "TORCHFLEET_NPROC_PER_NODE"),
        ({"master_port": 70000}, "MASTER_PORT"),
    ],
)
def test_invalid_contract_names_the_variable(overrides: dict[str, object], named: str) -> None:
    with pytest.raises(ContractError, match=named):
        make(**overrides)


def test_malformed_env_names_the_variable() -> None:
    env = make().to_env() | {"NNODES": "four"}
    with pytest.raises(ContractError, match="NNODES must be an integer, got 'four'"):
        PodContract.from_env(env)


def test_checkpoint_dir_omitted_when_unset() -> None:
    assert contract.CHECKPOINT_DIR not in make(checkpoint_dir=None).to_env()


def test_per_process_ranks_read_back_only_when_a_launcher_set_them() -> None:
    launcher = PodContract.from_env(make(processes_per_node=8).to_env())
    assert launcher.process is None and launcher.local_rank == 0
    env = make(processes_per_node=8).to_env() | {"RANK": "9", "WORLD_SIZE": "32", "LOCAL_RANK": "1"}
    worker = PodContract.from_env(env)
    assert worker.process == contract.ProcessRanks(rank=9, world_size=32, local_rank=1)
    assert worker.local_rank == 1
    with pytest.raises(ContractError, match="RANK must be in"):
        PodContract.from_env(env | {"RANK": "32"})


def test_checkpoint_cadence_and_trainer_config_round_trip() -> None:
    original = make(checkpoint_interval=20, checkpoint_keep=2, train_config='{"a":1}')
    assert PodContract.from_env(original.to_env()) == original
    with pytest.raises(ContractError, match="TORCHFLEET_CHECKPOINT_KEEP must be >= 1"):
        make(checkpoint_keep=0)
