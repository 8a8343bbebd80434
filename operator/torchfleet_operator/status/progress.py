"""status.progress and status.lastCheckpoint from the master's Prometheus text.

The trainer exports gauges (torchfleet_trainer/metrics.py, names in the pod
contract); this reads the ones the status shows. Metrics it does not find are
left out, so a script that exports nothing simply has no progress.

The text comes from a pod, so it is untrusted: every number is type-checked
and held to the bounds of the status schema (read from the API model, so the
two cannot drift). A figure outside them is dropped, never passed through: one
bad value in a merge patch gets the whole status write refused (422), phase
and restartCount included. Derived figures (percent, ETA) are clamped.

A job whose master ended with the trainer's final report (its termination
message: observed.FinalReport) shows that report instead (``final``): the run
may end within a scrape interval of its last steps and saves.

It also decides which progress is current: when a gang ends the status shows
the step the next gang resumes from (``resumed``), once the ended gang's
master, which may still save, is gone (``held`` until then); a scrape older
than that, or taken before the gang ran, is the old gang's (``is_current``).
"""

from __future__ import annotations

import math
import sys
from datetime import datetime, timedelta
from typing import Any, cast

from annotated_types import Ge, Le
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from torchfleet_contract import pod as contract
from torchfleet_operator.api.v1alpha1 import CheckpointStatus, ProgressStatus
from torchfleet_operator.observed import FinalReport, GangHealth, parse_time, timestamp
from torchfleet_operator.status import node_health

STEP = contract.METRIC_STEP
TOTAL_STEPS = contract.METRIC_TOTAL_STEPS
LOSS = contract.METRIC_LOSS
TOKENS_PER_SECOND = contract.METRIC_TOKENS_PER_SECOND
STEP_SECONDS_SUM = contract.METRIC_STEP_SECONDS + "_sum"
STEP_SECONDS_COUNT = contract.METRIC_STEP_SECONDS + "_count"
CHECKPOINT_STEP = contract.METRIC_CHECKPOINT_STEP
MFU = contract.METRIC_MFU
EVAL_LOSS = contract.METRIC_EVAL_LOSS
# The trainer's checkpoint-save histogram: its _sum is the time this gang's
# loop was blocked saving.
CHECKPOINT_SAVE_SECONDS_SUM = contract.METRIC_CHECKPOINT_SAVE_SECONDS + "_sum"
PHASE_STARTED = node_health.PHASE_STARTED
IN_PLACE_RESTARTS = node_health.IN_PLACE_RESTARTS
WANTED = {
    PHASE_STARTED,
    IN_PLACE_RESTARTS,
    STEP,
    TOTAL_STEPS,
    LOSS,
    TOKENS_PER_SECOND,
    STEP_SECONDS_SUM,
    STEP_SECONDS_COUNT,
    CHECKPOINT_STEP,
    MFU,
    EVAL_LOSS,
    CHECKPOINT_SAVE_SECONDS_SUM,
}
# status.progress.source: where its figures come from (the API model's values).
SOURCE_METRICS = "Metrics"
SOURCE_TRAINER_REPORT = "TrainerReport"
SOURCE_CHECKPOINT = "Checkpoint"
# The status keys filled from a scrape: optional, so a refused write can go without them.
SCRAPED_STATUS_KEYS = ("progress", "lastCheckpoint")

# Node-health samples kept from one scrape: a few per node of the largest gang.
MAX_LABELLED_SAMPLES = 4 * node_health.MAX_NODES + len(contract.PHASES)

# A CRD `integer` is an int64 to the API server: a larger number is refused.
INT64_MAX = 2**63 - 1


class MetricsError(ValueError):
    """The scraped text is not Prometheus exposition format."""


