"""An elastic job loses a node mid-run and keeps training on the survivors.

Four ``torchfleet-train`` launchers on localhost, each one node of one
process, join a c10d rendezvous (min 2, max 4) exactly as elastic pods do:
through torchrun's ``PET_*`` variables alone, with the launcher's own
rendezvous timeouts (the ones production runs with). FSDP2 shards over all ranks. At
step KILL_AT every worker is held (SIGSTOP), then one launcher and its
worker are SIGKILLed, as a lost node takes its agent and worker with it, and
the others released. The survivors' workers see the dead peer, their
agents re-rendezvous as three nodes and restart them; they resume from the
last complete checkpoint, saved at four ranks and resharded by DCP to three.

The global batch (12 sequences, 1 per rank per micro-step) is the same at
every size: 3 accumulation steps at four ranks, 4 at three. So the survivors'
per-step losses and gradient norms must match, within fp32's reduction-order
tolerances (test_strategies.py's), both a three-rank run resumed from a copy
of the same checkpoint and an uninterrupted four-rank run. The references
run as fixed gangs, one process per rank (the operator's one-process-per-pod
contract), beside the elastic job to keep the test short on two cores.

The elastic jobs of this file train until the test ends them (ENDLESS
steps): a fast machine would otherwise finish eight steps before a fault
injected "at step 5" lands. What a test checks is read from where the job
was when the fault landed, and the uninterrupted references run that far.

The seconds from the loss to the survivors' first completed step are printed
(``-s`` shows them); they are a measurement, never asserted.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.poll import wait_for
from tests.fixtures.trainer import cpu_description
from tests.trainer.cli_process import (
    TrainerProcess,
    free_port,
    parent_of,
    pending_signals,
    shared_pipes,
    stop_between_looks,
    worker_pid,
)
from tests.trainer.test_strategies import GRAD_NORM_REL_TOL, LOSS_TOL, base, learnable_tokens
from torchfleet_contract import pod as contract
from torchfleet_trainer.checkpoint import MARKER, step_dir
from torchfleet_trainer.launcher.outcomes import EXIT_PREEMPTED

pytestmark = pytest.mark.trainer

STEPS = 8  # the learning-rate schedule's decay, and the fixed gangs' length
KILL_AT = 5
AFTER = 3  # steps watched after a resume
# The elastic jobs' length: never reached, the test ends them.
ENDLESS = 100_000
NODES = 4
TIMEOUT = 240


def overrides(data: Path, ckpt: Path, steps: int = STEPS) -> list[str]:
    """test_strategies.py's model and data, with checkpoints and step logs, for
    ``steps`` steps (the schedule is the same whatever the length)."""
    return [
        *base(data),
        f"training.steps={steps}",
        # 12 = lcm(2, 3, 4): exact at every size from minNodes to maxNodes.
        "training.globalBatchSize=12",
        "training.microBatchSize=1",
        "training.logInterval=1",
        "training.evalInterval=0",
        f"schedule.decaySteps={STEPS}",
        "checkpoint.enabled=true",
        f"checkpoint.dir={ckpt}",
        "checkpoint.interval=2",
        "checkpoint.keepLast=10",
        "metrics.jsonLogs=true",
        "tensorboard.enabled=false",
    ]


def elastic_env(
    endpoint: str, run_id: str, hosts_store: bool, last_call: str = "", heartbeats: str = ""
) -> dict[str, str]:
    """What the operator puts on an elastic pod (one process per pod). On localhost
    every node matches the endpoint's host, so is_host says which one serves the
    rendezvous store (in a cluster, the master pod whose name it is). ``last_call``:
    seconds a round waits for nodes beyond the minimum, ``heartbeats``: how many
    missed heartbeats drop a node, where not the launcher's."""
    conf = f"is_host={int(hosts_store)}" + (f",last_call_timeout={last_call}" if last_call else "")
    conf += f",keep_alive_max_attempt={heartbeats}" if heartbeats else ""
    rendezvous = contract.ElasticRendezvous(
        min_nodes=2,
        max_nodes=NODES,
        endpoint=endpoint,
        run_id=run_id,
        max_restarts=3,
        conf=conf,
    )
    return rendezvous.to_env() | {contract.NPROC_PER_NODE: "1", contract.JOB_NAME: run_id}


