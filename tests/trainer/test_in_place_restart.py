"""A fixed gang restarts in place: every launcher restarts its workers, no launcher exits.

Three ``torchfleet-train`` launchers ("pods", one process each) with the
operator's environment and an in-place budget of 1 join a c10d rendezvous
hosted by node rank 0's launcher. After a checkpoint every worker is held
(SIGSTOP) and the last complete checkpoint read; then rank 0's worker (the
training process, not its launcher) is SIGKILLed: every launcher restarts its
worker, the world meets again at three in a new round and resumes from exactly
that checkpoint's step while all three launchers keep running; /metrics and
rank 0's log say one in-place restart, because a worker was killed. Another
pod's worker stays held meanwhile, so that its agent sees the new round before
its own worker fails: it must count the restart all the same. A second kill
spends the budget: the launchers exit, the killed one's with 137 (its
worker's SIGKILL), the others' with 202 (a lost peer).

With the operator's default budget (a default spec's, 2) two kills are
absorbed in place and the third ends the launchers with exits the run policy
retries, so the operator restarts the gang. A stale rank of the first round,
started with that round's store address once the second round runs, is
refused (the round's store went with its rank 0) and the new round goes on.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.poll import wait_for
from tests.fixtures.trainer import trainer_env
from tests.trainer import gang
from tests.trainer.cli_process import (
    TrainerProcess,
    children,
    free_port,
    pending_signals,
    worker_pid,
)
from tests.trainer.test_shakespeare_metrics import scrape
from torchfleet_contract import pod as contract
from torchfleet_contract.pod import ExitCodePolicy
from torchfleet_operator.api.v1alpha1 import TrainingJobSpec
from torchfleet_operator.desired.env import exit_code_policy
from torchfleet_trainer.checkpoint import latest_complete
from torchfleet_trainer.launcher import procname
from torchfleet_trainer.launcher.outcomes import EXIT_COLLECTIVE_FAILED

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


def rank_of_worker(launcher: TrainerProcess) -> int:
    rank = procname.rank_of(worker_pid(launcher))
    assert rank is not None, f"launcher {launcher.proc.pid}'s worker has exited"
    return rank


def said_by_launcher(launcher: TrainerProcess) -> list[str]:
    """The launcher's own lines (not torch's tracebacks), for failure messages."""
    return [line for line in launcher.stderr.splitlines() if "torchfleet-train" in line]


def told_to_stop(pid: int) -> bool:
    """Whether the held process ``pid`` has a SIGTERM waiting, or is gone (a
    SIGKILL ends even a stopped process)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state == "Z" or signal.SIGTERM in pending_signals(pid)
    except (FileNotFoundError, ProcessLookupError):
        # Gone, or going between the two reads (its /proc entry then answers ESRCH).
        return True


