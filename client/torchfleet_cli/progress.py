"""A job's status as the words ``torchfleet run`` and ``attach`` show: the
progress line beside the bar, and a line for each phase change or restart.

Pure: :class:`TrainingJobStatus` (the CRD's own models) in, text out.
"""

from __future__ import annotations

from torchfleet_operator.api import Condition, TrainingJobStatus
from torchfleet_operator.api.constants import PHASE_FAILED, PHASE_SUCCEEDED
from torchfleet_operator.api.reasons import CONDITION_FAILED, CONDITION_RESTARTING

FINAL_PHASES = frozenset({PHASE_SUCCEEDED, PHASE_FAILED})


def condition(status: TrainingJobStatus, type_: str) -> Condition | None:
    """The status's condition of ``type_`` (one per type), if any."""
    return next((c for c in status.conditions or () if c.type == type_), None)


def explained(found: Condition | None) -> str:
    """``reason: message`` of a condition, as much of it as there is."""
    if found is None:
        return ""
    return ": ".join(part for part in (found.reason, found.message) if part)


def duration(seconds: float) -> str:
    """``1h02m``, ``4m05s``, ``12s``."""
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def rate(tokens_per_second: float) -> str:
    for factor, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if tokens_per_second >= factor:
            return f"{tokens_per_second / factor:.1f}{unit} tok/s"
    return f"{tokens_per_second:.0f} tok/s"


def progress_line(status: TrainingJobStatus) -> str:
    """``Running · step 420/1000 · loss 1.930 · 51.2k tok/s · ETA 4m05s · restarts 1``:
    what the status says, leaving out what it does not."""
    parts: list[str] = [status.phase or "Pending"]
    progress = status.progress
    if progress is not None:
        total = f"/{progress.total_steps}" if progress.total_steps is not None else ""
        parts.append(f"step {progress.step}{total}")
        if progress.loss is not None:
            parts.append(f"loss {progress.loss:.4g}")
        if progress.tokens_per_second is not None:
            parts.append(rate(progress.tokens_per_second))
        if progress.eta_seconds is not None and status.phase not in FINAL_PHASES:
            parts.append(f"ETA {duration(progress.eta_seconds)}")
    parts.append(f"restarts {status.restarts}")
    return " · ".join(parts)


def changes(before: TrainingJobStatus | None, now: TrainingJobStatus) -> list[str]:
    """The lines printed above the bar between two observed statuses: a phase
    change (with the reason of a restart or failure) and each new restart."""
    lines = []
    was = before.phase if before is not None else None
    restarts_before = before.restart_count if before is not None else 0
    if now.restart_count > restarts_before:
        # The Restarting condition holds the failure's reason and "restart N
        # (...): what failed" until the next gang runs; a gang that came up
        # between two looks leaves only the count.
        restarting = condition(now, CONDITION_RESTARTING)
        if restarting is not None and restarting.status == "True":
            lines.append(explained(restarting))
        else:
            lines.append(f"restart {now.restart_count}")
    if now.phase is not None and now.phase != was:
        line = f"{was} -> {now.phase}" if was else now.phase
        why = failure_reason(now) if now.phase == PHASE_FAILED else ""
        lines.append(f"{line}: {why}" if why else line)
    return lines


def failure_reason(status: TrainingJobStatus) -> str:
    """Why a failed job failed, from its Failed condition."""
    return explained(condition(status, CONDITION_FAILED)) or "the job failed"
