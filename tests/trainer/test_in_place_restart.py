"""A fixed gang restarts in place: every launcher restarts its workers, no launcher exits.

Three ``torchfleet-train`` launchers ("pods", one process each) with the
operator's environment and an in-place budget of 1 join a c10d rendezvous
hosted by node rank 0's launcher. One worker (the training process, not its
launcher) is SIGKILLed after a checkpoint: every launcher restarts its worker,
the world meets again at three in a new round and resumes from the last
checkpoint's step while all three launchers keep running; /metrics and rank
0's log say one in-place restart, because a worker was killed. Another pod's
worker is held meanwhile, so that its agent sees the new round before its own
worker fails: it must count the restart all the same. A second kill spends the
budget: the launchers exit, the killed one's with 137 (its worker's SIGKILL),
the others' with 202 (a lost peer).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.poll import wait_for
from tests.trainer import gang
from tests.trainer.cli_process import (
    TrainerProcess,
    children,
    free_port,
    pending_signals,
    worker_pid,
)
from tests.trainer.test_shakespeare_metrics import scrape
from torchfleet_trainer import contract
from torchfleet_trainer.launch import EXIT_COLLECTIVE_FAILED

pytestmark = pytest.mark.trainer

NODES = 3
INTERVAL = 4  # checkpoint every this many steps
CONFIG = gang.tiny_config(NODES, log_interval=1, checkpoints=True)
CONFIG["checkpoint"] |= {"interval": INTERVAL, "asyncSave": False}
CONFIG["metrics"] = {"port": 0}  # every pod's own free port
TIMEOUT = 120


def pod_env(rank: int, master_port: int, checkpoint_dir: Path) -> dict[str, str]:
    return gang.pod_env(
        "in-place",
        NODES,
        rank,
        master_port,
        CONFIG,
        checkpoint_dir=str(checkpoint_dir),
        in_place_restarts=1,
    )


def forkserver_pid(launcher: TrainerProcess) -> int:
    """The launcher's forkserver: its workers' parent, which reaps them and
    tells the agent their exit codes."""
    worker = worker_pid(launcher)
    return next(c for c in children(launcher.proc.pid) if worker in children(c))


def told_to_stop(pid: int) -> bool:
    """Whether the held process ``pid`` has a SIGTERM waiting, or is gone (a
    SIGKILL ends even a stopped process)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state == "Z" or signal.SIGTERM in pending_signals(pid)
    except FileNotFoundError:
        return True


