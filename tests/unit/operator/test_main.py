"""torchfleet-operator's command line: defaults from OperatorConfig, what the
flags override, and what kopf is started with."""

from __future__ import annotations

import pytest

from torchfleet_operator.config import DEFAULT_TRAINER_IMAGE, OperatorConfig
from torchfleet_operator.main import effective_config, kopf_options, parse_args


def test_every_default_is_the_configs():
    config = OperatorConfig(trainer_image="reg/trainer:1", health_port=9091, metrics_port=0)
    args = parse_args([], config)
    assert (args.trainer_image, args.health_port, args.metrics_port) == ("reg/trainer:1", 9091, 0)
    assert args.node_loss_force_delete_seconds == config.node_loss_force_delete_seconds
    assert parse_args([], OperatorConfig()).trainer_image == DEFAULT_TRAINER_IMAGE


def test_the_environment_is_read_by_the_config(monkeypatch):
    monkeypatch.setenv("TORCHFLEET_OPERATOR_TRAINER_IMAGE", "reg/trainer:2")
    monkeypatch.setenv("TORCHFLEET_OPERATOR_LEADER_ELECT", "true")
    args = parse_args([])
    assert args.trainer_image == "reg/trainer:2" and args.leader_elect is True


def test_a_bad_setting_is_named_and_exits_2(monkeypatch, capsys):
    monkeypatch.setenv("TORCHFLEET_OPERATOR_HEALTH_PORT", "eighty")
    with pytest.raises(SystemExit) as exited:
        parse_args([])
    assert exited.value.code == 2
    assert "TORCHFLEET_OPERATOR_HEALTH_PORT must be an integer" in capsys.readouterr().err


def test_flags_override_the_config():
    config = OperatorConfig()
    args = parse_args(
        ["--node-loss-force-delete-seconds", "5", "--default-shm-size", "16Gi"], config
    )
    effective = effective_config(config, args)
    assert effective.node_loss_force_delete_seconds == 5
    assert effective.default_shm_size == "16Gi"


@pytest.mark.parametrize(
    ("argv", "standalone", "peering", "clusterwide"),
    [
        ([], True, None, True),
        (["--peering", "torchfleet-ha"], False, "torchfleet-ha", True),
        (["-n", "team-a"], True, None, False),
    ],
)
def test_kopf_runs_standalone_unless_a_peering_object_is_named(
    argv, standalone, peering, clusterwide
):
    options = kopf_options(parse_args(argv, OperatorConfig()))
    assert options["standalone"] is standalone
    assert options["peering_name"] == peering
    assert options["clusterwide"] is clusterwide
    assert options["liveness_endpoint"] == "http://0.0.0.0:8080/healthz"
