"""The pod contract: what the operator writes is what the trainer reads."""

from __future__ import annotations

import pytest

from torchfleet_contract import pod as contract
from torchfleet_contract.pod import ContractError, PodContract


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


# ---- elastic jobs: torchrun's own variables --------------------------------------------


def elastic(**overrides: object) -> contract.ElasticRendezvous:
    fields: dict[str, object] = dict(
        min_nodes=2,
        max_nodes=4,
        endpoint="llama-master-0.llama.ml.svc:29400",
        run_id="llama",
        max_restarts=3,
    )
    fields.update(overrides)
    return contract.ElasticRendezvous(**fields)  # type: ignore[arg-type]


def test_elastic_pod_env_is_what_a_plain_torchrun_reads() -> None:
    env = make(processes_per_node=1, elastic=elastic()).to_env()
    assert env["PET_NNODES"] == "2:4"
    assert env["PET_RDZV_BACKEND"] == "c10d"
    assert env["PET_RDZV_ENDPOINT"] == "llama-master-0.llama.ml.svc:29400"
    assert env["PET_RDZV_ID"] == "llama"  # the job's, not one gang generation's
    assert env["PET_MAX_RESTARTS"] == "3"
    # Ranks come from each rendezvous round, even with one process per pod.
    assert not {"RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "PET_NODE_RANK"} & set(env)


def test_elastic_contract_round_trips_through_env() -> None:
    # No node rank crosses (each round assigns them): read back, it is 0.
    original = make(node_rank=0, elastic=elastic(conf="last_call_timeout=2", local_addr="10.0.0.7"))
    assert PodContract.from_env(original.to_env()) == original
    assert make().elastic is None and PodContract.from_env(make().to_env()).elastic is None


def test_single_node_count_is_accepted_as_torchrun_does() -> None:
    env = make(elastic=elastic()).to_env() | {"PET_NNODES": "3"}
    parsed = PodContract.from_env(env).elastic
    assert parsed is not None and parsed.node_counts == range(3, 4)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"PET_NNODES": "2-4"}, "PET_NNODES must be n or min:max, got '2-4'"),
        ({"PET_NNODES": "4:2"}, "PET_NNODES must be min:max with 1 <= min <= max, got 4:2"),
        ({"PET_NNODES": "0:2"}, "PET_NNODES must be min:max"),
        ({"PET_RDZV_BACKEND": "etcd"}, "PET_RDZV_BACKEND must be 'c10d' .* got 'etcd'"),
        ({"PET_RDZV_BACKEND": "static"}, "PET_RDZV_BACKEND must be 'c10d' when PET_NNODES"),
        ({"PET_RDZV_ENDPOINT": "master"}, "PET_RDZV_ENDPOINT must be host:port, got 'master'"),
        ({"PET_RDZV_ENDPOINT": "master:99999"}, "PET_RDZV_ENDPOINT must be host:port"),
        ({"PET_RDZV_ID": ""}, "PET_RDZV_ID must be set"),
        ({"PET_MAX_RESTARTS": "many"}, "PET_MAX_RESTARTS must be an integer, got 'many'"),
        ({"PET_MAX_RESTARTS": "-1"}, "PET_MAX_RESTARTS must be >= 0"),
        ({"PET_RDZV_CONF": "last_call_timeout"}, "PET_RDZV_CONF must be key=value"),
    ],
)
def test_malformed_elastic_env_names_the_variable(changes: dict[str, str], message: str) -> None:
    env = make(processes_per_node=1, elastic=elastic()).to_env() | changes
    with pytest.raises(ContractError, match=message):
        PodContract.from_env(env)


def test_rendezvous_conf_is_read_as_torchrun_reads_it() -> None:
    assert contract.rendezvous_configs("") == {}
    assert contract.rendezvous_configs(" join_timeout=900, last_call_timeout = 2 ,") == {
        "join_timeout": "900",
        "last_call_timeout": "2",
    }


def test_launched_process_reads_its_local_world_size() -> None:
    env = make(elastic=elastic()).to_env() | {
        "RANK": "5",
        "WORLD_SIZE": "6",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
    }
    process = PodContract.from_env(env).process
    assert process == contract.ProcessRanks(rank=5, world_size=6, local_rank=1, local_world_size=2)
