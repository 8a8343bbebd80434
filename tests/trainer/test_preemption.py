"""SIGTERM to the launcher (what Kubernetes sends on preemption) saves and resumes.

The launcher starts two gloo ranks through PyTorch's elastic API, which
forwards the signal; the ranks agree to stop at the next step boundary, save a
complete checkpoint and exit at once (143), well inside the launcher's kill
timeout. A rerun under another layout (FSDP over 2 ranks -> TP over 2 ranks)
resumes from exactly that step and completes through the same launcher.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.trainer.cli_process import TrainerProcess, free_port
from tests.trainer.user_models import TINY_LLAMA
from torchfleet_contract import pod as contract
from torchfleet_trainer.checkpoint import MARKER, step_dir
from torchfleet_trainer.launcher.outcomes import EXIT_PREEMPTED_UNSAVED

pytestmark = pytest.mark.trainer

MODEL = [
    *TINY_LLAMA,
    "training.logInterval=1",
    "training.evalInterval=0",
    "schedule.warmupSteps=1",
    "checkpoint.interval=100000",
    "metrics.enabled=false",
]


def test_sigterm_saves_complete_checkpoint_and_resume_continues(tmp_path: Path) -> None:
    env = {
        contract.CHECKPOINT_DIR: str(tmp_path / "ckpt"),
        contract.MASTER_PORT: str(free_port()),
        contract.JOB_NAME: "preempt-test",
        contract.TERMINATION_MESSAGE_PATH_ENV: str(tmp_path / "termination-log"),
    }
    trainer = TrainerProcess(["--nproc-per-node", "2", "training.steps=100000", *MODEL], env)
    trainer.wait_for(lambda e: e["event"] == "step" and e["step"] >= 3, timeout=240)
    trainer.proc.terminate()  # SIGTERM, as the kubelet sends it
    assert trainer.finish(timeout=120) == 143, trainer.stderr[-3000:]
    # Workers left on their own after saving; none had to be killed.
    assert "forcefully exiting" not in trainer.stderr, trainer.stderr[-3000:]

    (preempted,) = trainer.of("preempted")
    stopped_at = preempted["step"]
    assert stopped_at >= 3
    assert preempted["saved"] is True
    assert (step_dir(tmp_path / "ckpt", stopped_at) / MARKER).is_file()
    assert [e["step"] for e in trainer.of("checkpoint")] == [stopped_at]
    # The operator learns that save from the termination message (rank 0 writes it).
    message = json.loads((tmp_path / "termination-log").read_text())
    assert message[contract.SAVED_CHECKPOINT_STEP] == stopped_at
    saved = datetime.fromisoformat(message[contract.SAVED_CHECKPOINT_TIME])
    assert abs((datetime.now(UTC) - saved).total_seconds()) < 120

    resumed = TrainerProcess(
        ["--nproc-per-node", "2", f"training.steps={stopped_at + 2}", "parallel.tensor=2", *MODEL],
        env | {contract.MASTER_PORT: str(free_port())},
    )
    assert resumed.finish(timeout=240) == 0, resumed.stderr[-3000:]
    assert [e["step"] for e in resumed.of("resumed")] == [stopped_at]
    assert [e["step"] for e in resumed.of("step")] == [stopped_at + 1, stopped_at + 2]


def test_sigterm_with_no_checkpoint_dir_says_so_and_never_waits_for_an_eval(
    tmp_path: Path,
) -> None:
    # Every step is due an evaluation; the step that sees the stop flag skips it.
    termination = tmp_path / "termination-log"
    env = {
        contract.MASTER_PORT: str(free_port()),
        contract.JOB_NAME: "unsaved-test",
        contract.TERMINATION_MESSAGE_PATH_ENV: str(termination),
    }
    args = ["--nproc-per-node", "2", "training.steps=100000", *MODEL]
    trainer = TrainerProcess([*args, "training.evalInterval=1", "training.evalBatches=2"], env)
    trainer.wait_for(lambda e: e["event"] == "eval" and e["step"] >= 3, timeout=240)
    trainer.proc.terminate()
    assert trainer.finish(timeout=120) == EXIT_PREEMPTED_UNSAVED, trainer.stderr[-3000:]
    (preempted,) = trainer.of("preempted")
    assert preempted["saved"] is False
    assert trainer.of("checkpoint") == []
    # Nothing saved, no message: the kubelet's log fallback stays free.
    assert not termination.exists()
    evaluated = [e["step"] for e in trainer.of("eval")]
    assert preempted["step"] not in evaluated and max(evaluated) < preempted["step"]
