"""The trainer's termination message: one JSON object the operator reads from
the pod's terminated container status (contract.TERMINATION_MESSAGE_PATH).

Fields are merged in as they happen (a saved preemption, an in-place restart,
rank 0's figures as its run ended, however it ended), so neither writer loses
the other's. The kubelet falls back to the log's tail (FallbackToLogsOnError)
only for an empty message, so a launcher that exits with a failure puts the
tail there itself, beside the figures (``after_failure``); where it has no tail
to give, it empties the message unless it reports a saved preemption, and the
kubelet's fallback shows the crash.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from torchfleet_contract import pod as contract


def destination(pod: contract.PodContract) -> Path | None:
    """Where this pod's message goes: the file the kubelet made for it, or one
    named through TERMINATION_MESSAGE_PATH_ENV; None outside a container (no
    operator reads it there, and the default path's folder is not ours)."""
    path = Path(pod.termination_message_path)
    named = pod.termination_message_path != contract.TERMINATION_MESSAGE_PATH
    return path if named or path.is_file() else None


def read(path: Path) -> dict[str, Any]:
    """The message's object; empty where there is none (or it is not ours)."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return report if isinstance(report, dict) else {}


def update(path: Path, fields: dict[str, Any]) -> None:
    """Merges ``fields`` into the message; a failed write is said, never raised:
    the message is a status detail, never a reason to stop training."""
    try:
        path.write_text(json.dumps(read(path) | fields))
    except OSError as err:
        print(f"torchfleet-train: no termination message at {path}: {err}", file=sys.stderr)


# The kubelet's cap on one container's message; the JSON around the tail fits
# in what the tail leaves (the figures, a few hundred bytes).
MESSAGE_LIMIT = 4096


def after_failure(path: Path, log_tail: str | None, preempted: bool = False) -> None:
    """After a failed exit: the figures stay, with ``log_tail`` (the failure's
    last lines) beside them, cut from the front to fit the kubelet's cap.
    Without a tail or figures it is emptied, for the kubelet's own tail; after
    a saved preemption (exit 143) it stays as it is, the saved step in it."""
    if preempted:
        keep_only_a_saved_preemption(path)
        return
    report = read(path) if path.is_file() else {}
    if not log_tail or contract.REPORTED_STEP not in report:
        _empty(path)
        return
    room = MESSAGE_LIMIT - len(json.dumps(report | {contract.REPORTED_LOG_TAIL: ""}).encode())
    tail = log_tail
    while tail and len(json.dumps(tail).encode()) - 2 > room:
        tail = tail[len(tail) // 8 + 1 :]  # escapes make bytes and characters differ
    update(path, {contract.REPORTED_LOG_TAIL: tail})


def keep_only_a_saved_preemption(path: Path) -> None:
    """After a failed exit: the message stays only if it reports a saved
    preemption (the operator resumes from that step); otherwise it is emptied."""
    if contract.SAVED_CHECKPOINT_STEP not in read(path):
        _empty(path)


def _empty(path: Path) -> None:
    if not path.is_file():
        return
    try:
        path.write_text("")
    except OSError as err:
        print(f"torchfleet-train: cannot empty {path}: {err}", file=sys.stderr)
