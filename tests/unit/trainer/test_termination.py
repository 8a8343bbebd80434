"""After a failure the termination message keeps the figures with the failure's
last lines, within the kubelet's 4 KiB; with nothing to say beside them it is
emptied (the kubelet then gives the log's own tail), unless it reports a
saved preemption, which the operator resumes from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchfleet_contract import pod as contract
from torchfleet_trainer import termination
from torchfleet_trainer.launcher import logtee

FIGURES = {contract.REPORTED_STEP: 5, contract.REPORTED_TIME: "2026-11-28T12:00:00Z"}
PREEMPTED = {
    contract.SAVED_CHECKPOINT_STEP: 60,
    contract.SAVED_CHECKPOINT_TIME: "2026-11-28T12:00:00Z",
}


SAVED = FIGURES | PREEMPTED  # a failure after a completed save


@pytest.mark.parametrize(
    ("written", "tail", "preempted", "left"),
    [
        (FIGURES, "boom", False, FIGURES | {contract.REPORTED_LOG_TAIL: "boom"}),
        (FIGURES, None, False, ""),
        (SAVED, None, False, ""),
        (SAVED, "boom", True, SAVED),
        ({}, "boom", False, ""),
    ],
    ids=[
        "figures and a tail",
        "figures, no tail: the kubelet's tail",
        "a save, no tail: the kubelet's tail",
        "a saved preemption stays as it is",
        "a tail, no figures",
    ],
)
def test_after_a_failure(
    tmp_path: Path, written: dict, tail: str | None, preempted: bool, left: object
) -> None:
    path = tmp_path / "termination-log"
    path.write_text(json.dumps(written))
    termination.after_failure(path, tail, preempted)
    text = path.read_text()
    assert (json.loads(text) if text else "") == left


def test_a_long_tail_is_cut_from_the_front_to_fit_the_kubelets_cap(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    path.write_text(json.dumps(FIGURES))
    lines = [f'line {i}: "quoted"\ttabbed ünïcode' for i in range(400)]
    termination.after_failure(path, "\n".join(lines))
    written = path.read_bytes()
    assert len(written) <= termination.MESSAGE_LIMIT
    kept = json.loads(written)[contract.REPORTED_LOG_TAIL]
    assert kept.endswith(lines[-1]) and len(kept) > 1000  # the end, and most of the room


def test_the_kept_tail_is_the_newest_rounds_last_lines(tmp_path: Path) -> None:
    for round_, text in ((0, "old round\n"), (2, "header\n" + "x\n" * 100 + "the failure\n")):
        path = Path(contract.kept_log_file(str(tmp_path), 3, round_, 1))
        path.parent.mkdir(parents=True)
        path.write_text(text)
    tail = logtee.kept_tail(str(tmp_path), 3, 1)
    assert tail is not None and tail.endswith("the failure")
    assert len(tail.splitlines()) == logtee.TAIL_LINES
    assert logtee.kept_tail(str(tmp_path), 3, 0) is None  # this rank kept nothing
    assert logtee.kept_tail(None, 3, 1) is None  # no checkpoint directory
