"""The recovery part of the pod contract: collective timeouts and kept logs."""

from __future__ import annotations

import pytest

from torchfleet_trainer import contract
from torchfleet_trainer.contract import ContractError, RecoverySettings


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
