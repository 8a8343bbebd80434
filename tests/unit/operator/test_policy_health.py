"""policy/health.py and status/node_health.py: windows, threshold, actions, the
stall clock and the avoided nodes' affinity. One row per case."""

from __future__ import annotations

from typing import Any

import pytest

from torchfleet_contract import pod as k
from torchfleet_operator.api import constants as c
from torchfleet_operator.desired.pods import build_pod
from torchfleet_operator.observed import GangHealth, NodeFigures
from torchfleet_operator.policy import health
from torchfleet_operator.reconcile import plan
from torchfleet_operator.status.conditions import find
from torchfleet_operator.status.node_health import health_from_samples

from .builders import (
    CONFIG,
    a_pass,
    at,
    gang,
    job,
    observed,
    running_status,
    spec_of,
    stamp,
    status_of,
)

NODES = ("node-a", "node-b", "node-c")


def pods(restart: int = 0) -> list[Any]:
    return [
        p.__class__(**{**p.__dict__, "node_name": NODES[p.node_rank]})
        for p in gang("llm", 3, restart)
    ]


def scrape(scores: tuple[float, ...], window: int = 1, **fields: Any) -> GangHealth:
    nodes = tuple(
        NodeFigures(f"llm-{'master-0' if r == 0 else f'worker-{r - 1}'}", r, 0.1 * s + window, s)
        for r, s in enumerate(scores)
    )
    return GangHealth(nodes, fields.get("phase", k.PHASE_TRAIN), None, fields.get("mean"))


def judged(
    health_now: GangHealth, status: dict[str, Any] | None = None, now: float = 10, **policy: Any
) -> tuple[Any, list[Any]]:
    progress = {"step": 5, "updateTime": stamp(now)}
    seen = observed(*pods(), health=health_now, progress=progress)
    step = a_pass(
        seen,
        running_status(progress=progress, **(status or {})),
        now=now,
        runPolicy=policy,
    )
    return step, health.judge(step, spec_of(runPolicy=policy), pods())


@pytest.mark.parametrize(
    ("scores", "slow_before", "same_window", "expected"),
    [
        ((1.0, 1.0, 1.31), 0, False, 1),  # over the threshold: one window
        ((1.0, 1.0, 1.3), 2, False, 0),  # at the threshold is not over: reset
        ((1.0, 1.0, 1.8), 1, True, 1),  # the same figures again: not a new window
        ((1.0, 1.0, 1.8), 2, False, 3),
    ],
)
def test_windows_count_log_intervals_over_the_threshold(scores, slow_before, same_window, expected):
    now = scrape(scores)
    before = None
    if slow_before:
        nodes = [
            {
                "node": NODES[f.node_rank or 0],
                "computeSeconds": round(f.compute_seconds or 0, 6)
                if same_window
                else 9.0,  # another interval's figures
                "slowWindows": slow_before if f.node_rank == 2 else 0,
            }
            for f in now.nodes
        ]
        before = {"health": {"gang": 0, "nodes": nodes}}
    step, _ = judged(now, before, stragglers={"windows": 5})
    assert status_of(step)["health"]["nodes"][2]["slowWindows"] == expected


@pytest.mark.parametrize(
    ("action", "restarts"),
    [("Report", False), ("Replace", True)],
)
def test_the_action_decides_whether_the_gang_leaves_the_node(action, restarts):
    step, found = judged(scrape((1.0, 2.0, 1.0)), stragglers={"windows": 1, "action": action})
    straggler = find(status_of(step)["conditions"], "Straggler")
    assert (
        straggler
        and straggler["status"] == "True"
        and "node node-b computes 2.00x" in (straggler["message"])
    )
    assert bool(found) is restarts
    if restarts:
        assert found[0].disruption and found[0].pod == "llm-worker-0"
        assert status_of(step)["health"]["avoidedNodes"] == ["node-b"]


def preflight(ratios: tuple[float, ...]) -> GangHealth:
    """A new gang's preflight figures: a node under 0.8x the median fails."""
    nodes = tuple(
        NodeFigures(
            f"llm-{'master-0' if r == 0 else f'worker-{r - 1}'}", r, None, None, x, x >= 0.8
        )
        for r, x in enumerate(ratios)
    )
    return GangHealth(nodes, k.PHASE_PREFLIGHT)


SLOW_NODE_B = {"straggler": scrape((1.0, 2.0, 1.0)), "preflight": preflight((1.0, 0.4, 1.0))}
CONDITION = {"straggler": ("Straggler", "True"), "preflight": ("Preflight", "False")}
REPLACE_REASON = {"straggler": "SlowNode", "preflight": "PreflightSlowNode"}


