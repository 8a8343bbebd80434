"""The recovery part of the pod contract: collective timeouts and kept logs."""

from __future__ import annotations

import pytest

from tests.unit.test_contract import make
from torchfleet_contract import pod as contract
from torchfleet_contract.pod import ContractError, RecoverySettings


def test_defaults_when_the_operator_sets_nothing() -> None:
    settings = RecoverySettings.from_env({})
    assert settings.collective_init_timeout == contract.DEFAULT_COLLECTIVE_INIT_TIMEOUT == 600
    assert settings.collective_train_timeout == contract.DEFAULT_COLLECTIVE_TRAIN_TIMEOUT == 120
    assert settings.log_keep_generations == contract.DEFAULT_LOG_KEEP_GENERATIONS == 5
    assert settings.log_max_bytes == contract.DEFAULT_LOG_MAX_BYTES


def test_values_are_read_from_their_variables() -> None:
    env = {
        contract.COLLECTIVE_INIT_TIMEOUT: "300",
        contract.COLLECTIVE_TRAIN_TIMEOUT: "2.5",
        contract.LOG_KEEP_GENERATIONS: "0",
        contract.LOG_MAX_BYTES: "4096",
    }
    assert RecoverySettings.from_env(env) == RecoverySettings(300.0, 2.5, 0, 4096)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (contract.COLLECTIVE_INIT_TIMEOUT, "0"),
        (contract.COLLECTIVE_TRAIN_TIMEOUT, "soon"),
        (contract.LOG_KEEP_GENERATIONS, "-1"),
        (contract.LOG_MAX_BYTES, "10"),
    ],
)
def test_a_bad_value_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(ContractError, match=name):
        RecoverySettings.from_env({name: value})


def test_an_in_place_budget_leaves_ranks_to_each_round() -> None:
    pod = make(
        master_addr="j-master-0.j",
        master_port=29501,
        nodes=3,
        node_rank=0,
        processes_per_node=1,
        in_place_restarts=2,
    )
    env = pod.to_env()
    assert env[contract.IN_PLACE_RESTARTS] == "2"
    assert contract.RANK not in env and contract.WORLD_SIZE not in env
    assert contract.PodContract.from_env(env) == pod
    rendezvous = contract.ElasticRendezvous.fixed_gang(pod)
    assert (rendezvous.min_nodes, rendezvous.max_nodes) == (3, 3)
    assert rendezvous.endpoint == "j-master-0.j:29501"
    assert rendezvous.run_id == pod.rendezvous_id  # one rendezvous per gang generation
    assert rendezvous.max_restarts == 2
    assert contract.rendezvous_configs(rendezvous.conf) == {contract.RDZV_IS_HOST: "1"}
    worker = contract.ElasticRendezvous.fixed_gang(
        contract.PodContract.from_env(env | {contract.NODE_RANK: "2"})
    )
    assert contract.rendezvous_configs(worker.conf) == {contract.RDZV_IS_HOST: "0"}


def test_no_budget_is_the_default_and_a_negative_one_is_refused() -> None:
    assert contract.PodContract.from_env({}).in_place_restarts == 0
    assert contract.IN_PLACE_RESTARTS not in contract.PodContract.from_env({}).to_env()
    with pytest.raises(ContractError, match=contract.IN_PLACE_RESTARTS):
        contract.PodContract.from_env({contract.IN_PLACE_RESTARTS: "-1"})


@pytest.mark.parametrize(
    ("env", "code", "retried"),
    [
        ({}, 1, True),  # unset: OnFailure, torchrun's own behaviour
        ({contract.RESTART_POLICY: "ExitCode"}, 3, False),
        ({contract.RESTART_POLICY: "ExitCode"}, 137, True),
        ({contract.RESTART_POLICY: "ExitCode", contract.RETRYABLE_EXIT_CODES: "3, 4"}, 3, True),
        ({contract.PERMANENT_EXIT_CODES: "202"}, 202, False),
        ({contract.RESTART_POLICY: "Never"}, 137, False),
    ],
)
def test_the_exit_code_policy_is_the_run_policys(
    env: dict[str, str], code: int, retried: bool
) -> None:
    assert contract.ExitCodePolicy.from_env(env).retries(code) is retried


@pytest.mark.parametrize(
    ("name", "value"),
    [(contract.RESTART_POLICY, "Always"), (contract.RETRYABLE_EXIT_CODES, "1;2")],
)
def test_a_bad_exit_code_policy_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(ContractError, match=name):
        contract.ExitCodePolicy.from_env({name: value})
