"""The exported phase says eval during an evaluation and checkpoint during a save.

Two one-process "nodes" (the operator's environment) evaluate and save every
step. Rank 1 holds itself as it enters the evaluation (or save) of step 2
(tests/e2e/hold's barrier): rank 0 goes on into that phase and waits for rank 1
in its first collective there, while its /metrics thread goes on serving. A
barrier, not a chance: on any machine, however fast or loaded, rank 0 is held
inside the phase the test means. Held in an evaluation, rank 0 exports ``eval``
for as long as it waits, with a step that stands still, and the operator's own
reading of that scrape says eval, which its stall judgment never counts as a
stall (tests/unit/operator/test_policy_health.py, also under stall.action
Restart). Held in a save, it exports ``checkpoint``.
"""

from __future__ import annotations

import os
import time
import urllib.request
from pathlib import Path

import pytest

from tests.fixtures.e2e import HOLD_CODE, Hold
from tests.fixtures.poll import wait_for
from tests.trainer import gang
from tests.trainer.cli_process import TrainerProcess, free_port
from torchfleet_contract import pod as contract
from torchfleet_operator.status.node_health import health_from_samples
from torchfleet_operator.status.progress import read_samples

pytestmark = pytest.mark.trainer

NODES = 2
CONFIG = gang.tiny_config(NODES, log_interval=1, checkpoints=True)
CONFIG["training"] |= {"evalInterval": 1, "evalBatches": 4}
CONFIG["checkpoint"] |= {"interval": 1, "asyncSave": False}
CONFIG["metrics"] = {"port": 0}
TIMEOUT = 120
# Past the first evaluation and save, which compile and warm up.
HELD_STEP = 2
# How long a held phase is watched: a long evaluation, for this tiny model.
WATCH_SECONDS = 3.0


def scrape_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def phase_and_step(text: str) -> tuple[str | None, float | None]:
    plain, labelled = read_samples(text)
    scraped = health_from_samples(labelled, None, None)
    return (scraped.phase if scraped else None), plain.get("torchfleet_train_step")


def held_env(rank: int, point: str, hold: Hold) -> dict[str, str]:
    """Rank 1 holds itself at ``point``; rank 0 runs as it is."""
    if rank == 0:
        return {}
    path = [str(HOLD_CODE), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": ":".join(path), "E2E_HOLD_AT": point, "E2E_HOLD_DIR": str(hold.folder)}


@pytest.mark.parametrize(
    ("phase", "entered"),
    [(contract.PHASE_EVAL, "before-eval"), (contract.PHASE_CHECKPOINT, "before-save")],
)
def test_the_exported_phase_is_the_one_rank_zero_is_held_in(
    tmp_path: Path, phase: str, entered: str
) -> None:
    port = free_port()
    hold = Hold(tmp_path / "hold", 0)
    pods = [
        TrainerProcess(
            [],
            gang.pod_env("phase", NODES, rank, port, CONFIG, checkpoint_dir=str(tmp_path / "ckpt"))
            | held_env(rank, f"{entered}:{HELD_STEP}", hold),
        )
        for rank in range(NODES)
    ]
    try:
        metrics_port = pods[0].wait_for(lambda e: e["event"] == "metrics", timeout=TIMEOUT)["port"]
        wait_for(f"rank 1 held {entered} step {HELD_STEP}", hold.held, timeout=TIMEOUT)
        # Rank 0 is bound to reach the phase, and to stay in it: rank 1 waits.
        wait_for(
            f"rank 0 exporting {phase}",
            lambda: phase_and_step(scrape_text(metrics_port))[0] == phase,
            timeout=TIMEOUT,
        )
        held = phase_and_step(scrape_text(metrics_port))
        assert held == (phase, HELD_STEP)
        time.sleep(WATCH_SECONDS)
        # Still the same phase and step a long while later: no hang, a phase.
        assert phase_and_step(scrape_text(metrics_port)) == held
        text = scrape_text(metrics_port)
        exported = f'{contract.METRIC_PHASE}{{{contract.LABEL_PHASE}="{phase}"}} 1.0'
        assert exported in text.splitlines(), text
    finally:
        for pod in pods:
            pod.kill()
        hold.release()
