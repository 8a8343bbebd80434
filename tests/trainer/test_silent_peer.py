"""A silent peer fails its gang within the collective timeout, not gloo's 30 minutes.

Three one-process "nodes" with the environment the operator gives pods. Once
they have tightened their collective timeout (after the first steps), one is
SIGSTOPped: a machine that went silent, whose connections are never reset.
The two others must each exit with 202 (EXIT_COLLECTIVE_FAILED, retryable)
within the tight timeout plus a margin for this shared 2-core machine, with
a log line that names the rank and says why.

A second gang is stopped the same way and its survivors are sent SIGTERM
while they wait in the collective: Python runs its SIGTERM handler only
between bytecodes, never inside gloo's wait, so SIGTERM cannot interrupt the
wait; what bounds it is the same timeout, after which they exit 202 (not the
saved-preemption 143 they cannot honour with a peer gone).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.trainer import gang as gangs
from tests.trainer.cli_process import TrainerProcess, free_port
from torchfleet_trainer import contract
from torchfleet_trainer.launch import EXIT_COLLECTIVE_FAILED

pytestmark = pytest.mark.trainer

NODES = 3
TRAIN_TIMEOUT = 3.0  # the floor; 20 x this model's step time on CPU is below it
# Scheduling slack on a shared 2-core machine: the survivors also have to
# notice, log and exit. Far below the 600 s generous timeout they would
# otherwise be under, and gloo's 1800 s default.
MARGIN = 12.0
# Tightened at step 4 (the second log interval's end); at step 6 the first
# evaluation and a save run under the generous timeout and must leave the
# tight one behind, or the survivors would wait 600 s.
CONFIG = gangs.tiny_config(NODES, log_interval=2, checkpoints=True)
CONFIG["training"]["evalInterval"] = 6
CONFIG["training"]["evalBatches"] = 1
CONFIG["checkpoint"]["interval"] = 6


def pod_env(rank: int, master_port: int, checkpoint_dir: Path) -> dict[str, str]:
    env = gangs.pod_env(
        "silent", NODES, rank, master_port, CONFIG, checkpoint_dir=str(checkpoint_dir)
    )
    return env | {contract.COLLECTIVE_TRAIN_TIMEOUT: str(TRAIN_TIMEOUT)}


def start_gang(checkpoint_dir: Path) -> list[TrainerProcess]:
    port = free_port()
    gang = [TrainerProcess([], pod_env(rank, port, checkpoint_dir)) for rank in range(NODES)]
    # Rank 0 logs for the gang: every rank tightens at the same step.
    tightened = gang[0].wait_for(lambda e: e["event"] == "collective_timeout", timeout=120)
    assert tightened["seconds"] == TRAIN_TIMEOUT, tightened
    gang[0].wait_for(lambda e: e["event"] == "eval", timeout=60)
    gang[0].wait_for(lambda e: e["event"] == "checkpoint", timeout=60)
    return gang


def silence(gang: list[TrainerProcess], rank: int) -> float:
    """Stops ``rank`` mid-training (after a step rank 0 logged), as a machine that
    went silent; when."""
    gang[0].wait_for(lambda e: e["event"] == "step", timeout=60)
    os.killpg(gang[rank].proc.pid, signal.SIGSTOP)
    return time.monotonic()


def stop_all(gang: list[TrainerProcess]) -> None:
    for node in gang:
        if node.proc.poll() is None:
            os.killpg(node.proc.pid, signal.SIGKILL)
            node.proc.wait()


def assert_failed_within_timeout(survivors: list[TrainerProcess], since: float) -> None:
    for node in survivors:
        code = node.finish(timeout=TRAIN_TIMEOUT + MARGIN)
        waited = time.monotonic() - since
        assert code == EXIT_COLLECTIVE_FAILED, (code, node.stderr[-3000:])
        assert waited < TRAIN_TIMEOUT + MARGIN, waited
        print(f"survivor exited {code} {waited:.1f}s after the peer went silent")
        assert "a collective failed waiting on a peer" in node.stderr, node.stderr[-3000:]
        assert f"exiting {EXIT_COLLECTIVE_FAILED} (retryable)" in node.stderr


def test_a_silent_peer_makes_the_others_exit_202_within_the_timeout(tmp_path: Path) -> None:
    gang = start_gang(tmp_path)
    try:
        stopped = silence(gang, 2)
        assert_failed_within_timeout(gang[:2], stopped)
        for rank, node in enumerate(gang[:2]):  # each names itself
            assert f"rank {rank}/{NODES}" in node.stderr, node.stderr[-3000:]
    finally:
        stop_all(gang)


def test_sigterm_while_waiting_on_a_silent_peer_is_bounded_by_the_timeout(
    tmp_path: Path,
) -> None:
    gang = start_gang(tmp_path)
    try:
        stopped = silence(gang, 1)
        for node in (gang[0], gang[2]):
            os.killpg(node.proc.pid, signal.SIGTERM)
        assert_failed_within_timeout([gang[0], gang[2]], stopped)
    finally:
        stop_all(gang)