@pytest.mark.parametrize("finding", ["straggler", "preflight"])
@pytest.mark.parametrize(
    ("max_replacements", "before", "replaced"),
    [
        (None, 0, True),  # the default budget, 3
        (None, 2, True),  # the last of it
        (None, 3, False),  # spent: only reported
        (1, 0, True),
        (1, 1, False),
        (0, 0, False),  # 0: Replace only reports
    ],
)
def test_replace_spends_max_replacements_then_only_reports(
    finding, max_replacements, before, replaced
):
    policy: dict[str, Any] = {"windows": 1, "action": "Replace"}
    if max_replacements is not None:
        policy["maxReplacements"] = max_replacements
    record = {"gang": 0, "replacements": before} if before else {"gang": 0}
    step, found = judged(SLOW_NODE_B[finding], {"health": record}, stragglers=policy)
    type_, bad = CONDITION[finding]
    shown = find(status_of(step)["conditions"], type_)
    assert shown and shown["status"] == bad and "node node-b" in shown["message"]
    health_now = status_of(step)["health"]
    if replaced:
        assert found and found[0].disruption and found[0].reason == REPLACE_REASON[finding]
        assert shown["reason"] == REPLACE_REASON[finding]
        assert "the gang restarts away from it" in shown["message"]
        assert health_now["replacements"] == before + 1
        assert health_now["avoidedNodes"] == ["node-b"]
    else:
        limit = 3 if max_replacements is None else max_replacements
        assert not found
        assert shown["reason"] == "MaxReplacementsReached"
        assert (
            f"only reported: runPolicy.stragglers.maxReplacements {limit} spent"
            in (shown["message"])
        )
        assert health_now.get("replacements", 0) == before and "avoidedNodes" not in health_now
        assert [e.reason for e in step.plan.events] == ["MaxReplacementsReached"]


def test_a_straggler_and_a_failed_preflight_together_are_one_replacement():
    both = GangHealth(
        tuple(
            NodeFigures(f.node, f.node_rank, f.compute_seconds, f.straggler_score, x, x >= 0.8)
            for f, x in zip(scrape((1.0, 2.0, 1.0)).nodes, (1.0, 1.0, 0.4), strict=True)
        ),
        k.PHASE_TRAIN,
    )
    step, found = judged(both, stragglers={"windows": 1, "action": "Replace"})
    assert len(found) == 1 and status_of(step)["health"]["replacements"] == 1
    assert status_of(step)["health"]["avoidedNodes"] == ["node-b", "node-c"]


def test_the_replacements_carry_over_to_the_next_gang():
    status = {
        "restartCount": 1,
        "health": {"gang": 0, "avoidedNodes": ["node-x"], "replacements": 2},
    }
    step = a_pass(observed(*pods(1)), running_status(1, **status))
    health.judge(step, spec_of(), pods(1))
    assert status_of(step)["health"] == {"gang": 1, "avoidedNodes": ["node-x"], "replacements": 2}


def test_avoided_nodes_keep_the_newest_within_the_limit():
    old = [f"old-{i}" for i in range(c.MAX_AVOIDED_NODES)]
    step, _ = judged(
        scrape((1.0, 2.0, 1.0)),
        {"health": {"gang": 0, "avoidedNodes": old}},
        stragglers={"windows": 1, "action": "Replace"},
    )
    avoided = status_of(step)["health"]["avoidedNodes"]
    assert len(avoided) == c.MAX_AVOIDED_NODES and avoided[-1] == "node-b"
    assert "old-0" not in avoided


@pytest.mark.parametrize(
    ("phase", "mean", "stood", "stalled"),
    [
        (k.PHASE_TRAIN, None, 299, False),  # under minSeconds
        (k.PHASE_TRAIN, None, 301, True),
        (k.PHASE_TRAIN, 30.0, 301, False),  # 20 x 30 s = 600 s is the limit
        (k.PHASE_TRAIN, 30.0, 601, True),
        (k.PHASE_CHECKPOINT, None, 10_000, False),  # a save is no hang
        (k.PHASE_EVAL, None, 10_000, False),
        (None, None, 301, True),  # a script that exports no phase: the step alone
    ],
)
def test_a_step_that_stands_still_while_training_is_stalled(phase, mean, stood, stalled):
    status = {"health": {"gang": 0, "stepSeen": {"step": 5, "since": stamp(0)}}}
    step, found = judged(scrape((1.0, 1.0, 1.0), phase=phase, mean=mean), status, now=stood)
    condition = find(status_of(step).get("conditions"), "Stalled")
    assert (condition is not None and condition["status"] == "True") is stalled
    assert not found  # Report
    if not stalled and phase == k.PHASE_TRAIN:
        assert step.plan.requeue_after is not None  # comes back when the limit is due


def test_restart_on_stall_counts_against_the_program():
    status = {"health": {"gang": 0, "stepSeen": {"step": 5, "since": stamp(0)}}}
    _, found = judged(scrape((1.0, 1.0, 1.0)), status, now=400, stall={"action": "Restart"})
    assert found and not found[0].disruption and found[0].reason == "StepStalled"


