"""A pod's /metrics is untrusted: every figure that reaches the status fits its schema.

Each parsed status is also validated by the API model (the CRD's source), so
"fits the schema" is checked by the schema itself, not restated here.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from prometheus_client import generate_latest

from torchfleet_contract import pod as contract
from torchfleet_operator.api.v1alpha1 import ProgressStatus, TrainingJobStatus
from torchfleet_operator.status.progress import (
    INT64_MAX,
    MetricsError,
    progress_from_metrics,
    schema_bounds,
    without_scraped,
)
from torchfleet_trainer.metrics import TrainMetrics

NOW = "2026-01-01T00:00:00Z"


def metrics(**values: str) -> str:
    """Exposition text with the contract's names: metrics(STEP="5") -> 'torchfleet_train_step 5'."""
    suffixes = {"STEP_SECONDS_SUM": "_sum", "STEP_SECONDS_COUNT": "_count"}
    lines = []
    for key, value in values.items():
        base = key.removesuffix("_SUM").removesuffix("_COUNT")
        lines.append(f"{getattr(contract, 'METRIC_' + base)}{suffixes.get(key, '')} {value}")
    return "\n".join(lines) + "\n"


CASES: list[tuple[str, str, dict[str, Any] | None, int | None]] = [
    # (case, text, the progress expected (updateTime aside), checkpoint step)
    ("no step: no progress", "other_metric 1\n", None, None),
    ("NaN step is not a step", metrics(STEP="NaN"), None, None),
    ("+Inf step is not a step", metrics(STEP="+Inf"), None, None),
    ("negative step is dropped", metrics(STEP="-5", CHECKPOINT_STEP="3"), None, None),
    ("1e30 step is beyond int64: dropped", metrics(STEP="1e30"), None, None),
    ("2^63 is one past int64: dropped", metrics(STEP=str(float(2**63))), None, None),
    ("a fractional step is truncated", metrics(STEP="7.9"), {"step": 7}, None),
    (
        "total < step: percent stops at 100, no negative ETA",
        metrics(STEP="300", TOTAL_STEPS="200", STEP_SECONDS_SUM="10", STEP_SECONDS_COUNT="5"),
        {"step": 300, "totalSteps": 200, "percent": 100, "etaSeconds": 0},
        None,
    ),
    (
        "_count without _sum: no ETA (and no KeyError)",
        metrics(STEP="50", TOTAL_STEPS="200", STEP_SECONDS_COUNT="50"),
        {"step": 50, "totalSteps": 200, "percent": 25},
        None,
    ),
    (
        "_sum without _count: no ETA",
        metrics(STEP="50", TOTAL_STEPS="200", STEP_SECONDS_SUM="10"),
        {"step": 50, "totalSteps": 200, "percent": 25},
        None,
    ),
    (
        "count zero: no ETA (no division by zero)",
        metrics(STEP="50", TOTAL_STEPS="200", STEP_SECONDS_SUM="10", STEP_SECONDS_COUNT="0"),
        {"step": 50, "totalSteps": 200, "percent": 25},
        None,
    ),
    (
        "no step timed yet: the gauges' initial zeros are not rates",
        metrics(
            STEP="100",
            TOTAL_STEPS="300",
            LOSS="0",
            TOKENS_PER_SECOND="0",
            MFU="0",
            STEP_SECONDS_SUM="0",
            STEP_SECONDS_COUNT="0",
            CHECKPOINT_STEP="100",
        ),
        {"step": 100, "totalSteps": 300, "percent": 33},
        100,
    ),
    (
        "a script without the step histogram is taken at its word",
        metrics(STEP="5", LOSS="0", TOKENS_PER_SECOND="0"),
        {"step": 5, "loss": 0, "tokensPerSecond": 0},
        None,
    ),
    (
        "sum zero: no ETA",
        metrics(STEP="50", TOTAL_STEPS="200", STEP_SECONDS_SUM="0", STEP_SECONDS_COUNT="50"),
        {"step": 50, "totalSteps": 200, "percent": 25},
        None,
    ),
    (
        "an absurd mean step time: ETA clamped to int64",
        metrics(STEP="1", TOTAL_STEPS="1e18", STEP_SECONDS_SUM="1e300", STEP_SECONDS_COUNT="1"),
        {"step": 1, "totalSteps": 10**18, "percent": 0, "etaSeconds": INT64_MAX},
        None,
    ),
    (
        "negative or huge total is dropped, and percent with it",
        metrics(STEP="5", TOTAL_STEPS="-1"),
        {"step": 5},
        None,
    ),
    ("total 0 means unknown", metrics(STEP="5", TOTAL_STEPS="0"), {"step": 5}, None),
    (
        "duplicate samples: the first finite one counts",
        'torchfleet_train_step{rank="0"} NaN\ntorchfleet_train_step{rank="1"} 9\n'
        'torchfleet_train_step{rank="2"} 11\n',
        {"step": 9},
        None,
    ),
    (
        "huge but finite loss is kept, infinite loss dropped",
        metrics(STEP="5", LOSS="1e300"),
        {"step": 5, "loss": 1e300},
        None,
    ),
    ("-Inf loss is dropped", metrics(STEP="5", LOSS="-Inf"), {"step": 5}, None),
    (
        "negative throughput is dropped (schema minimum 0)",
        metrics(STEP="5", TOKENS_PER_SECOND="-3"),
        {"step": 5},
        None,
    ),
    (
        "checkpoint step beyond int64 is dropped, a good one kept",
        metrics(STEP="5", CHECKPOINT_STEP="1e30"),
        {"step": 5},
        None,
    ),
    ("a good checkpoint step", metrics(STEP="5", CHECKPOINT_STEP="4"), {"step": 5}, 4),
    ("an MFU in 0-1 is kept", metrics(STEP="5", MFU="0.37"), {"step": 5, "mfu": 0.37}, None),
    (
        "a tiny MFU keeps its significant digits",
        metrics(STEP="5", MFU="0.0000123456"),
        {"step": 5, "mfu": 0.00001235},
        None,
    ),
    (
        "an MFU above 1 is dropped (schema maximum 1)",
        metrics(STEP="5", MFU="1.5"),
        {"step": 5},
        None,
    ),
    ("a NaN MFU is dropped", metrics(STEP="5", MFU="NaN"), {"step": 5}, None),
    (
        "checkpoint save time: the histogram's _sum",
        "torchfleet_checkpoint_save_seconds_sum 12.5\ntorchfleet_train_step 5\n",
        {"step": 5, "checkpointSaveSeconds": 12.5},
        None,
    ),
    (
        "a negative checkpoint save time is dropped",
        "torchfleet_checkpoint_save_seconds_sum -1\ntorchfleet_train_step 5\n",
        {"step": 5},
        None,
    ),
]


