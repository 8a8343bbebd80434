"""status.progress and status.lastCheckpoint from the master's Prometheus text.

The trainer exports gauges (torchfleet_trainer/metrics.py); this reads the
ones the status shows. Metrics it does not find are left out, so a script
that exports nothing simply has no progress.
"""

from __future__ import annotations

import math
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

STEP = "torchfleet_train_step"
TOTAL_STEPS = "torchfleet_train_total_steps"
LOSS = "torchfleet_train_loss"
TOKENS_PER_SECOND = "torchfleet_train_tokens_per_second"
STEP_SECONDS_SUM = "torchfleet_train_step_seconds_sum"
STEP_SECONDS_COUNT = "torchfleet_train_step_seconds_count"
CHECKPOINT_STEP = "torchfleet_checkpoint_step"
WANTED = {
    STEP,
    TOTAL_STEPS,
    LOSS,
    TOKENS_PER_SECOND,
    STEP_SECONDS_SUM,
    STEP_SECONDS_COUNT,
    CHECKPOINT_STEP,
}


def read_gauges(text: str) -> dict[str, float]:
    """The first finite sample of each wanted metric (one job per endpoint)."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in WANTED and sample.name not in found and math.isfinite(sample.value):
                found[sample.name] = sample.value
    return found


def progress_from_metrics(text: str, now: str) -> tuple[dict[str, Any] | None, int | None]:
    """(status.progress, checkpoint step) from one scrape; (None, None) without a step."""
    gauges = read_gauges(text)
    if STEP not in gauges:
        return None, None
    step = int(gauges[STEP])
    progress: dict[str, Any] = {"step": step, "updateTime": now}
    total = int(gauges[TOTAL_STEPS]) if gauges.get(TOTAL_STEPS) else None
    if total:
        progress["totalSteps"] = total
        progress["percent"] = min(100, int(100 * step / total))
        count = gauges.get(STEP_SECONDS_COUNT)
        if count:
            per_step = gauges[STEP_SECONDS_SUM] / count
            progress["etaSeconds"] = max(0, int(per_step * (total - step)))
    if LOSS in gauges:
        progress["loss"] = round(gauges[LOSS], 6)
    if TOKENS_PER_SECOND in gauges:
        progress["tokensPerSecond"] = round(max(0.0, gauges[TOKENS_PER_SECOND]), 3)
    checkpoint = int(gauges[CHECKPOINT_STEP]) if CHECKPOINT_STEP in gauges else None
    return progress, checkpoint
