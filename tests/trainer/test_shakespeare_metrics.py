"""A short char-level Shakespeare run learns, and /metrics serves while it runs.

The config arrives as JSON in the env var the operator sets; metrics use port 0
and the trainer logs the port it bound. The scrape is taken between the async
save at step 50 and the next at 100: the trainer holds itself once it has
logged step 90 (tests/e2e/hold's barrier, its /metrics thread serving on) until
the test has scraped. Unheld, a fast machine reached the save at 100, or the
end, before the scrape.
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest

from tests.fixtures.e2e import HOLD_CODE, Hold
from tests.fixtures.poll import wait_for
from tests.trainer.cli_process import TrainerProcess
from torchfleet_contract import pod as contract

pytestmark = pytest.mark.trainer

STEPS = 150
# Untrained: ln(65) = 4.17. Character unigram statistics alone give ~3.3; a
# small GPT at this budget reaches ~2.4, so 2.6 shows it learned context.
VAL_LOSS_THRESHOLD = 2.6
# After the async save at step 50 and before the next at 100 (a log step).
SCRAPE_AT_STEP = 90
SERIES = [
    "torchfleet_train_step",
    "torchfleet_train_total_steps",
    "torchfleet_train_loss",
    "torchfleet_train_learning_rate",
    "torchfleet_train_tokens_per_second",
    "torchfleet_train_mfu_ratio",
    "torchfleet_train_step_seconds_bucket",
    "torchfleet_train_gpu_memory_bytes",
    "torchfleet_checkpoint_save_seconds_count",
    "torchfleet_checkpoint_load_seconds",
    "torchfleet_checkpoint_step",
]


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def test_char_shakespeare_learns_and_serves_metrics(tmp_path: Path, shakespeare_path: Path) -> None:
    config = {
        "model": {"architecture": "gpt", "layers": 2, "heads": 4, "dim": 64, "maxSeqLen": 64},
        "data": {"kind": "char", "path": str(shakespeare_path), "seqLen": 64},
        "training": {
            "steps": STEPS,
            "globalBatchSize": 32,
            "evalInterval": STEPS,
            "evalBatches": 8,
            "logInterval": 10,
        },
        "optimizer": {"lr": 0.004},
        "schedule": {"warmupSteps": 20},
        # Async saves at 50 and 100 (marked once written), a blocking final one at 150.
        "checkpoint": {"interval": 50, "dir": str(tmp_path / "ckpt"), "asyncSave": True},
        # Peak given so that MFU is reported on CPU too.
        "metrics": {"port": 0, "peakTflops": 1.0},
    }
    hold = Hold(tmp_path / "hold", 0)
    path = [str(HOLD_CODE), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {
        contract.TRAIN_CONFIG: json.dumps(config),
        "PYTHONPATH": ":".join(path),
        "E2E_HOLD_AT": f"step:{SCRAPE_AT_STEP}",
        "E2E_HOLD_DIR": str(hold.folder),
    }
    trainer = TrainerProcess([], env)
    try:
        port = trainer.wait_for(lambda e: e["event"] == "metrics", timeout=120)["port"]
        held = wait_for(f"the trainer held at step {SCRAPE_AT_STEP}", hold.held, timeout=240)
        assert held["step"] == SCRAPE_AT_STEP, held
        samples = scrape(port)
    finally:
        hold.release()

    for series in SERIES:
        assert any(name.split("{")[0] == series for name in samples), f"{series} missing"
    assert samples["torchfleet_train_step"] == SCRAPE_AT_STEP
    assert samples["torchfleet_train_total_steps"] == STEPS
    assert 0 < samples["torchfleet_train_loss"] < 4.5
    assert samples["torchfleet_train_step_seconds_count"] == SCRAPE_AT_STEP
    assert samples["torchfleet_checkpoint_save_seconds_count"] == 1
    assert samples["torchfleet_checkpoint_step"] == 50
    assert samples["torchfleet_train_mfu_ratio"] > 0

    assert trainer.finish(timeout=400) == 0, trainer.stderr[-3000:]
    complete = sorted(p.parent.name for p in (tmp_path / "ckpt").glob("step-*/COMPLETE"))
    assert complete == ["step-00000050", "step-00000100", "step-00000150"]
    assert not list((tmp_path / "ckpt").glob("*.partial"))
    (final_eval,) = trainer.of("eval")
    assert final_eval["step"] == STEPS
    assert final_eval["val_loss"] < VAL_LOSS_THRESHOLD, final_eval