@pytest.mark.parametrize(
    ("text", "expected", "checkpoint"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_scraped_figures_are_typed_and_bounded(
    text: str, expected: dict[str, Any] | None, checkpoint: int | None
) -> None:
    progress, checkpoint_step = progress_from_metrics(text, NOW)
    assert checkpoint_step == checkpoint
    if expected is None:
        assert progress is None
        return
    assert progress == expected | {"updateTime": NOW, "source": "Metrics"}
    # The schema itself accepts it (the same model crdgen turns into the CRD).
    status: dict[str, Any] = {"progress": progress}
    if checkpoint_step is not None:
        status["lastCheckpoint"] = {"step": checkpoint_step}
    TrainingJobStatus.model_validate(status)
    assert all(v <= INT64_MAX for v in progress.values() if isinstance(v, int))


@pytest.mark.parametrize(
    "text",
    ["\x00\xff garbage {{{", "torchfleet_train_step five\n", 'torchfleet_train_step{rank="1 5\n'],
    ids=["binary", "word for a number", "unterminated label"],
)
def test_text_that_is_not_prometheus_raises_a_clear_error(text: str) -> None:
    with pytest.raises(MetricsError, match="not Prometheus text"):
        progress_from_metrics(text, NOW)


def test_bounds_come_from_the_api_model():
    assert schema_bounds(ProgressStatus, "percent") == (0, 100)
    assert schema_bounds(ProgressStatus, "step") == (0, INT64_MAX)
    low, high = schema_bounds(ProgressStatus, "loss")
    assert math.isfinite(low) and math.isfinite(high) and low < 0 < high


def test_the_trainers_own_metrics_parse_into_progress():
    """The contract's names join both sides: the trainer's registry, read by the parser."""
    trainer = TrainMetrics()
    trainer.step.set(50)
    trainer.total_steps.set(200)
    trainer.checkpoint_step.set(40)
    trainer.loss.set(2.5)
    trainer.tokens_per_second.set(1000.0)
    trainer.mfu.set(0.42)
    trainer.checkpoint_save_seconds.observe(1.5)
    trainer.checkpoint_save_seconds.observe(2.0)
    for _ in range(5):
        trainer.step_seconds.observe(2.0)
    progress, checkpoint = progress_from_metrics(generate_latest(trainer.registry).decode(), NOW)
    assert progress == {
        "step": 50,
        "totalSteps": 200,
        "percent": 25,
        "etaSeconds": 300,
        "loss": 2.5,
        "tokensPerSecond": 1000.0,
        "mfu": 0.42,
        "checkpointSaveSeconds": 3.5,  # the loop's time blocked on saves, summed
        "updateTime": NOW,
        "source": "Metrics",  # a scrape of the master's /metrics
    }
    assert checkpoint == 40


BASE_STATUS = {
    "phase": "Succeeded",
    "restartCount": 2,
    "completionTime": NOW,
    "progress": {"step": 5},
    "lastCheckpoint": {"step": 4},
}


def test_a_refused_write_is_retried_without_the_scraped_part_only_on_422():
    assert without_scraped(BASE_STATUS, 422) == {
        "phase": "Succeeded",
        "restartCount": 2,
        "completionTime": NOW,
    }
    assert without_scraped(BASE_STATUS, 403) is None  # not the figures' fault
    assert without_scraped(BASE_STATUS, 500) is None
    # Nothing scraped to drop: the same write would be refused the same way.
    assert without_scraped({"phase": "Running"}, 422) is None
