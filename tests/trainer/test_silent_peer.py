"""A silent peer fails its gang within the collective timeout, not gloo's 30 minutes.

Three one-process "nodes" with the environment the operator gives pods. Once
they have tightened their collective timeout (after the first steps), one is
SIGSTOPped: a machine that went silent, whose connections are never reset.
The two others must each exit with 202 (EXIT_COLLECTIVE_FAILED, retryable)
within the tight timeout plus a margin for this shared 2-core machine, with
a log line that names the rank and says why.

The stop must land where the tight timeout holds: a save runs under the
generous one, and a fast machine can reach the next save before an unheld
stop lands. So the peer holds itself as it enters the evaluation of step
SILENT_AT (tests/e2e/hold's barrier), which runs under the tight timeout (only
the first one is generous); the others go on into it and wait for the peer in
its collective. The test then SIGSTOPs the held peer and never releases it,
and checks where rank 0 waits: its exported phase says eval.

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

from tests.fixtures.e2e import HOLD_CODE, Hold
from tests.fixtures.poll import wait_for
from tests.trainer import gang as gangs
from tests.trainer.cli_process import TrainerProcess, free_port
from tests.trainer.test_shakespeare_metrics import scrape
from torchfleet_contract import pod as contract
from torchfleet_trainer.launcher.outcomes import EXIT_COLLECTIVE_FAILED

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
CONFIG["metrics"] = {"port": 0}  # rank 0's phase says where the stop landed
# The second evaluation: under the tight timeout, past the first save.
SILENT_AT = 12


def pod_env(rank: int, master_port: int, tmp_path: Path, silent: int, hold: Hold) -> dict[str, str]:
    env = gangs.pod_env(
        "silent", NODES, rank, master_port, CONFIG, checkpoint_dir=str(tmp_path / "ckpt")
    )
    env[contract.COLLECTIVE_TRAIN_TIMEOUT] = str(TRAIN_TIMEOUT)
    if rank == silent:
        path = [str(HOLD_CODE), *filter(None, [os.environ.get("PYTHONPATH")])]
        env |= {"PYTHONPATH": ":".join(path), "E2E_HOLD_AT": f"before-eval:{SILENT_AT}"}
        env["E2E_HOLD_DIR"] = str(hold.folder)
    return env


def start_gang(tmp_path: Path, silent: int, hold: Hold) -> tuple[list[TrainerProcess], int]:
    """The gang, once past its first evaluation and save, ``silent`` to hold
    itself at SILENT_AT; rank 0's metrics port."""
    port = free_port()
    gang = [
        TrainerProcess([], pod_env(rank, port, tmp_path, silent, hold)) for rank in range(NODES)
    ]
    metrics_port = gang[0].wait_for(lambda e: e["event"] == "metrics", timeout=120)["port"]
    # Rank 0 logs for the gang: every rank tightens at the same step.
    tightened = gang[0].wait_for(lambda e: e["event"] == "collective_timeout", timeout=120)
    assert tightened["seconds"] == TRAIN_TIMEOUT, tightened
    gang[0].wait_for(lambda e: e["event"] == "eval", timeout=60)
    gang[0].wait_for(lambda e: e["event"] == "checkpoint", timeout=60)
    return gang, metrics_port


def where_rank_zero_waits(metrics_port: int) -> tuple[float, float] | None:
    """Rank 0's phase (as its PHASES index) and step once two scrapes agree; None
    once it has exited (it timed out waiting, under the tight timeout)."""
    seen: list[tuple[float, float] | None] = []

    def settled() -> bool:
        try:
            samples = scrape(metrics_port)
        except OSError:
            seen.append(None)
            return True
        phase = next(
            (i for i, p in enumerate(contract.PHASES) if samples.get(phase_series(p)) == 1), -1
        )
        seen.append((float(phase), samples["torchfleet_train_step"]))
        return len(seen) >= 2 and seen[-1] == seen[-2]

    wait_for(
        "rank 0 waiting for the stopped peer",
        settled,
        timeout=TRAIN_TIMEOUT + MARGIN,
        explain=lambda: f"scrapes: {seen[-5:]}",
    )
    return seen[-1]


def phase_series(phase: str) -> str:
    return f'{contract.METRIC_PHASE}{{{contract.LABEL_PHASE}="{phase}"}}'


def silence(gang: list[TrainerProcess], rank: int, hold: Hold, metrics_port: int) -> float:
    """Stops ``rank``, held as it entered the evaluation of SILENT_AT, as a machine
    that went silent: rank 0 waits for it in the evaluation, under the tight
    timeout. When the peer stopped answering (it held), by the wall clock."""
    held = wait_for(f"rank {rank} held at step {SILENT_AT}", hold.held, timeout=120)
    os.killpg(gang[rank].proc.pid, signal.SIGSTOP)
    settled = where_rank_zero_waits(metrics_port)
    if settled is not None:  # else it has already given up on the peer
        assert settled == (float(contract.PHASES.index(contract.PHASE_EVAL)), SILENT_AT)
    return float(held["time"])


def stop_all(gang: list[TrainerProcess]) -> None:
    for node in gang:
        node.kill()


def assert_failed_within_timeout(survivors: list[TrainerProcess], since: float) -> None:
    for node in survivors:
        code = node.finish(timeout=TRAIN_TIMEOUT + MARGIN)
        waited = time.time() - since
        assert code == EXIT_COLLECTIVE_FAILED, (code, node.stderr[-3000:])
        assert waited < TRAIN_TIMEOUT + MARGIN, waited
        print(f"survivor exited {code} {waited:.1f}s after the peer went silent")
        assert "a collective failed waiting on a peer" in node.stderr, node.stderr[-3000:]
        assert f"exiting {EXIT_COLLECTIVE_FAILED} (retryable)" in node.stderr


def test_a_silent_peer_makes_the_others_exit_202_within_the_timeout(tmp_path: Path) -> None:
    hold = Hold(tmp_path / "hold", 0)
    gang, metrics_port = start_gang(tmp_path, 2, hold)
    try:
        stopped = silence(gang, 2, hold, metrics_port)
        assert_failed_within_timeout(gang[:2], stopped)
        for rank, node in enumerate(gang[:2]):  # each names itself
            assert f"rank {rank}/{NODES}" in node.stderr, node.stderr[-3000:]
    finally:
        stop_all(gang)


def test_sigterm_while_waiting_on_a_silent_peer_is_bounded_by_the_timeout(
    tmp_path: Path,
) -> None:
    hold = Hold(tmp_path / "hold", 0)
    gang, metrics_port = start_gang(tmp_path, 1, hold)
    try:
        stopped = silence(gang, 1, hold, metrics_port)
        for node in (gang[0], gang[2]):
            os.killpg(node.proc.pid, signal.SIGTERM)
        assert_failed_within_timeout([gang[0], gang[2]], stopped)
    finally:
        stop_all(gang)
