"""Every rank's output outlives its gang, on the checkpoint volume.

A gang of three one-process "nodes" (the operator's environment, generation
4, keeping 2 generations) with older generations' logs already on the volume.
Rank 0 is killed with SIGKILL mid-run, as an OOM kill does: every line its pod
printed is in its file, its peers' files end with why they stopped, and only
the newest two generations are left. The per-file cap keeps the tail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer import gang
from tests.trainer.cli_process import TrainerProcess, free_port
from torchfleet_contract import pod as contract
from torchfleet_trainer.launcher.logtee import keep_logs, log_path
from torchfleet_trainer.launcher.outcomes import EXIT_COLLECTIVE_FAILED

pytestmark = pytest.mark.trainer

NODES = 3
GENERATION = 4
KEEP = 2
CONFIG = gang.tiny_config(NODES, log_interval=1, checkpoints=True)


def pod_env(rank: int, master_port: int, checkpoint_dir: Path) -> dict[str, str]:
    env = gang.pod_env(
        "logs",
        NODES,
        rank,
        master_port,
        CONFIG,
        restart_count=GENERATION,
        checkpoint_dir=str(checkpoint_dir),
    )
    return env | {contract.LOG_KEEP_GENERATIONS: str(KEEP)}


def test_a_killed_ranks_last_lines_are_in_its_file_and_old_generations_go(
    tmp_path: Path,
) -> None:
    logs = tmp_path / contract.LOGS_SUBDIR
    for old in (1, 2, 3):
        log_path(tmp_path, old, 0, 0).parent.mkdir(parents=True)
        log_path(tmp_path, old, 0, 0).write_text("an older gang's log\n")
    port = free_port()
    nodes = [TrainerProcess([], pod_env(rank, port, tmp_path)) for rank in range(NODES)]
    try:
        nodes[0].wait_for(lambda e: e["event"] == "step" and e["step"] >= 3, timeout=120)
        os.kill(nodes[0].proc.pid, signal.SIGKILL)
        assert nodes[0].finish(timeout=30) == -signal.SIGKILL
        codes = [node.finish(timeout=60) for node in nodes[1:]]
    finally:
        for node in nodes:
            node.kill()

    assert codes == [EXIT_COLLECTIVE_FAILED] * 2, [n.stderr[-2000:] for n in nodes[1:]]
    killed = log_path(tmp_path, GENERATION, 0, 0).read_text()
    assert killed.startswith(f"=== torchfleet-train rank 0, generation {GENERATION}, round 0")
    kept = [json.loads(line) for line in killed.splitlines() if line.startswith("{")]
    # Everything the pod's stdout showed, in order, up to the last step before the kill.
    assert kept[: len(nodes[0].events)] == nodes[0].events
    assert nodes[0].events[-1]["event"] == "step"
    for rank in (1, 2):
        peer = log_path(tmp_path, GENERATION, 0, rank).read_text()
        # stderr is kept too, and the pod's own stderr still got it.
        assert f"rank {rank}/{NODES}: a collective failed" in peer, peer[-2000:]
        assert f"rank {rank}/{NODES}: a collective failed" in nodes[rank].stderr
    assert sorted(p.name for p in logs.iterdir()) == ["gen-3", f"gen-{GENERATION}"]


def copy_through_copier(path: Path, data: bytes, cap: int = 1024) -> bytes:
    """Runs the copier on ``data`` (as a rank's stdout) into ``path``; what it
    passed on to its own stdout (the pod's log)."""
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    args = [str(path), str(cap), str(out_read), str(err_read), "=== header"]
    copier = subprocess.Popen(
        [sys.executable, "-m", "torchfleet_trainer.launcher.logtee", *args],
        pass_fds=(out_read, err_read),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    os.close(out_read)
    os.close(err_read)
    os.write(out_write, data)
    os.close(out_write)
    os.close(err_write)
    printed, _ = copier.communicate(timeout=30)
    assert copier.returncode == 0
    return printed


LINES = b"".join(b"line %04d\n" % i for i in range(500))  # 5000 bytes


def test_a_file_past_its_cap_keeps_the_tail(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    assert copy_through_copier(path, LINES) == LINES  # the tee's other side is untouched
    newest, previous = path.read_bytes(), path.with_name("rank-0.log.1").read_bytes()
    assert len(newest) <= 1024 and len(previous) == 1024
    assert (previous + newest).endswith(b"line 0499\n")
    assert LINES.endswith(newest)


def test_a_volume_that_cannot_be_written_still_lets_the_pods_log_through(
    tmp_path: Path,
) -> None:
    assert copy_through_copier(tmp_path / "absent" / "rank-0.log", LINES) == LINES
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    settings = contract.RecoverySettings()
    assert keep_logs(str(not_a_folder), 0, settings) is None  # training goes on without
