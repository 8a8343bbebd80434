"""A permanent exit is never retried in place: the run policy decides, as for a gang.

One launcher (a one-node gang) with an in-place budget of 1, whose worker
diverges (exit 3, tests/trainer/nan_model.py) in every round. Under
restartPolicy ExitCode, 3 is the program's own permanent error: the launcher
exits 3 after the first round, without restarting. With no policy set
(OnFailure, torchrun's behaviour) the same failure is retried once in place
and the launcher exits 3 after the second round. Each round keeps its log
folder, which is how the rounds are counted here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fixtures.trainer import REPO_ROOT
from tests.trainer import gang, nan_model
from tests.trainer.cli_process import TrainerProcess, free_port
from tests.trainer.test_non_finite import CONFIG
from torchfleet_contract import pod as contract
from torchfleet_trainer.launcher.outcomes import EXIT_DIVERGED

pytestmark = pytest.mark.trainer


def diverging_launcher(tmp_path: Path, policy: dict[str, str]) -> TrainerProcess:
    env = gang.pod_env(
        "policy", 1, 0, free_port(), {}, checkpoint_dir=str(tmp_path), in_place_restarts=1
    )
    del env[contract.TRAIN_CONFIG]  # the config comes from the arguments
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env |= {nan_model.NAN_STEPS: "1,2,3", "PYTHONPATH": path} | policy
    return TrainerProcess([*CONFIG, "training.steps=20"], env)


def rounds(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / contract.LOGS_SUBDIR / "gen-0").iterdir())


def test_a_permanent_exit_stops_the_launcher_without_an_in_place_restart(
    tmp_path: Path,
) -> None:
    launcher = diverging_launcher(tmp_path, {contract.RESTART_POLICY: "ExitCode"})
    assert launcher.finish(timeout=120) == EXIT_DIVERGED, launcher.stderr[-3000:]
    assert "exit code 3 is permanent under restartPolicy ExitCode" in launcher.stderr
    assert rounds(tmp_path) == ["round-0"]


def test_a_retryable_exit_is_restarted_in_place_until_the_budget_is_spent(
    tmp_path: Path,
) -> None:
    launcher = diverging_launcher(tmp_path, {})
    assert launcher.finish(timeout=120) == EXIT_DIVERGED, launcher.stderr[-3000:]
    assert rounds(tmp_path) == ["round-0", "round-1"]