def test_a_new_gang_starts_its_own_figures_but_keeps_the_avoided_nodes():
    status = {
        "restartCount": 1,
        "health": {"gang": 0, "avoidedNodes": ["node-x"], "nodes": [{"node": "node-a"}]},
    }
    step = a_pass(observed(*pods(1)), running_status(1, **status))
    health.judge(step, spec_of(), pods(1))
    assert status_of(step)["health"] == {"gang": 1, "avoidedNodes": ["node-x"]}


def test_a_job_that_reports_nothing_gets_no_health_status():
    step = a_pass(observed(*pods()), running_status())
    health.judge(step, spec_of(), pods())
    assert "health" not in status_of(step)


@pytest.mark.parametrize(
    "template_affinity",
    [
        None,
        {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                    ]
                }
            }
        },
    ],
)
def test_avoided_nodes_are_anded_into_every_node_selector_term(template_affinity):
    template = {"spec": {"affinity": template_affinity}} if template_affinity else {}
    spec = spec_of(master={"template": template})
    pod = build_pod("llm", "team", "uid", spec, 0, 1, "img", avoid_nodes=["b", "a"])
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert len(terms) == (2 if template_affinity else 1)
    avoid = {"key": "metadata.name", "operator": "NotIn", "values": ["a", "b"]}
    assert all(avoid in term["matchFields"] for term in terms)
    if template_affinity:  # the template's own requirements stay, one per term
        assert [t["matchExpressions"][0]["values"] for t in terms] == [["a"], ["b"]]


@pytest.mark.parametrize(
    ("samples", "nodes"),
    [
        ([(k.METRIC_NODE_STRAGGLER_SCORE, {"node": "n", "node_rank": "0"}, float("nan"))], 0),
        ([(k.METRIC_NODE_STRAGGLER_SCORE, {"node": "n"}, -1.0)], 0),
        ([(k.METRIC_NODE_STRAGGLER_SCORE, {"node": "x" * 254}, 1.0)], 0),
        ([(k.METRIC_NODE_STRAGGLER_SCORE, {"node": "n", "node_rank": "1e9"}, 1.0)], 1),
        (
            [(k.METRIC_NODE_STRAGGLER_SCORE, {"node": f"n{i}"}, 1.0) for i in range(5000)],
            c.MAX_WORKERS + 1,
        ),
    ],
)
def test_hostile_node_samples_are_dropped_or_capped(samples, nodes):
    found = health_from_samples(samples, None, None)
    assert len(found.nodes if found else ()) == nodes
    if found and found.nodes:
        assert found.nodes[0].node_rank is None  # a rank that is no small integer is dropped


def test_pods_sharing_a_node_are_as_slow_as_the_slowest():
    shared = [p.__class__(**{**p.__dict__, "node_name": "node-a"}) for p in pods()]
    progress = {"step": 5, "updateTime": stamp(10)}
    seen = observed(*shared, health=scrape((1.0, 2.0, 1.0)), progress=progress)
    step = a_pass(seen, running_status(progress=progress), now=10)
    health.judge(step, spec_of(), shared)
    (node,) = status_of(step)["health"]["nodes"]
    assert node["node"] == "node-a" and node["stragglerScore"] == 2.0


def test_a_failed_preflight_collective_names_the_nodes_of_the_pods_that_said_so():
    failed = pods()
    failed[1] = failed[1].__class__(
        **{**failed[1].__dict__, "phase": "Failed", "exit_code": k.EXIT_PREFLIGHT_FAILED}
    )
    seen = observed(*failed)
    decided = plan(job(status=running_status()), seen, at(10), CONFIG)
    preflight = find(decided.status["conditions"], "Preflight")
    assert preflight and preflight["status"] == "False"
    assert preflight["reason"] == "PreflightCollectiveFailed"
    assert "llm-worker-0 (node node-b)" in preflight["message"]
    assert decided.status["restartCount"] == 1  # retried as any failure is


@pytest.mark.parametrize("phase", [k.PHASE_EVAL, k.PHASE_CHECKPOINT])
def test_a_long_evaluation_or_save_is_no_stall_even_under_restart(phase):
    """stall.action Restart ends the gang on a stall: a step that stands still for
    hours while rank 0 exports eval or checkpoint must not count as one."""
    status = {"health": {"gang": 0, "stepSeen": {"step": 5, "since": stamp(0)}}}
    step, found = judged(
        scrape((1.0, 1.0, 1.0), phase=phase), status, now=10_000, stall={"action": "Restart"}
    )
    stalled = find(status_of(step).get("conditions"), "Stalled")
    assert found == [], found
    assert stalled is None or stalled["status"] != "True", stalled
