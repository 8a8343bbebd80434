"""TrainConfig: schema-friendly, torch-free, and errors that name the field."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from torchfleet_contract import pod as contract
from torchfleet_contract.trainer_config import ConfigError, TrainConfig, load_config
from torchfleet_trainer.main import main


def test_empty_config_is_valid_and_round_trips_through_aliases() -> None:
    config = TrainConfig.model_validate({})
    dumped = json.loads(config.model_dump_json(by_alias=True))
    assert "globalBatchSize" in dumped["training"]
    assert TrainConfig.model_validate(dumped) == config


def test_schema_describes_every_field_and_forbids_extras() -> None:
    schema = TrainConfig.model_json_schema(by_alias=True)
    for name, definition in schema["$defs"].items():
        assert definition.get("additionalProperties") is False, name
        for field, prop in definition["properties"].items():
            assert prop.get("description"), f"{name}.{field} has no description"
    assert schema["$defs"]["ParallelConfig"]["properties"]["pipelineSchedule"]["enum"] == [
        "gpipe",
        "1f1b",
        "interleaved_1f1b",
    ]


def test_config_module_imports_without_torch() -> None:
    code = (
        "import sys, torchfleet_contract.trainer_config, torchfleet_trainer.main;"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.dim=100"], "model.dim: 100 is not divisible by heads=6"),
        (["model.heads=4", "model.kvHeads=3", "model.dim=64"], "model.kvHeads: 3 must divide"),
        (["parallel.tensor=4"], "parallel.tensor: 4 does not divide model.heads"),
        (["parallel.pipeline=7"], "parallel.pipeline: 7 pipeline stages exceed model.layers=6"),
        (["data.seqLen=512"], "data.seqLen: 512 exceeds model.maxSeqLen=256"),
        (["data.kind=char"], "data.path: required when data.kind is 'char'"),
        (["optimizer.lr=0"], "optimizer.lr: Input should be greater than 0"),
        (["training.bogus=1"], "training.bogus: Extra inputs are not permitted"),
        (["training.globalBatchSize=10", "training.gradAccumSteps=3"], "training.globalBatchSize"),
        (["parallel.pipelineSchedule=zigzag"], "parallel.pipelineSchedule: Input should be"),
        (
            ["data.kind=char", "data.path=in.txt", "data.valFraction=0"],
            "data.valFraction: 0 leaves no validation split for evaluation",
        ),
        (
            ["data.kind=tokens", "data.path=all.bin", "data.valFraction=0"],
            "data.valFraction: 0 leaves no validation split",
        ),
        (["training.maxNonFiniteSteps=0"], "training.maxNonFiniteSteps: Input should be"),
        (
            ["model.tieEmbeddings=true", "parallel.tensor=2"],
            "model.tieEmbeddings: cannot be used with parallel.tensor=2",
        ),
        (
            ["model.tieEmbeddings=true", "parallel.pipeline=2"],
            "model.tieEmbeddings: cannot be used with parallel.tensor=1 or parallel.pipeline=2",
        ),
    ],
)
def test_bad_config_names_the_field(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(overrides=overrides, env={})


@pytest.mark.parametrize(
    "overrides",
    [
        # No evaluation, nothing to hold out.
        ["data.kind=char", "data.path=in.txt", "data.valFraction=0", "training.evalInterval=0"],
        # A directory brings its own val.bin; synthetic data always holds some out.
        ["data.kind=tokens", "data.path=/data/corpus", "data.valFraction=0"],
        ["data.valFraction=0"],
    ],
)
def test_val_fraction_zero_is_fine_where_validation_has_data(overrides: list[str]) -> None:
    assert load_config(overrides=overrides, env={}).data.val_fraction == 0


def test_degrees_must_multiply_to_world_size() -> None:
    config = load_config(overrides=["parallel.tensor=2", "parallel.pipeline=2"], env={})
    assert config.check_world(8).dp_shard == 2
    with pytest.raises(ConfigError, match=r"parallel: world size 6 is not divisible"):
        config.check_world(6)
    explicit = load_config(overrides=["parallel.dataParallelShard=3"], env={})
    with pytest.raises(ConfigError, match=r"degrees multiply to 3 .* world size is 4"):
        explicit.check_world(4)


def test_batch_must_split_over_data_parallel_ranks_and_microbatches() -> None:
    config = load_config(overrides=["training.globalBatchSize=12", "parallel.pipeline=2"], env={})
    with pytest.raises(
        ConfigError, match=re.escape("training.globalBatchSize: 12 is not divisible")
    ):
        config.check_world(16)
    with pytest.raises(
        ConfigError, match=re.escape("parallel.pipelineMicrobatches: 2 does not divide")
    ):
        load_config(
            overrides=["training.globalBatchSize=6", "parallel.pipeline=2"], env={}
        ).check_world(4)


def test_sources_file_then_env_then_overrides(tmp_path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("training:\n  steps: 7\nmodel:\n  max_seq_len: 512\n")
    env = {contract.TRAIN_CONFIG: json.dumps({"training": {"steps": 9}})}
    assert load_config(path, env=env).training.steps == 7
    assert load_config(path, env=env).model.max_seq_len == 512  # snake_case keys accepted
    assert load_config(env=env).training.steps == 9
    assert load_config(env=env, overrides=["training.steps=11"]).training.steps == 11
    with pytest.raises(ConfigError, match=contract.TRAIN_CONFIG):
        load_config(env={contract.TRAIN_CONFIG: "{not json"})
    with pytest.raises(ConfigError, match=re.escape("--config: cannot read")):
        load_config(tmp_path / "missing.yaml", env={})
    with pytest.raises(ConfigError, match=re.escape("expected key.sub=value")):
        load_config(overrides=["training.steps"], env={})


def test_cli_refuses_bad_config_with_exit_2(capsys) -> None:
    assert main(["parallel.tensor=5"]) == 2
    assert "parallel.tensor: 5 does not divide model.heads" in capsys.readouterr().err
    assert main(["--print-config", "training.steps=3"]) == 0
    assert json.loads(capsys.readouterr().out)["training"]["steps"] == 3


def test_trainer_takes_the_rendered_config_as_is_and_merges_no_env() -> None:
    # spec.checkpoint's precedence is the operator's to decide when it renders
    # the config (tests/unit/operator/test_desired.py); the trainer adds nothing.
    inline = json.dumps({"checkpoint": {"interval": 50, "keepLast": 5}})
    env = {
        contract.TRAIN_CONFIG: inline,
        contract.CHECKPOINT_INTERVAL: "20",
        contract.CHECKPOINT_KEEP: "2",
    }
    loaded = load_config(env=env)
    assert (loaded.checkpoint.interval, loaded.checkpoint.keep_last) == (50, 5)


def test_a_malformed_contract_variable_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="TORCHFLEET_CHECKPOINT_INTERVAL must be an integer"):
        load_config(env={contract.CHECKPOINT_INTERVAL: "often"})