def schema_bounds(model: type[BaseModel], field: str) -> tuple[float, float]:
    """(minimum, maximum) the status schema allows for a numeric field.

    From the model's own ge/le constraints (which crdgen writes into the CRD);
    an integer field without them is bounded by int64 (exact Python ints, so
    no float rounding at the edge), a number by the finite floats.
    """
    info = model.model_fields[field]
    is_int = int in (getattr(info.annotation, "__args__", None) or (info.annotation,))
    low: float = -INT64_MAX - 1 if is_int else -sys.float_info.max
    high: float = INT64_MAX if is_int else sys.float_info.max
    for constraint in info.metadata:
        if isinstance(constraint, Ge):
            low = max(low, cast(float, constraint.ge))
        elif isinstance(constraint, Le):
            high = min(high, cast(float, constraint.le))
    return low, high


def _bounded_int(value: float | None, model: type[BaseModel], field: str) -> int | None:
    """The value (truncated) when it lies inside the field's bounds; else None (dropped)."""
    low, high = schema_bounds(model, field)
    if value is None or not low <= value <= high:
        return None
    return int(value)


def _clamped_int(value: float, model: type[BaseModel], field: str) -> int:
    """A figure we derived, forced into the field's bounds."""
    low, high = schema_bounds(model, field)
    if value >= high:
        return int(high)
    return int(low) if value <= low else int(value)


def _bounded_float(value: float | None, model: type[BaseModel], field: str) -> float | None:
    low, high = schema_bounds(model, field)
    return value if value is not None and low <= value <= high else None


def read_gauges(text: str) -> dict[str, float]:
    """The first finite numeric sample of each wanted metric (one job per endpoint).

    Raises MetricsError when the text does not parse.
    """
    return read_samples(text)[0]


def read_samples(text: str) -> tuple[dict[str, float], list[tuple[str, dict[str, str], float]]]:
    """One pass over the text: the wanted gauges (read_gauges), and every numeric
    sample of the node-health families with its labels (status/node_health.py).

    Raises MetricsError when the text does not parse.
    """
    found: dict[str, float] = {}
    labelled: list[tuple[str, dict[str, str], float]] = []
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                value = sample.value
                if not isinstance(value, int | float) or isinstance(value, bool):
                    continue
                if sample.name in node_health.WANTED:
                    if len(labelled) < MAX_LABELLED_SAMPLES:
                        labelled.append((sample.name, dict(sample.labels), float(value)))
                elif sample.name in WANTED and sample.name not in found and math.isfinite(value):
                    found[sample.name] = float(value)
    except Exception as exc:  # the parser raises whatever the bad line provokes
        raise MetricsError(f"not Prometheus text: {type(exc).__name__}: {exc}"[:300]) from exc
    return found, labelled


def scrape_from_metrics(
    text: str, now: str
) -> tuple[dict[str, Any] | None, int | None, GangHealth | None]:
    """(status.progress, checkpoint step, the gang's node health) from one scrape.

    Raises MetricsError when the text does not parse.
    """
    gauges, labelled = read_samples(text)
    progress, checkpoint = _progress(gauges, now)
    count, seconds = gauges.get(STEP_SECONDS_COUNT), gauges.get(STEP_SECONDS_SUM)
    step_seconds = seconds / count if count and seconds and count > 0 and seconds > 0 else None
    started = gauges.get(PHASE_STARTED)
    restarts = gauges.get(IN_PLACE_RESTARTS)
    health = node_health.health_from_samples(labelled, started, step_seconds, restarts)
    return progress, checkpoint, health


def progress_from_metrics(text: str, now: str) -> tuple[dict[str, Any] | None, int | None]:
    """(status.progress, checkpoint step) from one scrape; (None, None) without a usable step.

    Raises MetricsError when the text does not parse.
    """
    return _progress(read_gauges(text), now)