class Pods:
    """The launchers' events, read in order across calls: rank 0 logs, and after a
    new round rank 0 may be on any pod."""

    def __init__(self, pods: list[TrainerProcess]) -> None:
        self.pods = pods
        self.read = [0] * len(pods)

    def wait_for(self, predicate: Any, timeout: float = TIMEOUT) -> dict[str, Any]:
        """The first event not yet read, of any pod, satisfying ``predicate``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for index, pod in enumerate(self.pods):
                pod.drain()
                while self.read[index] < len(pod.events):
                    event = pod.events[self.read[index]]
                    self.read[index] += 1
                    if predicate(event):
                        return event
            time.sleep(0.1)
        raise AssertionError(f"no matching event in {timeout}s")


def test_a_killed_worker_restarts_every_pods_workers_in_place(tmp_path: Path) -> None:
    port = free_port()
    # Each pod's termination message file, made empty as the kubelet makes one.
    messages = [tmp_path / f"termination-{rank}" for rank in range(NODES)]
    for message in messages:
        message.write_text("")
    pods = [
        TrainerProcess(
            [], pod_env(rank, port, tmp_path) | {contract.TERMINATION_MESSAGE_PATH_ENV: str(m)}
        )
        for rank, m in enumerate(messages)
    ]
    gang_events = Pods(pods)
    held_reaper: int | None = None
    try:
        saved = gang_events.wait_for(lambda e: e["event"] == "checkpoint")["step"]
        gang_events.wait_for(lambda e: e["event"] == "step" and e["step"] > saved)
        # Pod 2's worker is held, as a slow one is, so its agent sees pod 1's
        # agent waiting in the new round before it sees any failure of its own.
        held = worker_pid(pods[2])
        os.kill(held, signal.SIGSTOP)
        os.kill(worker_pid(pods[1]), signal.SIGKILL)
        killed = time.monotonic()
        wait_for(
            "pod 2's agent stopping its held worker for the new round",
            lambda: told_to_stop(held),
            timeout=TIMEOUT,
            interval=0.05,
        )
        with contextlib.suppress(ProcessLookupError):  # SIGKILLed, a lost peer's stop
            os.kill(held, signal.SIGCONT)

        restart = gang_events.wait_for(lambda e: e["event"] == "in_place_restart")
        # The killed worker's pod saw no report from it; the others lost a peer.
        assert restart == restart | {"restarts": 1, "reason": contract.RESTART_REASON_WORKER_KILLED}
        world = gang_events.wait_for(lambda e: e["event"] == "world")
        assert world["world_size"] == NODES
        resumed = gang_events.wait_for(lambda e: e["event"] == "resumed")
        metrics_port = gang_events.wait_for(lambda e: e["event"] == "metrics")["port"]
        samples = scrape(metrics_port)
        assert samples[contract.METRIC_IN_PLACE_RESTARTS] == 1
        reasons = {
            reason: samples[f'{contract.METRIC_IN_PLACE_RESTART_REASON}{{reason="{reason}"}}']
            for reason in contract.RESTART_REASONS
        }
        assert reasons == {
            contract.RESTART_REASON_PEER_LOST: 0,
            contract.RESTART_REASON_WORKER_FAILED: 0,
            contract.RESTART_REASON_WORKER_KILLED: 1,
        }
        assert resumed["step"] >= saved and resumed["step"] % INTERVAL == 0, (resumed, saved)
        # Every pod's last word says so too, should the job end before a scrape.
        reports = [contract.reported_in_place_restarts(json.loads(m.read_text())) for m in messages]
        assert reports == [(1, contract.RESTART_REASON_WORKER_KILLED)] * NODES
        gang_events.wait_for(lambda e: e["event"] == "step" and e["step"] > resumed["step"])
        print(f"in place: kill -> first step of the new round: {time.monotonic() - killed:.1f}s")
        assert [pod.proc.poll() for pod in pods] == [None] * NODES

        # Pod 2's forkserver is held, so that the worker's death reaches its
        # agent only after the others have exited and taken the rendezvous
        # store with them, as a loaded machine can have it: the agent must
        # still exit with its worker's code, not blame the store.
        victim = worker_pid(pods[2])
        reaper = forkserver_pid(pods[2])
        os.kill(reaper, signal.SIGSTOP)
        held_reaper = reaper
        os.kill(victim, signal.SIGKILL)
        codes = [pod.finish(timeout=TIMEOUT) for pod in pods[:2]]
        wait_for(
            "pod 2's agent finding the store gone while its worker's exit is held",
            lambda: "the rendezvous store is gone" in pods[2].stderr,
            timeout=TIMEOUT,
            interval=0.05,
        )
        os.kill(reaper, signal.SIGCONT)
        held_reaper = None
        codes.append(pods[2].finish(timeout=TIMEOUT))
    finally:
        if held_reaper is not None:
            os.kill(held_reaper, signal.SIGKILL)
        for pod in pods:
            if pod.proc.poll() is None:
                os.killpg(pod.proc.pid, signal.SIGKILL)
                pod.proc.wait()
    print(f"saved at {saved}, resumed at {resumed['step']}, launchers exited {codes}")
    # Each launcher exits with its own workers' failure: the killed one's SIGKILL,
    # the others' lost peer; both retryable under the operator's ExitCode policy.
    # Pod 2 too spent its budget on the first round, though its worker failed
    # last: had it kept a restart it would now rejoin a closed rendezvous and
    # exit 202 (lost_peer._count_a_peers_round).
    expected = [EXIT_COLLECTIVE_FAILED, EXIT_COLLECTIVE_FAILED, 128 + signal.SIGKILL]
    assert codes == expected, (codes, [p.stderr[-1500:] for p in pods])
    assert "counted as this pod's in-place restart" in pods[2].stderr, pods[2].stderr[-4000:]
    assert "rendezvous:" not in pods[2].stderr, pods[2].stderr[-4000:]
    # Failed pods' messages are their logs' tails (FallbackToLogsOnError), not the count.
    assert [m.read_text() for m in messages] == [""] * NODES
    # Each round kept its own logs.
    rounds = {p.name for p in (tmp_path / contract.LOGS_SUBDIR / "gen-0").iterdir()}
    assert rounds == {"round-0", "round-1"}, rounds
