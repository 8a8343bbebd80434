"""The world-size rules against the trainer's own launch check: a spec passes
them exactly when ``TrainConfig.check_world`` accepts its trainer config."""

from __future__ import annotations

from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.unit.api.cases import job
from torchfleet_contract.trainer_config import ConfigError, TrainConfig
from torchfleet_operator.api import InvalidSpecError, parse_spec, parse_training_job

SPECS = st.fixed_dictionaries(
    {
        "processesPerNode": st.sampled_from(["auto", 1, 2, 4]),
        "resources": st.fixed_dictionaries({"gpus": st.sampled_from([0, 2, 4])}),
        "worker": st.fixed_dictionaries({"replicas": st.integers(0, 3)}),
        "trainer": st.fixed_dictionaries(
            {
                "model": st.just({"layers": 8, "heads": 8, "dim": 256, "maxSeqLen": 512}),
                "data": st.fixed_dictionaries({"seqLen": st.sampled_from([128, 130, 255, 256])}),
                "training": st.fixed_dictionaries(
                    {
                        "globalBatchSize": st.sampled_from([8, 12, 16, 24, 64]),
                        "gradAccumSteps": st.sampled_from([1, 2, 4]),
                    }
                ),
                "parallel": st.fixed_dictionaries(
                    {},
                    optional={
                        "dataParallelReplicate": st.integers(1, 2),
                        "dataParallelShard": st.sampled_from([-1, 1, 2, 4]),
                        "tensor": st.sampled_from([1, 2, 4]),
                        "pipeline": st.sampled_from([1, 2]),
                        "pipelineSchedule": st.sampled_from(["1f1b", "interleaved_1f1b"]),
                        "pipelineMicrobatches": st.sampled_from([1, 2, 3, 4]),
                        "sequenceParallel": st.booleans(),
                    },
                ),
            }
        ),
    }
)


def _trainer_accepts(spec: dict[str, Any]) -> bool:
    """The trainer's own verdict, for the world size the spec describes."""
    shape = {key: value for key, value in spec.items() if key != "trainer"}
    world_size = parse_spec(shape).world_size
    try:
        TrainConfig.model_validate(spec["trainer"]).check_world(world_size)
    except (ConfigError, ValidationError):
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(spec=SPECS)
def test_world_rules_match_the_trainers_launch_check(spec: dict[str, Any]) -> None:
    try:
        parse_training_job(job(spec=spec))
        models_accept = True
    except InvalidSpecError as error:
        models_accept = False
        assert error.field.startswith("spec.trainer"), error
    event("accepted" if models_accept else "rejected")
    assert models_accept == _trainer_accepts(spec), spec