def fixed_gang(args: list[str], nproc: int) -> list[TrainerProcess]:
    """An ordinary (not elastic) run of ``nproc`` ranks, one process each with its
    ranks in the environment, as the operator runs one process per pod."""
    port = str(free_port())
    env = {contract.WORLD_SIZE: str(nproc), contract.MASTER_ADDR: "127.0.0.1"}
    env[contract.MASTER_PORT] = port
    return [TrainerProcess(args, env | {contract.RANK: str(rank)}) for rank in range(nproc)]


def kill_node(pid: int, sig: signal.Signals = signal.SIGKILL) -> None:
    """SIGKILLs a launcher and every process under it at once, as a lost node's
    container dies: its agent starts each worker in a session of its own.
    (SIGSTOP instead: a node gone silent, whose connections are never reset.)"""
    tree, index = [pid], 0
    while index < len(tree):
        for task in Path(f"/proc/{tree[index]}/task").glob("*"):
            with contextlib.suppress(OSError):
                tree += [int(child) for child in (task / "children").read_text().split()]
        index += 1
    for member in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, sig)


def hold_workers(nodes: list[TrainerProcess]) -> dict[TrainerProcess, int]:
    """SIGSTOPs every node's worker (the world stands still); their pids."""
    held = {node: worker_pid(node) for node in nodes}
    for pid in held.values():
        os.kill(pid, signal.SIGSTOP)
    return held


