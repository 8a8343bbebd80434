"""Node health decided from a scripted master's /metrics by a real operator:
straggler windows, threshold and action (Report, Replace), the preflight
condition, and a stalled step told apart from a checkpoint save.

The pods run on KWOK nodes of a loopback group (tests/fixtures/scripted_metrics.py):
the test serves what torchfleet-train's rank 0 would export, node by node, and
reads the job's status, events and pods. A log interval is a change of the
per-node figures; the same figures scraped again are the same interval.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.fixtures.scripted_metrics import GANG_WORKERS, scraped_again
from torchfleet_contract import pod as k
from torchfleet_operator.desired.names import pod_name_for_rank
from torchfleet_operator.status.conditions import find

pytestmark = pytest.mark.cluster


def exported(
    step: int,
    scores: dict[str, float] | None = None,
    window: int = 0,
    phase: str = k.PHASE_TRAIN,
    phase_started: float = 0.0,
    preflight: dict[str, float] | None = None,
) -> str:
    """Rank 0's /metrics: the step and its timing, the phase, and per node (named
    by host name, as the trainer does without TORCHFLEET_NODE_NAME) the compute
    seconds of log interval ``window`` with their scores, and preflight ratios."""
    lines = [
        f"{k.METRIC_STEP} {step}",
        f"{k.METRIC_TOTAL_STEPS} 1000",
        f"{k.METRIC_STEP_SECONDS}_sum {step * 0.1}",
        f"{k.METRIC_STEP_SECONDS}_count {step}",
        f"{k.METRIC_PHASE_STARTED} {phase_started}",
    ]
    lines += [f'{k.METRIC_PHASE}{{phase="{p}"}} {int(p == phase)}' for p in k.PHASES]
    for rank, (host, score) in enumerate((scores or {}).items()):
        labels = f'{k.LABEL_NODE_RANK}="{rank}",{k.LABEL_NODE}="{host}"'
        lines.append(f"{k.METRIC_NODE_COMPUTE_SECONDS}{{{labels}}} {0.1 * score + window * 1e-4}")
        lines.append(f"{k.METRIC_NODE_STRAGGLER_SCORE}{{{labels}}} {score}")
    for rank, (host, ratio) in enumerate((preflight or {}).items()):
        labels = f'{k.LABEL_NODE_RANK}="{rank}",{k.LABEL_NODE}="{host}"'
        lines.append(f"{k.METRIC_PREFLIGHT_MATMUL_RATIO}{{{labels}}} {ratio}")
        lines.append(f"{k.METRIC_PREFLIGHT_NODE_PASSED}{{{labels}}} {int(ratio >= 0.8)}")
    return "\n".join(lines) + "\n"


def hosts(job: str) -> list[str]:
    return [pod_name_for_rank(job, rank) for rank in range(GANG_WORKERS + 1)]


def health_of(job_driver, namespace: str, job: str) -> dict[str, Any]:
    return dict(job_driver.status(namespace, job).get("health") or {})


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return find(status.get("conditions"), type_) or {}


def test_a_slow_node_is_named_after_its_windows_and_replaced(job_driver, namespace, scripted_gang):
    server, nodes = scripted_gang(
        "slow", stragglers={"threshold": 1.3, "windows": 2, "action": "Replace"}
    )
    master, worker0, worker1 = hosts("slow")
    slow_node = nodes[worker1]

    # Interval 1: worker-1's node 1.8x the median, worker-0's 1.25x (under the threshold).
    server.body = exported(10, {master: 1.0, worker0: 1.25, worker1: 1.8}, window=1)
    shown = job_driver.wait_for(
        "interval 1 in status.health",
        lambda: len(n := health_of(job_driver, namespace, "slow").get("nodes") or []) == 3 and n,
    )
    by_node = {n["node"]: n for n in shown}
    # Figures are filed under the node the pod runs on, not the host name.
    assert set(by_node) == set(nodes.values())
    assert by_node[slow_node]["slowWindows"] == 1 and by_node[slow_node]["stragglerScore"] == 1.8
    assert by_node[nodes[worker0]]["slowWindows"] == 0
    # The same figures scraped again are the same interval: still one window.
    job_driver.wait_for("three more scrapes", scraped_again(server))
    status = job_driver.status(namespace, "slow")
    assert {n["node"]: n["slowWindows"] for n in status["health"]["nodes"]}[slow_node] == 1
    assert not condition(status, "Straggler") and status["restartCount"] == 0

    # Interval 2: slow again -> named, and the gang restarts away from it.
    server.body = exported(20, {master: 1.0, worker0: 1.0, worker1: 1.7}, window=2)
    status = job_driver.wait_for(
        "the Replace restart",
        lambda: (s := job_driver.status(namespace, "slow")).get("restartCount") == 1 and s,
    )
    straggler = condition(status, "Straggler")
    assert straggler["status"] == "True" and straggler["reason"] == "SlowNode"
    assert f"node {slow_node} computes 1.70x the median" in straggler["message"]
    assert "threshold 1.3 for 2 log intervals" in straggler["message"]
    assert status["health"]["avoidedNodes"] == [slow_node]
    # A disruption: the node's fault, not counted toward backoffLimit.
    assert status["disruptions"] == 1 and status["countedRestarts"] == 0
    assert condition(status, "Restarting")["reason"] == "SlowNode"
    job_driver.wait_events(namespace, "slow", {"SlowNode"}, type="Warning")

    # The next gang keeps off that node (there is room on the group's others).
    _, next_nodes = scripted_gang("slow", restart=1)
    assert slow_node not in next_nodes.values()
    pod = job_driver.get_core(namespace, "pods", worker1)
    assert pod is not None
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert {"key": "metadata.name", "operator": "NotIn", "values": [slow_node]} in terms[
        "nodeSelectorTerms"
    ][0]["matchFields"]


def test_report_preflight_and_a_stall_told_apart_from_a_save(
    job_driver, namespace, scripted_gang, scraping_operator
):
    server, nodes = scripted_gang(
        "watch",
        stragglers={"threshold": 1.5, "windows": 1, "action": "Report"},
        stall={"stepTimeMultiple": 2, "minSeconds": 6, "action": "Restart"},
    )
    master, worker0, worker1 = hosts("watch")

    # Preflight: worker-0's node at 0.4x the median fails; the others pass.
    server.body = exported(
        0, phase=k.PHASE_PREFLIGHT, preflight={master: 1.0, worker0: 0.4, worker1: 1.02}
    )
    status = job_driver.wait_for(
        "the Preflight condition",
        lambda: (s := job_driver.status(namespace, "watch")) and condition(s, "Preflight") and s,
    )
    preflight = condition(status, "Preflight")
    assert preflight["status"] == "False" and preflight["reason"] == "PreflightSlowNode"
    assert f"node {nodes[worker0]} reached 0.40x the median" in preflight["message"]
    job_driver.wait_events(namespace, "watch", {"PreflightSlowNode"}, type="Warning")

    # Report: a node over the threshold is named at once (windows 1), nothing restarts.
    server.body = exported(5, {master: 1.0, worker0: 1.0, worker1: 1.6}, window=1)
    status = job_driver.wait_for(
        "the Straggler condition",
        lambda: (
            (s := job_driver.status(namespace, "watch"))
            and condition(s, "Straggler").get("status") == "True"
            and s
        ),
    )
    assert nodes[worker1] in condition(status, "Straggler")["message"]
    assert status["restartCount"] == 0 and "avoidedNodes" not in status["health"]
    # The next interval is even again: the condition goes False and says so.
    server.body = exported(6, {master: 1.0, worker0: 1.0, worker1: 1.1}, window=2)
    status = job_driver.wait_for(
        "Straggler False",
        lambda: (
            (s := job_driver.status(namespace, "watch"))
            and condition(s, "Straggler").get("status") == "False"
            and s
        ),
    )
    assert condition(status, "Straggler")["reason"] == "NodesEven"

    # A checkpoint save: the step stands still past the limit, but the trainer says
    # it saves. A new save phase after the limit brings a pass that judges it.
    evened = job_driver.status(namespace, "watch")["health"]["stepSeen"]
    assert evened["step"] == 6
    even = {master: 1.0, worker0: 1.0, worker1: 1.1}
    server.body = exported(6, even, window=2, phase=k.PHASE_CHECKPOINT)
    saving_since = time.monotonic()
    job_driver.wait_for("the stall limit to pass", lambda: time.monotonic() - saving_since > 8)
    passes = scraping_operator.passes((namespace, "watch"))
    server.body = exported(6, even, window=2, phase=k.PHASE_CHECKPOINT, phase_started=1)
    job_driver.wait_for(
        "a pass on the new phase", lambda: scraping_operator.passes((namespace, "watch")) > passes
    )
    status = job_driver.status(namespace, "watch")
    assert not condition(status, "Stalled") and status["restartCount"] == 0
    assert status["health"]["stepSeen"] == evened  # the clock ran on through the save

    # Training again (the phase began now), and the step does not move: Stalled, restarted.
    server.body = exported(
        6, {master: 1.0, worker0: 1.0, worker1: 1.1}, window=2, phase_started=time.time()
    )
    status = job_driver.wait_for(
        "the Stalled restart",
        lambda: (s := job_driver.status(namespace, "watch")).get("restartCount") == 1 and s,
        timeout=30,
    )
    # The restart says why (the new gang's first pass clears Stalled again).
    restarting = condition(status, "Restarting")
    assert restarting["reason"] == "StepStalled", restarting
    assert "step 6 has not moved for" in restarting["message"]
    assert "at least runPolicy.stall.minSeconds 6s" in restarting["message"]
    # Counted toward backoffLimit: a hang may be the program's.
    assert status["countedRestarts"] == 1 and status.get("disruptions", 0) == 0
    job_driver.wait_events(namespace, "watch", {"StepStalled"}, type="Warning")


def test_a_failed_preflight_moves_the_gang_off_the_node_and_spends_a_replacement(
    job_driver, namespace, scripted_gang
):
    """Replace for a node that fails the preflight check: the gang restarts away
    from it, uncounted, and one of runPolicy.stragglers.maxReplacements is spent.
    (A spent budget is the next test's. Judging a second gang here is not
    deterministic: gang 1's master may land on gang 0's loopback node, at the
    address whose scripted /metrics still serves gang 0's preflight figures,
    and the operator judges those before the test can change them.)"""
    server, nodes = scripted_gang("pre", stragglers={"action": "Replace", "maxReplacements": 1})
    master, worker0, worker1 = hosts("pre")
    failed_node = nodes[worker0]

    server.body = exported(
        0, phase=k.PHASE_PREFLIGHT, preflight={master: 1.0, worker0: 0.4, worker1: 1.02}
    )
    status = job_driver.wait_for(
        "the preflight Replace restart",
        lambda: (s := job_driver.status(namespace, "pre")).get("restartCount") == 1 and s,
    )
    preflight = condition(status, "Preflight")
    assert preflight["status"] == "False" and preflight["reason"] == "PreflightSlowNode"
    assert f"node {failed_node} reached 0.40x the median" in preflight["message"]
    assert "the gang restarts away from it" in preflight["message"]
    assert condition(status, "Restarting")["reason"] == "PreflightSlowNode"
    # A disruption, not counted toward backoffLimit; one of maxReplacements spent.
    assert status["disruptions"] == 1 and status["countedRestarts"] == 0
    assert status["health"]["avoidedNodes"] == [failed_node]
    assert status["health"]["replacements"] == 1

    # The next gang keeps off the node.
    next_nodes = job_driver.wait_running_pods(namespace, "pre", 3, restart=1)
    assert failed_node not in {p["spec"]["nodeName"] for p in next_nodes}


def test_a_failed_preflight_past_max_replacements_is_only_reported(
    job_driver, namespace, scripted_gang
):
    """Once runPolicy.stragglers.maxReplacements is spent (0: spent from the
    start), Replace only reports: the Preflight condition names the node and says
    why nothing moved, and the same pass that decided it restarted nothing."""
    server, nodes = scripted_gang("spent", stragglers={"action": "Replace", "maxReplacements": 0})
    master, worker0, worker1 = hosts("spent")
    pods = {p["metadata"]["uid"] for p in job_driver.wait_running_pods(namespace, "spent", 3)}

    server.body = exported(
        0, phase=k.PHASE_PREFLIGHT, preflight={master: 1.0, worker0: 0.4, worker1: 1.02}
    )
    status = job_driver.wait_for(
        "the Preflight condition",
        lambda: (s := job_driver.status(namespace, "spent")) and condition(s, "Preflight") and s,
    )
    preflight = condition(status, "Preflight")
    assert preflight["status"] == "False", preflight
    assert preflight["reason"] == "MaxReplacementsReached", preflight
    assert f"node {nodes[worker0]} reached 0.40x the median" in preflight["message"]
    assert "only reported: runPolicy.stragglers.maxReplacements 0 spent" in preflight["message"]
    assert status["restartCount"] == 0 and status.get("disruptions", 0) == 0, status
    assert not status["health"].get("avoidedNodes"), status["health"]
    assert not status["health"].get("replacements"), status["health"]
    # Judged again on later scrapes, still nothing moves: the same pods run.
    job_driver.wait_for("three more scrapes", scraped_again(server))
    assert job_driver.status(namespace, "spent")["restartCount"] == 0
    assert {p["metadata"]["uid"] for p in job_driver.live_pods(namespace, "spent")} == pods
