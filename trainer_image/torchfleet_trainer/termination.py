"""The trainer's termination message: one JSON object the operator reads from
the pod's terminated container status (contract.TERMINATION_MESSAGE_PATH).

Fields are merged in as they happen (a saved preemption, an in-place restart),
so neither writer loses the other's. A launcher that exits with a failure and
no saved preemption empties it, so that the kubelet falls back to the log's
tail (FallbackToLogsOnError), which says more about a crash.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from torchfleet_trainer import contract


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


def keep_only_a_saved_preemption(path: Path) -> None:
    """After a failed exit: the message stays only if it reports a saved
    preemption (the operator resumes from that step); otherwise it is emptied."""
    if not path.is_file() or contract.SAVED_CHECKPOINT_STEP in read(path):
        return
    try:
        path.write_text("")
    except OSError as err:
        print(f"torchfleet-train: cannot empty {path}: {err}", file=sys.stderr)