def up_to(last: int, steps: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The steps up to ``last``: an endless job ends some steps after the test saw it."""
    return {step: record for step, record in steps.items() if step <= last}


def steps_of(events: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {e["step"]: e for e in events if e["event"] == "step"}


def restarts(events: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The events of each start of the workers, split at their 'world' events."""
    starts = [i for i, e in enumerate(events) if e["event"] == "world"]
    ends = [*starts[1:], len(events)]
    return [events[a:b] for a, b in zip(starts, ends[: len(starts)], strict=True)]


def first_to_log(
    nodes: list[TrainerProcess], step: int, world_size: int, timeout: float
) -> TrainerProcess:
    """The node whose worker is rank 0 (only it logs), once it has logged ``step`` in a
    world of ``world_size``."""

    def logger() -> TrainerProcess | None:
        for node in nodes:
            node.drain()
            for run in restarts(node.events)[-1:]:
                if run[0]["world_size"] == world_size and max(steps_of(run), default=0) >= step:
                    return node
            assert node.proc.poll() is None, node.stderr[-4000:]
        return None

    what = f"a node to log step {step} at world size {world_size}"
    return wait_for(what, logger, timeout=timeout, interval=0.05)


def assert_tracks(run: dict[int, dict[str, Any]], reference: dict[int, dict[str, Any]]) -> None:
    for step, record in run.items():
        expected = reference[step]
        assert abs(record["loss"] - expected["loss"]) <= LOSS_TOL, (
            step,
            record,
            expected,
            cpu_description(),
        )
        norm, expected_norm = record["grad_norm"], expected["grad_norm"]
        assert abs(norm / expected_norm - 1) <= GRAD_NORM_REL_TOL, (
            step,
            record,
            expected,
            cpu_description(),
        )


def test_losing_a_node_resumes_on_three_ranks_with_the_same_losses(tmp_path: Path) -> None:
    data = learnable_tokens(tmp_path / "tokens.bin")
    ckpt = tmp_path / "elastic"
    endpoint = f"127.0.0.1:{free_port()}"
    args = overrides(data, ckpt, ENDLESS)
    # A round waits up to 20 s (not the launcher's 5) for nodes beyond the
    # minimum: the four launchers start beside four more processes on two cores,
    # and workers forked warm can finish a smaller first round's few steps before
    # a late fourth launcher joins. (The survivors' round waits it out too.)
    env = [elastic_env(endpoint, "elastic", i == 0, last_call="20") for i in range(NODES)]
    nodes = [TrainerProcess(args, each) for each in env]
    processes = list(nodes)
    try:
        # Nodes that start late join in a later round (the agents restart to admit
        # them): the loss must hit the full four-rank world.
        logger = first_to_log(nodes, KILL_AT, world_size=NODES, timeout=TIMEOUT)
        # Neither the store's host nor the node whose worker logs as rank 0.
        victim = next(n for n in reversed(nodes[1:]) if n is not logger)
        # Held where the loss lands: the world of four stands where it was seen.
        held = hold_workers(nodes)
        lost_at = time.time()
        kill_node(victim.proc.pid)
        for node, pid in held.items():
            if node is not victim:
                os.kill(pid, signal.SIGCONT)

        world = logger.wait_for(lambda e: e["event"] == "world", timeout=TIMEOUT)
        resumed = logger.wait_for(lambda e: e["event"] == "resumed", timeout=TIMEOUT)
        first = logger.wait_for(lambda e: e["event"] == "step", timeout=TIMEOUT)
        saved = resumed["step"]
        last = saved + AFTER
        resume_dir = tmp_path / "three"
        shutil.copytree(step_dir(ckpt, saved), step_dir(resume_dir, saved))
        logger.wait_for(lambda e: e["event"] == "step" and e["step"] >= last, timeout=TIMEOUT)
        for node in nodes:
            kill_node(node.proc.pid)
        # (a) three ranks resumed from a copy of the same checkpoint; (b) four
        # ranks throughout; both as far as the survivors were watched.
        three = fixed_gang(overrides(data, resume_dir, last), 3)
        four = fixed_gang(overrides(data, tmp_path / "four", last), 4)
        processes += three + four
        for process in three + four:
            assert process.finish(timeout=TIMEOUT) == 0, process.stderr[-4000:]
    finally:
        for process in processes:
            kill_node(process.proc.pid)
    print(f"\nelastic: node lost -> first step on 3 ranks: {first['time'] - lost_at:.1f}s")

    assert (world["world_size"], world["grad_accum_steps"]) == (3, 4)
    assert (step_dir(ckpt, saved) / MARKER).is_file()
    assert saved >= KILL_AT - 2, resumed
    continuing = up_to(last, steps_of(logger.events[logger.events.index(resumed) :]))
    assert sorted(continuing) == list(range(saved + 1, last + 1))
    assert [e["step"] for e in three[0].of("resumed")] == [saved]

    assert_tracks(continuing, steps_of(three[0].events))
    # Every step the job ran, at whatever size and in every restart, matches the
    # four-rank run's.
    for run in restarts(logger.events):
        assert_tracks(up_to(last, steps_of(run)), steps_of(four[0].events))


def test_a_node_leaving_gracefully_saves_where_it_is_and_the_rest_go_on_at_two(
    tmp_path: Path,
) -> None:
    """What a scale-down (or a drained node) does: the leaving pod's launcher gets
    SIGTERM. Its worker's signal reaches every rank at the next step boundary, so
    the whole world saves that step and stops; the leaving launcher exits 143
    (saved), the others' agents form a smaller world that resumes at exactly
    that step, not at the last periodic checkpoint, and trains on. Three nodes
    (two after), to spare the two cores a fourth launcher."""
    data = learnable_tokens(tmp_path / "tokens.bin")
    endpoint = f"127.0.0.1:{free_port()}"
    args = [*overrides(data, tmp_path / "elastic", ENDLESS), "checkpoint.interval=100"]
    nodes = [TrainerProcess(args, elastic_env(endpoint, "leave", i == 0)) for i in range(3)]
    try:
        logger = first_to_log(nodes, KILL_AT, world_size=3, timeout=TIMEOUT)
        leaving = next(n for n in reversed(nodes[1:]) if n is not logger)
        leaving.proc.send_signal(signal.SIGTERM)

        preempted = logger.wait_for(lambda e: e["event"] == "preempted", timeout=TIMEOUT)
        world = logger.wait_for(lambda e: e["event"] == "world", timeout=TIMEOUT)
        resumed = logger.wait_for(lambda e: e["event"] == "resumed", timeout=TIMEOUT)
        assert leaving.finish(timeout=TIMEOUT) == EXIT_PREEMPTED, leaving.stderr[-4000:]
        last = resumed["step"] + AFTER
        logger.wait_for(lambda e: e["event"] == "step" and e["step"] >= last, timeout=TIMEOUT)
    finally:
        for node in nodes:
            kill_node(node.proc.pid)

    assert preempted["saved"] and preempted["step"] >= KILL_AT, preempted
    assert (world["world_size"], world["grad_accum_steps"]) == (2, 6)
    # No periodic checkpoint in reach (interval 100): only the save on SIGTERM.
    assert resumed["step"] == preempted["step"], (resumed, preempted)
    continuing = up_to(last, steps_of(logger.events[logger.events.index(resumed) :]))
    assert sorted(continuing) == list(range(preempted["step"] + 1, last + 1))


def test_a_node_joining_restarts_the_others_without_counting_a_failure(tmp_path: Path) -> None:
    """What a replacement pod or a scale-up does, with the race that once counted
    it as a failure (CI, 2026-11-27). When node C joins, node A's agent stops its
    worker for the new round, the whole world saves and stops, and node B's
    worker exits 143 with it. B's agent is held (SIGSTOP) meanwhile, so it sees
    its worker's exit before it sees C waiting, as a busy agent can: it must
    start the new round without spending one of its restarts (lost_peer.py),
    so no launcher reports an in-place restart, and the three train on together."""
    data = learnable_tokens(tmp_path / "tokens.bin")
    endpoint = f"127.0.0.1:{free_port()}"
    args = overrides(data, tmp_path / "elastic", ENDLESS)
    # B's agent is held past torch's heartbeat expiry (3 x 2 s): with it, B would
    # be dropped as a lost node, another path (test_lost_peer.py).
    env = [elastic_env(endpoint, "join", i == 0, heartbeats="60") for i in range(3)]
    nodes = [TrainerProcess(args, env[i]) for i in range(2)]
    held = nodes[1]  # nodes[0] hosts the rendezvous store, so it is never held
    try:
        first_to_log(nodes, 1, world_size=2, timeout=TIMEOUT)
        workers = [worker_pid(node) for node in nodes]
        forkserver = parent_of(workers[1])
        with_b_worker = shared_pipes(forkserver, held.proc.pid)
        for pid in workers:  # held while the joiner comes
            os.kill(pid, signal.SIGSTOP)
        # B's agent, not its worker; between two looks at it, so that its next
        # look sees the exit before the rendezvous (stopped after a look that
        # found the worker healthy, it would ask the rendezvous next: CI,
        # 2026-11-29, where it then restarted the round as torch does).
        stop_between_looks(held.proc.pid)
        nodes.append(TrainerProcess(args, env[2]))
        wait_for(
            "A's agent stopping its worker for the joiner",
            lambda: signal.SIGTERM in pending_signals(workers[0]),
            timeout=TIMEOUT,
            interval=0.05,
        )
        for pid in workers:
            os.kill(pid, signal.SIGCONT)
        # Reaped by its forkserver, which then writes its exit code to the agent:
        # the agent is let go once it is there to read, not once the worker is
        # gone (the forkserver can be descheduled in between on a loaded machine).
        wait_for(
            "B's worker's exit code handed to B's agent",
            lambda: shared_pipes(forkserver, held.proc.pid) < with_b_worker,
            timeout=TIMEOUT,
            interval=0.05,
            explain=lambda: (
                f"B's worker {'lives' if Path(f'/proc/{workers[1]}').exists() else 'is gone'}"
            ),
        )
        os.kill(held.proc.pid, signal.SIGCONT)
        # The three train on together.
        logger = first_to_log(nodes, 1, world_size=3, timeout=TIMEOUT)
        logger.wait_for(lambda e: e["event"] == "step", timeout=TIMEOUT)
        assert [node.proc.poll() for node in nodes] == [None] * 3
    finally:
        for node in nodes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(node.proc.pid, signal.SIGCONT)
            kill_node(node.proc.pid)

    events = [event for node in nodes for event in node.events]
    assert [e for e in events if e["event"] == "in_place_restart"] == []
    worlds = [e["world_size"] for e in events if e["event"] == "world"]
    assert worlds[0] == 2 and worlds[-1] == 3, worlds
    assert "stopped by a membership change" in held.stderr, held.stderr[-4000:]
