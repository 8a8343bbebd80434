"""The exported phase says eval during an evaluation and checkpoint during a save.

Two one-process "nodes" (the operator's environment) evaluate and save every
step. Rank 1 is SIGSTOPped: rank 0 then waits for it in its next collective,
wherever in the loop that is, while its /metrics thread goes on serving. Once
two scrapes a second apart agree (rank 0 is held), the phase it exports is
read; a hold that landed elsewhere is released and taken again. Held in an
evaluation, rank 0 exports ``eval`` for as long as it waits, with a step that
stands still, and the operator's own reading of that scrape says eval, which
its stall judgment never counts as a stall (tests/unit/operator/
test_policy_health.py, also under stall.action Restart). Held in a save, it
exports ``checkpoint``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from tests.fixtures.poll import wait_for
from tests.trainer import gang
from tests.trainer.cli_process import TrainerProcess, free_port
from torchfleet_operator.status.node_health import health_from_samples
from torchfleet_operator.status.progress import read_samples
from torchfleet_trainer import contract

pytestmark = pytest.mark.trainer

NODES = 2
CONFIG = gang.tiny_config(NODES, log_interval=1, checkpoints=True)
CONFIG["training"] |= {"evalInterval": 1, "evalBatches": 4}
CONFIG["checkpoint"] |= {"interval": 1, "asyncSave": False}
CONFIG["metrics"] = {"port": 0}
TIMEOUT = 120
# Holds taken until one lands in the wanted phase: each lands in one of a
# step's three blocking parts (train, eval, save), so a few suffice.
ATTEMPTS = 40
# How long a held phase is watched: a long evaluation, for this tiny model.
WATCH_SECONDS = 3.0


def scrape_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def phase_and_step(text: str) -> tuple[str | None, float | None]:
    plain, labelled = read_samples(text)
    scraped = health_from_samples(labelled, None, None)
    return (scraped.phase if scraped else None), plain.get("torchfleet_train_step")


def settled(port: int) -> tuple[str | None, float | None]:
    """Rank 0's phase and step once two scrapes half a second apart agree."""
    seen = [phase_and_step(scrape_text(port))]

    def agree() -> bool:
        time.sleep(0.5)
        seen.append(phase_and_step(scrape_text(port)))
        return seen[-1] == seen[-2]

    wait_for("rank 0 waiting for the stopped rank 1", agree, timeout=TIMEOUT, interval=0)
    return seen[-1]


def held_in(phase: str, port: int, rank1: int) -> tuple[str | None, float | None]:
    """Stops rank 1 until rank 0 is found held in ``phase``; rank 1 stays stopped."""
    for attempt in range(ATTEMPTS):
        os.kill(rank1, signal.SIGSTOP)
        held = settled(port)
        if held[0] == phase:
            return held
        os.kill(rank1, signal.SIGCONT)
        time.sleep(0.01 * (attempt % 7))  # land elsewhere in the loop next time
    raise AssertionError(f"rank 0 never held in {phase} in {ATTEMPTS} holds")


@pytest.mark.parametrize("phase", [contract.PHASE_EVAL, contract.PHASE_CHECKPOINT])
def test_the_exported_phase_is_the_one_rank_zero_is_held_in(tmp_path: Path, phase: str) -> None:
    port = free_port()
    pods = [
        TrainerProcess(
            [], gang.pod_env("phase", NODES, rank, port, CONFIG, checkpoint_dir=str(tmp_path))
        )
        for rank in range(NODES)
    ]
    try:
        metrics_port = pods[0].wait_for(lambda e: e["event"] == "metrics", timeout=TIMEOUT)["port"]
        pods[0].wait_for(lambda e: e["event"] == "step" and e["step"] >= 2, timeout=TIMEOUT)
        held = held_in(phase, metrics_port, pods[1].proc.pid)
        time.sleep(WATCH_SECONDS)
        # Still the same phase and step a long while later: no hang, a phase.
        assert phase_and_step(scrape_text(metrics_port)) == held
        text = scrape_text(metrics_port)
        exported = f'{contract.METRIC_PHASE}{{{contract.LABEL_PHASE}="{phase}"}} 1.0'
        assert exported in text.splitlines(), text
    finally:
        for pod in pods:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pod.proc.pid, signal.SIGKILL)
            pod.proc.wait()