class Pods:
    """The launchers' events, read in order across calls: rank 0 logs, and after a
    new round rank 0 may be on any pod."""

    def __init__(self, pods: list[TrainerProcess]) -> None:
        self.pods = pods
        self.read = [0] * len(pods)

    def wait_for(self, predicate: Any, timeout: float = TIMEOUT) -> dict[str, Any]:
        """The first event not yet read, of any pod, satisfying ``predicate``."""

        def next_match() -> dict[str, Any] | None:
            for index, pod in enumerate(self.pods):
                pod.drain()
                while self.read[index] < len(pod.events):
                    event = pod.events[self.read[index]]
                    self.read[index] += 1
                    if predicate(event):
                        return event
            return None

        return dict(wait_for("a matching event", next_match, timeout=timeout, interval=0.1))


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
        # Two saves before the fault: the last one is then not also the first.
        gang_events.wait_for(lambda e: e["event"] == "checkpoint")
        saved = gang_events.wait_for(lambda e: e["event"] == "checkpoint")["step"]
        gang_events.wait_for(lambda e: e["event"] == "step" and e["step"] > saved)
        # The whole gang is held where the fault lands: no save can complete
        # after the last one read here. Rank 0 (which marks saves complete) is
        # the one killed, so none it had under way completes later either.
        workers = {rank_of_worker(pod): pod for pod in pods}
        for pod in pods:
            os.kill(worker_pid(pod), signal.SIGSTOP)
        last_saved = latest_complete(tmp_path)
        assert last_saved is not None and last_saved[0] >= saved, (last_saved, saved)
        killed_pod = workers[0]
        # Another pod's worker stays held, as a slow one is, so its agent sees
        # the killed one's agent waiting in the new round before it sees any
        # failure of its own; the third goes on into the failed collective.
        # Not pod 0's: its launcher hosts the rendezvous store, which the held
        # pod must see go below.
        held_pod = pods[2] if killed_pod is not pods[2] else pods[1]
        (running,) = (pod for pod in pods if pod not in (killed_pod, held_pod))
        held = worker_pid(held_pod)
        os.kill(worker_pid(killed_pod), signal.SIGKILL)
        killed = time.monotonic()
        os.kill(worker_pid(running), signal.SIGCONT)
        wait_for(
            "the held worker's agent stopping it for the new round",
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
        # From the last checkpoint saved before the fault, not merely a recent one.
        assert resumed["step"] == last_saved[0], (resumed, last_saved, saved)
        # Every pod's last word says so too, should the job end before a scrape.
        reports = [contract.reported_in_place_restarts(json.loads(m.read_text())) for m in messages]
        assert reports == [(1, contract.RESTART_REASON_WORKER_KILLED)] * NODES
        gang_events.wait_for(lambda e: e["event"] == "step" and e["step"] > resumed["step"])
        print(f"in place: kill -> first step of the new round: {time.monotonic() - killed:.1f}s")
        assert [pod.proc.poll() for pod in pods] == [None] * NODES

        # The held pod's forkserver is held now, so that the worker's death
        # reaches its agent only after the others have exited and taken the
        # rendezvous store with them, as a loaded machine can have it: the
        # agent must still exit with its worker's code, not blame the store.
        last = pods.index(held_pod)
        victim = worker_pid(held_pod)
        reaper = forkserver_pid(held_pod)
        os.kill(reaper, signal.SIGSTOP)
        held_reaper = reaper
        os.kill(victim, signal.SIGKILL)
        # Released as soon as the agent says so, not after the others' exits
        # have been collected (their stderr closes only once their forkservers
        # are gone): the agent looks for its workers' exit for a few seconds.
        wait_for(
            "the held pod's agent finding the store gone while its worker's exit is held",
            lambda: "the rendezvous store is gone" in held_pod.stderr,
            timeout=TIMEOUT,
            interval=0.05,
        )
        os.kill(reaper, signal.SIGCONT)
        held_reaper = None
        others = [pod for pod in pods if pod is not held_pod]
        codes = {pods.index(pod): pod.finish(timeout=TIMEOUT) for pod in others}
        codes[last] = held_pod.finish(timeout=TIMEOUT)
    finally:
        if held_reaper is not None:
            os.kill(held_reaper, signal.SIGKILL)
        for pod in pods:
            pod.kill()
    print(f"saved at {saved}, resumed at {resumed['step']}, launchers exited {codes}")
    # Each launcher exits with its own workers' failure: the killed one's SIGKILL,
    # the others' lost peer; both retryable under the operator's ExitCode policy.
    # The held pod too spent its budget on the first round, though its worker failed
    # last: had it kept a restart it would now rejoin a closed rendezvous and
    # exit 202 (lost_peer._count_a_peers_round).
    expected = [EXIT_COLLECTIVE_FAILED] * NODES
    expected[last] = 128 + signal.SIGKILL
    said = [said_by_launcher(pod) for pod in pods]
    assert "counted as this pod's in-place restart" in held_pod.stderr, said
    assert "rendezvous:" not in held_pod.stderr, said
    assert [codes[i] for i in range(NODES)] == expected, (codes, said)
    # The master's message: rank 0's figures, the count, and the last lines its
    # rank kept in the failed round (the kubelet gives its own tail only for an
    # empty message). The others' are emptied, for the kubelet's tail.
    master = json.loads(messages[0].read_text())
    assert contract.reported_in_place_restarts(master) == (1, contract.RESTART_REASON_WORKER_KILLED)
    assert master[contract.REPORTED_STEP] >= resumed["step"], master
    kept = Path(contract.kept_log_file(str(tmp_path), 0, 1, 0)).read_text()
    assert kept.rstrip().endswith(master[contract.REPORTED_LOG_TAIL].splitlines()[-1]), master
    assert [m.read_text() for m in messages[1:]] == [""] * (NODES - 1)
    # Each round kept its own logs.
    rounds = {p.name for p in (tmp_path / contract.LOGS_SUBDIR / "gen-0").iterdir()}
    assert rounds == {"round-0", "round-1"}, rounds


def start_pair(tmp_path: Path, budget: int, extra: dict[str, str]) -> list[TrainerProcess]:
    """Two launchers (pods) of a fixed gang with an in-place budget of ``budget``."""
    port = free_port()
    return [
        TrainerProcess(
            [],
            gang.pod_env(
                "pair",
                2,
                rank,
                port,
                CONFIG_PAIR,
                checkpoint_dir=str(tmp_path),
                in_place_restarts=budget,
            )
            | extra,
        )
        for rank in range(2)
    ]


CONFIG_PAIR = gang.tiny_config(2, log_interval=1, checkpoints=True)
CONFIG_PAIR["checkpoint"] |= {"interval": INTERVAL, "asyncSave": False}


def stop_all(pods: list[TrainerProcess]) -> None:
    for pod in pods:
        pod.kill()


def kill_a_worker_of_the_running_round(gang_events: Pods, pod: TrainerProcess) -> None:
    """SIGKILLs ``pod``'s worker once the round runs (a step past its resume): the
    job never ends on its own (tiny_config's 100,000 steps), so nothing races it."""
    gang_events.wait_for(lambda e: e["event"] == "step")
    os.kill(worker_pid(pod), signal.SIGKILL)


def test_the_default_budget_absorbs_two_failures_and_the_third_restarts_the_gang(
    tmp_path: Path,
) -> None:
    spec = TrainingJobSpec()  # what a job that says nothing about it gets
    budget = spec.in_place_restarts
    assert budget == 2
    pods = start_pair(tmp_path, budget, exit_code_policy(spec))
    gang_events = Pods(pods)
    try:
        for restart in range(1, budget + 1):
            kill_a_worker_of_the_running_round(gang_events, pods[1])
            event = gang_events.wait_for(lambda e: e["event"] == "in_place_restart")
            assert event == event | {"restarts": restart}, event
            assert gang_events.wait_for(lambda e: e["event"] == "world")["world_size"] == 2
            assert [pod.proc.poll() for pod in pods] == [None, None]
        kill_a_worker_of_the_running_round(gang_events, pods[1])
        codes = [pod.finish(timeout=TIMEOUT) for pod in pods]
    finally:
        stop_all(pods)
    # The budget is spent: each launcher exits with its workers' failure, the
    # killed one's SIGKILL and the other's lost peer.
    assert codes == [EXIT_COLLECTIVE_FAILED, 128 + signal.SIGKILL], (
        codes,
        [p.stderr[-1500:] for p in pods],
    )
    # Failures the operator's run policy retries: it restarts the gang.
    policy = ExitCodePolicy.from_env(exit_code_policy(spec))
    assert all(policy.retries(code) for code in codes), (policy, codes)
    rounds = {p.name for p in (tmp_path / contract.LOGS_SUBDIR / "gen-0").iterdir()}
    assert rounds == {f"round-{n}" for n in range(budget + 1)}, rounds


# A rank of an old round that comes back: the worker's env of that round, then
# a process group with the store address it was given.
STALE_RANK = (
    "import sys\n"
    "from datetime import timedelta\n"
    "import torch.distributed as dist\n"
    "try:\n"
    "    dist.init_process_group('gloo', timeout=timedelta(seconds=float(sys.argv[1])))\n"
    "except Exception as err:\n"
    "    print('refused:', type(err).__name__, flush=True)\n"
    "else:\n"
    "    print('joined', flush=True)\n"
)


def round_store_ports(launcher_log: str) -> dict[int, int]:
    """Each round's worker store port, as torch's agent logs it at INFO."""
    rounds = re.findall(r"restart_count=(\d+)\s.*?master_port=(\d+)", launcher_log, re.S)
    return {int(round_): int(port) for round_, port in rounds}


def test_a_stale_rank_of_an_old_round_cannot_join_the_new_one(tmp_path: Path) -> None:
    pods = start_pair(tmp_path, 1, {"LOGLEVEL": "INFO"})
    gang_events = Pods(pods)
    try:
        kill_a_worker_of_the_running_round(gang_events, pods[1])
        gang_events.wait_for(lambda e: e["event"] == "in_place_restart")
        before = gang_events.wait_for(lambda e: e["event"] == "step")["step"]
        ports = round_store_ports(pods[0].stderr)
        assert set(ports) == {0, 1} and ports[0] != ports[1], ports
        env = trainer_env() | {
            contract.MASTER_ADDR: "127.0.0.1",
            contract.MASTER_PORT: str(ports[0]),
            contract.RANK: "1",
            contract.WORLD_SIZE: "2",
            contract.TORCHELASTIC_RESTART_COUNT: "0",
        }
        stale = subprocess.run(
            [sys.executable, "-c", STALE_RANK, "5"],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        # The new round goes on at two, with no failure counted for the visitor.
        after = gang_events.wait_for(lambda e: e["event"] == "step" and e["step"] > before)
        assert [pod.proc.poll() for pod in pods] == [None, None]
    finally:
        stop_all(pods)
    assert stale.stdout.startswith("refused:"), (stale.stdout, stale.stderr[-2000:])
    events = [e for pod in pods for e in pod.events]
    assert [e["restarts"] for e in events if e["event"] == "in_place_restart"] == [1]
    assert [e["world_size"] for e in events if e["event"] == "world"][-1] == 2
    print(f"stale rank {stale.stdout.strip()}; the round stepped {before} -> {after['step']}")
