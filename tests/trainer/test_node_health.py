"""A gang of three one-process "nodes", started with the environment the operator
gives pods (each its own node name): rank 0 runs the preflight and exports every
node's figures by name, then every node's compute time and straggler score, and
the phase it is in.

One node is really slow: its process runs in a cgroup whose CFS quota gives it a
tenth of a core (what the node agent does for a throttled node, and what a
kubelet does for a CPU limit), while the other two share a core. Busy processes
sharing a rank's core did not make it measurably slower here (the scheduler
gives a thread that sleeps between bursts most of its core); a quota does.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.fixtures.e2e import DEV  # noqa: F401  (puts dev/ on the path for nodeagent)
from tests.trainer import gang
from tests.trainer.cli_process import TrainerProcess, free_port
from tests.trainer.test_shakespeare_metrics import scrape
from torchfleet_contract import pod as contract

from nodeagent import cgroups, podspec  # isort: skip

pytestmark = pytest.mark.trainer

SLOW_MILLICPU = 100  # a tenth of a core: the slow node's CFS quota
THRESHOLD = 1.3  # runPolicy.stragglers.threshold's default: what the operator flags

NODES = 3
LOG_INTERVAL = 5
MIN_FRACTION = 0.8  # preflight.minMatmulFraction's default
CONFIG = {
    "model": {"architecture": "gpt", "layers": 2, "heads": 4, "dim": 128, "maxSeqLen": 64},
    "data": {"kind": "synthetic", "seqLen": 64},
    "parallel": {"dataParallelReplicate": 3, "dataParallelShard": 1},
    "training": {
        "steps": 100000,
        "globalBatchSize": 24,
        "evalInterval": 0,
        "logInterval": LOG_INTERVAL,
    },
    "checkpoint": {"enabled": False},
    "tensorboard": {"enabled": False},
    "metrics": {"port": 0},
    "preflight": {"enabled": True, "allreduceMebibytes": 4, "allreduceIterations": 3},
}


def node_name(rank: int) -> str:
    return f"node-{rank}"


def pod_env(rank: int, master_port: int) -> dict[str, str]:
    """What the operator sets on node ``rank``'s pod (one process per pod)."""
    env = gang.pod_env("health", NODES, rank, master_port, CONFIG)
    return env | {contract.NODE_NAME: node_name(rank)}


@pytest.fixture
def two_cores() -> tuple[int, int]:
    cores = sorted(os.sched_getaffinity(0))
    assert len(cores) >= 2, f"needs two cores to share out, has {cores}"
    return cores[0], cores[1]


@pytest.fixture
def slow_cgroup() -> Iterator[cgroups.ContainerCgroup]:
    """A cgroup with a CFS quota of SLOW_MILLICPU, for one rank to run in."""
    root = cgroups.CgroupRoot.discover(f"trainer-test-{os.getpid()}")
    if cgroups.CPU in root.unusable:
        pytest.fail(f"the cgroup v1 cpu controller is needed: {root.unusable[cgroups.CPU]}")
    group = root.node("slow").container("rank", "trainer", podspec.Limits(SLOW_MILLICPU))
    group.prepare(1.0)
    try:
        yield group
    finally:
        root.remove_all()


def node_series(samples: dict[str, float], metric: str) -> dict[str, float]:
    """``metric``'s samples by their node label."""
    found = {}
    for name, value in samples.items():
        if name.startswith(metric + "{"):
            labels = dict(
                pair.split("=", 1) for pair in name[len(metric) + 1 : -1].split(",") if pair
            )
            found[labels[contract.LABEL_NODE].strip('"')] = value
    return found


def test_rank_zero_names_the_slow_node_in_preflight_and_in_training(
    two_cores: tuple[int, int], slow_cgroup: cgroups.ContainerCgroup
) -> None:
    shared, other = two_cores
    port = free_port()
    slow = node_name(NODES - 1)  # alone on its core, but a tenth of it
    gang = [
        TrainerProcess(
            [],
            pod_env(rank, port),
            cpus={other if rank == NODES - 1 else shared},
            preexec=slow_cgroup.joiner() if rank == NODES - 1 else None,
        )
        for rank in range(NODES)
    ]
    try:
        # The preflight runs first; /metrics is served once the run has resumed.
        preflight = gang[0].wait_for(lambda e: e["event"] == "preflight", timeout=120)
        metrics_port = gang[0].wait_for(lambda e: e["event"] == "metrics", timeout=120)["port"]
        gang[0].wait_for(lambda e: e["event"] == "step" and e["step"] >= 2 * LOG_INTERVAL, 120)
        samples = scrape(metrics_port)
    finally:
        for node in gang:
            node.kill()

    names = {node_name(r) for r in range(NODES)}
    assert {n["node"] for n in preflight["nodes"]} == names, preflight
    assert preflight["allreduce_bus_gbps"] > 0, preflight
    flops = node_series(samples, contract.METRIC_PREFLIGHT_MATMUL_FLOPS)
    ratios = node_series(samples, contract.METRIC_PREFLIGHT_MATMUL_RATIO)
    passed = node_series(samples, contract.METRIC_PREFLIGHT_NODE_PASSED)
    assert set(flops) == set(ratios) == set(passed) == names, samples
    assert all(value > 0 for value in flops.values()), flops
    # Each node passed exactly when it reached the fraction of the median node:
    # the slow one did not, the two sharing a core did.
    assert passed == {n: float(r >= MIN_FRACTION) for n, r in ratios.items()}, (ratios, passed)
    assert passed == {n: float(n != slow) for n in names}, ratios
    assert samples[contract.METRIC_PREFLIGHT_PASSED] == float(all(passed.values()))
    assert samples[contract.METRIC_PREFLIGHT_BUS_BANDWIDTH] > 0

    scores = node_series(samples, contract.METRIC_NODE_STRAGGLER_SCORE)
    compute = node_series(samples, contract.METRIC_NODE_COMPUTE_SECONDS)
    assert set(scores) == set(compute) == {node_name(r) for r in range(NODES)}, samples
    assert all(seconds > 0 for seconds in compute.values()), compute
    # Scores are over the median node: with three nodes, one of them is the median.
    assert sorted(scores.values())[1] == 1.0, scores
    # The slow node is what the operator would flag, and only it.
    assert {n for n, score in scores.items() if score > THRESHOLD} == {slow}, scores
    phase = f'{contract.METRIC_PHASE}{{{contract.LABEL_PHASE}="{contract.PHASE_TRAIN}"}}'
    assert samples[phase] == 1