def _progress(gauges: dict[str, float], now: str) -> tuple[dict[str, Any] | None, int | None]:
    step = _bounded_int(gauges.get(STEP), ProgressStatus, "step")
    if step is None:
        return None, None
    checkpoint = _bounded_int(gauges.get(CHECKPOINT_STEP), CheckpointStatus, "step")
    # The gauge's initial 0 is "no checkpoint yet" (no save is of step 0), not a save.
    checkpoint = checkpoint or None
    progress: dict[str, Any] = {"step": step, "updateTime": now, "source": SOURCE_METRICS}
    total = _bounded_int(gauges.get(TOTAL_STEPS), ProgressStatus, "total_steps")
    if total:  # 0 means "not known"
        progress["totalSteps"] = total
        progress["percent"] = _clamped_int(100 * step / total, ProgressStatus, "percent")
        eta = _eta_seconds(gauges, step, total)
        if eta is not None:
            progress["etaSeconds"] = eta
    if not _before_the_first_step(gauges):
        _add_rates(progress, gauges)
    saving = _bounded_float(
        gauges.get(CHECKPOINT_SAVE_SECONDS_SUM), ProgressStatus, "checkpoint_save_seconds"
    )
    if saving is not None:
        progress["checkpointSaveSeconds"] = round(saving, 3)
    return progress, checkpoint


def _before_the_first_step(gauges: dict[str, float]) -> bool:
    """This process has timed no step yet: its loss, throughput and MFU gauges
    still hold their initial 0, which the status must not show (a loss of 0
    reads as a perfect model). Only the trainer's step histogram says so; a
    script without it is taken at its word."""
    return gauges.get(STEP_SECONDS_COUNT) == 0


def _add_rates(progress: dict[str, Any], gauges: dict[str, float]) -> None:
    """The last logged step's loss, throughput and MFU, each within its bounds."""
    loss = _bounded_float(gauges.get(LOSS), ProgressStatus, "loss")
    if loss is not None:
        progress["loss"] = round(loss, 6)
    throughput = _bounded_float(gauges.get(TOKENS_PER_SECOND), ProgressStatus, "tokens_per_second")
    if throughput is not None:
        progress["tokensPerSecond"] = round(throughput, 3)
    mfu = _bounded_float(gauges.get(MFU), ProgressStatus, "mfu")
    # The trainer sets no MFU where it knows no peak (a CPU, an unlisted
    # device): the gauge keeps its initial 0, which means "not known".
    if mfu:
        # Significant digits, not decimals: a small model's real MFU (1e-5 on
        # a big GPU) must not read as 0, which says "not known".
        progress["mfu"] = float(f"{mfu:.4g}")
    validation = _bounded_float(gauges.get(EVAL_LOSS), ProgressStatus, "validation_loss")
    # The gauge's initial 0 is "not evaluated yet" (no model scores a loss of 0).
    if validation:
        progress["validationLoss"] = round(validation, 6)


def final(report: FinalReport, shown: dict[str, Any] | None, now: datetime) -> dict[str, Any]:
    """status.progress of a job whose master ended with the trainer's final report:
    its last step, loss, validation loss and throughput (each within the schema's
    bounds, as a scrape's), no ETA. The time the loop spent saving is the last
    scrape's: the report does not carry it."""
    figures = {
        STEP: report.step,
        TOTAL_STEPS: report.total_steps,
        LOSS: report.loss,
        EVAL_LOSS: report.validation_loss,
        TOKENS_PER_SECOND: report.tokens_per_second,
        MFU: report.mfu,
    }
    gauges = {name: float(value) for name, value in figures.items() if value is not None}
    when = timestamp(min(report.time, now))  # a pod's clock is not ours
    progress = _progress(gauges, when)[0] or {"step": 0, "updateTime": when}
    progress.pop("etaSeconds", None)
    saving = (shown or {}).get("checkpointSaveSeconds")
    if saving is not None:
        progress["checkpointSaveSeconds"] = saving
    return progress | {"source": SOURCE_TRAINER_REPORT}


