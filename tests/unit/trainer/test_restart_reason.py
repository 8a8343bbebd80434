"""Why an in-place round failed, from the exit codes its workers reported."""

from __future__ import annotations

from pathlib import Path

from torchfleet_contract import pod as contract
from torchfleet_trainer.launcher.outcomes import (
    EXIT_COLLECTIVE_FAILED,
    EXIT_PREEMPTED,
    EXIT_PREEMPTED_UNSAVED,
    failed_round_reason,
    preempted_exit_code,
    write_outcome,
)


def test_a_worker_without_a_report_was_killed(tmp_path: Path) -> None:
    write_outcome(tmp_path, 0, EXIT_COLLECTIVE_FAILED, round_=0)
    assert failed_round_reason(tmp_path, 0, workers=2) == contract.RESTART_REASON_WORKER_KILLED


def test_a_programs_own_code_beats_a_lost_peer(tmp_path: Path) -> None:
    write_outcome(tmp_path, 0, EXIT_COLLECTIVE_FAILED, round_=1)
    write_outcome(tmp_path, 1, 1, round_=1)
    assert failed_round_reason(tmp_path, 1, workers=2) == contract.RESTART_REASON_WORKER_FAILED


def test_only_lost_peers_and_an_earlier_rounds_reports_do_not_count(tmp_path: Path) -> None:
    write_outcome(tmp_path, 0, 1, round_=0)  # round 0's: not the round asked about
    write_outcome(tmp_path, 0, EXIT_COLLECTIVE_FAILED, round_=1)
    assert failed_round_reason(tmp_path, 1, workers=1) == contract.RESTART_REASON_PEER_LOST


def test_a_stopped_launcher_reads_the_newest_rounds_reports(tmp_path: Path) -> None:
    write_outcome(tmp_path, 0, EXIT_PREEMPTED, round_=0)
    write_outcome(tmp_path, 1, EXIT_PREEMPTED, round_=0)
    assert preempted_exit_code(tmp_path, workers=2) == EXIT_PREEMPTED
    # Round 1's second worker was stopped before it could report a save.
    write_outcome(tmp_path, 0, EXIT_PREEMPTED, round_=1)
    assert preempted_exit_code(tmp_path, workers=2) == EXIT_PREEMPTED_UNSAVED
