"""The launcher's exit code when a child dies: the shell's 128 + signal.

Real child processes under PyTorch's elastic agent (the code path of N
processes per pod). The operator's ``restartPolicy: ExitCode`` reads this
code: 137 (an OOM kill) must stay a retryable signal, not become exit 1.
"""

from __future__ import annotations

import pytest
from torch.distributed.launcher.api import LaunchConfig

from tests.trainer.cli_process import free_port
from torchfleet_trainer.launcher.launch import child_failure_exit_code, run_children
from torchfleet_trainer.launcher.outcomes import (
    EXIT_PREEMPTED,
    EXIT_PREEMPTED_UNSAVED,
    preempted_exit_code,
    write_outcome,
)

pytestmark = pytest.mark.trainer


def config(nproc: int) -> LaunchConfig:
    return LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id="exit-codes",
        rdzv_backend="static",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        rdzv_configs={"rank": 0},
        max_restarts=0,
        start_method="spawn",
    )


# Rank 0 kills itself with SIGKILL at once; rank 1 exits 1 a moment later (as
# its peers do when a rank disappears).
SIGKILL_THEN_EXIT_1 = (
    "import os, signal, time\n"
    "if os.environ['LOCAL_RANK'] == '0':\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
    "time.sleep(2)\n"
    "raise SystemExit(1)\n"
)


def test_a_child_killed_by_sigkill_makes_the_pod_exit_137() -> None:
    assert run_children(config(2), "-c", SIGKILL_THEN_EXIT_1) == 137


def test_a_child_exiting_3_makes_the_pod_exit_3() -> None:
    assert run_children(config(1), "-c", "raise SystemExit(3)") == 3


def test_143_only_when_every_child_stopped_on_sigterm() -> None:
    assert child_failure_exit_code([143, 143], first=143) == EXIT_PREEMPTED
    assert child_failure_exit_code([-15, 1], first=1) == 1
    assert child_failure_exit_code([-9, 1], first=-9) == 137


def test_a_signalled_launcher_exits_143_only_when_every_worker_saved(tmp_path) -> None:
    assert preempted_exit_code(None, workers=1) == EXIT_PREEMPTED_UNSAVED
    assert preempted_exit_code(tmp_path, workers=2) == EXIT_PREEMPTED_UNSAVED
    write_outcome(tmp_path, 0, EXIT_PREEMPTED)
    # The other worker died before it could save (or report).
    assert preempted_exit_code(tmp_path, workers=2) == EXIT_PREEMPTED_UNSAVED
    write_outcome(tmp_path, 1, EXIT_PREEMPTED)
    assert preempted_exit_code(tmp_path, workers=2) == EXIT_PREEMPTED
    write_outcome(tmp_path, 1, EXIT_PREEMPTED_UNSAVED)
    assert preempted_exit_code(tmp_path, workers=2) == EXIT_PREEMPTED_UNSAVED