def is_current(
    scraped: dict[str, Any], shown: dict[str, Any] | None, running_since: str | None
) -> bool:
    """Whether a scrape may replace the progress shown: it must be newer than what
    is shown (a gang restart stamps its reset, so the old gang's last scrape,
    still held by the poller, never comes back) and taken while this gang runs
    (a scrape in flight across the restart is the old gang's)."""
    taken = parse_time(scraped.get("updateTime"))
    if taken is None:
        return False
    before = parse_time((shown or {}).get("updateTime"))
    if before is not None and taken <= before:
        return False
    since = parse_time(running_since)
    return since is None or taken >= since


def waits_for_a_later_second(
    scraped: dict[str, Any], shown: dict[str, Any] | None, now: datetime
) -> bool:
    """A fresh scrape with new figures that is_current refused only because it was
    taken in the same (whole) second as what is shown: one taken a second later
    will pass. The poller asks for a pass only when the figures change, so without
    a second look these figures would wait for the next change, or the resync.
    Only while the scrape is fresh: a master that stopped answering (an old
    gang's) must not keep its job coming back every second."""
    if not isinstance(shown, dict):
        return False
    taken = parse_time(scraped.get("updateTime"))
    if taken is None or taken != parse_time(shown.get("updateTime")):
        return False
    if now - taken > timedelta(seconds=2):
        return False
    return any(scraped.get(k) != shown.get(k) for k in scraped if k != "updateTime")


def resumed(
    progress: dict[str, Any] | None, checkpoint_step: int | None, now: str
) -> dict[str, Any] | None:
    """status.progress once a gang ended: the step the next gang resumes from (the
    last complete checkpoint's, or 0 without one), percent recomputed. The old
    gang's rates, loss and ETA go: they described a gang that no longer runs."""
    if progress is None and checkpoint_step is None:
        return None
    step = checkpoint_step or 0
    reset: dict[str, Any] = {"step": step, "updateTime": now, "source": SOURCE_CHECKPOINT}
    total = (progress or {}).get("totalSteps")
    if isinstance(total, int) and total > 0:
        reset["totalSteps"] = total
        reset["percent"] = _clamped_int(100 * step / total, ProgressStatus, "percent")
    return reset


def held(progress: dict[str, Any] | None, now: str) -> dict[str, Any] | None:
    """status.progress while an ended gang's master may still save: the last
    step seen stays (the next gang resumes from that save or an earlier one,
    so showing the older checkpoint now would go backwards and forward again);
    the rates, loss and ETA go with the gang, its checkpoint time stays for
    the accounting. Stamped, so the old gang's last scrape never comes back."""
    if progress is None:
        return None
    kept = ("step", "totalSteps", "percent", "checkpointSaveSeconds", "source")
    return {k: progress[k] for k in kept if k in progress} | {"updateTime": now}


def _eta_seconds(gauges: dict[str, float], step: int, total: int) -> int | None:
    """Mean step time x steps left; None without a positive mean (a _count with no _sum)."""
    count, seconds = gauges.get(STEP_SECONDS_COUNT), gauges.get(STEP_SECONDS_SUM)
    if count is None or seconds is None or count <= 0 or seconds <= 0:
        return None
    steps_left = max(0, total - step)
    if steps_left == 0:
        return 0
    # An absurd mean (1e300 s) overflows to inf, which the clamp turns into the maximum.
    return _clamped_int(seconds / count * steps_left, ProgressStatus, "eta_seconds")


def without_scraped(status: dict[str, Any], code: int) -> dict[str, Any] | None:
    """The status to retry a refused write with, or None when retrying cannot help.

    Only a 422 (the schema refused a value) may be the scraped part's fault;
    then the write goes again without it, so phase, restartCount and
    completionTime are never lost to a figure a pod reported.
    """
    if code != 422 or not any(key in status for key in SCRAPED_STATUS_KEYS):
        return None
    return {key: value for key, value in status.items() if key not in SCRAPED_STATUS_KEYS}
