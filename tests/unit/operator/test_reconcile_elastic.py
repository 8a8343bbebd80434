"""plan for elastic jobs (spec.elastic): a lost worker is replaced alone, the
master's loss restarts the gang, the job runs from minNodes, maxRestarts bounds
the replacements. One table row per situation."""

from __future__ import annotations

import dataclasses

import pytest

from torchfleet_operator.observed import ObservedPod
from torchfleet_operator.reconcile import plan
from torchfleet_operator.status.conditions import find

from .builders import (
    CONFIG,
    at,
    created_names,
    deleted_names,
    gang,
    job,
    observed,
    pod,
    running_status,
)

MASTER, W0, W1, W2 = "llm-master-0", "llm-worker-0", "llm-worker-1", "llm-worker-2"


def elastic_job(min_nodes: int = 2, max_restarts: int = 3, **spec: object) -> dict:
    """A 1 + 3 job, elastic between ``min_nodes`` and 4 nodes."""
    elastic = {"minNodes": min_nodes, "maxNodes": 4, "maxRestarts": max_restarts}
    return job(workers=3, elastic=elastic, **spec)


def failed(rank: int, **fields: object) -> ObservedPod:
    return pod("llm", rank, phase="Failed", **{"exit_code": 1, **fields})  # type: ignore[arg-type]


def four(**overrides: ObservedPod) -> tuple[ObservedPod, ...]:
    return gang(nodes=4, **overrides)


LOST_ON_NODE = pod("llm", 2, node_name="node-lost")


@pytest.mark.parametrize(
    ("lost", "seen", "counted", "reason"),
    [
        # The program failed on one worker: counted toward maxRestarts.
        ("exit 1", four(**{W1: failed(2)}), 1, "PodFailed"),
        # The platform took it: replaced, not counted (as with backoffLimit).
        ("evicted", four(**{W1: failed(2, disrupted=True, reason="Evicted")}), 0, "Evicted"),
        ("node lost", four(**{W1: LOST_ON_NODE}), 0, "NodeLost"),
        (
            "deleted by someone",
            four(**{W1: dataclasses.replace(pod("llm", 2), deleting=True)}),
            0,
            "PodDeleted",
        ),
    ],
)
def test_only_the_lost_worker_is_replaced_and_the_gang_keeps_running(lost, seen, counted, reason):
    seen_with_node = dataclasses.replace(
        observed(*seen), nodes_not_ready={"node-lost": at(0)} if lost == "node lost" else {}
    )
    p = plan(elastic_job(), seen_with_node, at(60), CONFIG, status=running_status())
    # Only that worker goes (one already terminating is not deleted twice) ...
    assert deleted_names(p) == ([] if lost == "deleted by someone" else [W1])
    # ... and no gang restart: same generation, still Running.
    assert p.gang_restart is None and p.status["restartCount"] == 0
    assert p.status["phase"] == "Running"
    assert p.status["elastic"]["replacements"] == 1
    assert p.status["elastic"]["countedReplacements"] == counted
    assert [e.reason for e in p.events] == ["WorkerReplaced"]
    assert p.worker_replacements == [reason]  # the operator's counter, by reason
    assert "disruptions" not in p.status  # the gang was not stopped


def test_a_replaced_worker_is_counted_once_and_recreated_with_its_own_name():
    first = plan(elastic_job(), observed(*four(**{W1: failed(2)})), at(1), CONFIG, running_status())
    # Next pass: it is terminating; then gone; the gang meanwhile runs on, 3 of 4.
    terminating = dataclasses.replace(failed(2), deleting=True)
    second = plan(elastic_job(), observed(*four(**{W1: terminating})), at(2), CONFIG, first.status)
    assert second.create == [] and second.status["phase"] == "Running"
    without = [p for p in four() if p.name != W1]
    third = plan(elastic_job(), observed(*without), at(3), CONFIG, second.status)
    assert sorted(created_names(third)) == [W1]
    recreated = next(m for m in third.create if m["metadata"]["name"] == W1)
    assert recreated["metadata"]["labels"]["torchfleet.dev/restart"] == "0"  # same generation
    for later in (second, third):
        assert later.status["elastic"]["replacements"] == 1 and later.events == []
        assert later.worker_replacements == []  # counted in the first pass only
        assert later.status["restartCount"] == 0
    assert third.status["nodesReady"] == "3/4"
    # The replacement runs: nothing is being replaced any more, 4 of 4 again.
    replacement = dataclasses.replace(pod("llm", 2), uid="llm-2-replacement")
    fourth = plan(elastic_job(), observed(*four(**{W1: replacement})), at(4), CONFIG, third.status)
    assert fourth.status["elastic"] == {
        "currentNodes": 4,
        "desiredNodes": 4,
        "replacements": 1,
        "countedReplacements": 1,
    }
    assert fourth.status["nodesReady"] == "4/4"


def test_a_replacement_that_fails_again_is_counted_again():
    first = plan(elastic_job(), observed(*four(**{W1: failed(2)})), at(1), CONFIG, running_status())
    again = dataclasses.replace(failed(2), uid="llm-2-second")
    second = plan(elastic_job(), observed(*four(**{W1: again})), at(9), CONFIG, first.status)
    assert deleted_names(second) == [W1]
    assert second.status["elastic"]["countedReplacements"] == 2


@pytest.mark.parametrize(
    ("seen", "reason"),
    [
        (four(**{MASTER: failed(0)}), "PodFailed"),
        (four(**{MASTER: failed(0), W0: failed(1)}), "PodFailed"),
        (four(**{MASTER: dataclasses.replace(pod("llm", 0), deleting=True)}), "PodDeleted"),
    ],
)
def test_losing_the_master_restarts_the_gang(seen, reason):
    p = plan(elastic_job(), observed(*seen), at(60), CONFIG, status=running_status())
    assert p.gang_restart == reason and p.status["restartCount"] == 1
    assert p.status["phase"] == "Restarting"
    assert deleted_names(p) == sorted(x.name for x in seen if not x.deleting)


def test_a_worker_failing_permanently_fails_the_job_as_in_a_fixed_gang():
    spec = {"runPolicy": {"restartPolicy": "ExitCode"}}
    p = plan(
        elastic_job(**spec), observed(*four(**{W2: failed(3)})), at(1), CONFIG, running_status()
    )
    assert p.status["phase"] == "Failed"
    assert find(p.status["conditions"], "Failed")["reason"] == "PodFailedPermanently"


@pytest.mark.parametrize(
    ("max_restarts", "counted_before", "phase"),
    [(3, 2, "Running"), (3, 3, "Failed"), (0, 0, "Failed")],
)
def test_max_restarts_bounds_the_counted_replacements(max_restarts, counted_before, phase):
    shown = {"replacements": counted_before, "countedReplacements": counted_before}
    status = running_status(elastic=shown)
    p = plan(
        elastic_job(max_restarts=max_restarts),
        observed(*four(**{W0: failed(1)})),
        at(1),
        CONFIG,
        status,
    )
    assert p.status["phase"] == phase
    if phase == "Failed":
        failed_condition = find(p.status["conditions"], "Failed")
        assert failed_condition["reason"] == "ElasticRestartsExceeded"
        assert f"maxRestarts {max_restarts}" in failed_condition["message"]
        assert (
            f"({counted_before} worker replacements counted before)"
            in (failed_condition["message"])
        )
        assert W0 in failed_condition["message"]
        # It holds nothing any more: every pod goes, whatever cleanPodPolicy says.
        assert deleted_names(p) == [MASTER, W0, W1, W2]


@pytest.mark.parametrize(
    ("running", "min_nodes", "phase"),
    [
        # minNodes pods run, the master among them: it trains.
        ((0, 1), 2, "Running"),
        ((0, 1, 2), 3, "Running"),
        # Fewer than minNodes, or no master (it holds the rendezvous): it waits.
        ((0,), 2, "Pending"),
        ((1, 2, 3), 2, "Pending"),
        ((0, 1), 3, "Pending"),
    ],
)
def test_an_elastic_job_runs_from_min_nodes_with_its_master(running, min_nodes, phase):
    pods = [pod("llm", r, phase="Running" if r in running else "Pending") for r in range(4)]
    p = plan(elastic_job(min_nodes=min_nodes), observed(*pods), at(1), CONFIG, status={})
    assert p.status["phase"] == phase
    assert p.status["nodesReady"] == f"{len(running)}/4"
    assert p.status["elastic"]["currentNodes"] == len(running)
    assert p.status["elastic"]["desiredNodes"] == 4


def test_a_fixed_gang_still_restarts_whole_on_a_worker_failure():
    p = plan(job(workers=3), observed(*four(**{W1: failed(2)})), at(1), CONFIG, running_status())
    assert p.gang_restart == "PodFailed" and p.status["restartCount"] == 1
    assert "elastic" not in p.status


def test_a_replaced_worker_on_a_lost_node_is_force_deleted_after_the_grace():
    stuck = dataclasses.replace(LOST_ON_NODE, deleting=True)
    status = running_status(elastic={"replacements": 1, "replacing": {W1: stuck.uid}})
    seen = dataclasses.replace(observed(*four(**{W1: stuck})), nodes_not_ready={"node-lost": at(0)})
    grace = CONFIG.node_loss_force_delete_seconds
    early = plan(elastic_job(), seen, at(grace - 5), CONFIG, status)
    assert early.delete == [] and early.status["phase"] == "Running"
    assert early.requeue_after is not None and early.requeue_after <= 5
    late = plan(elastic_job(), seen, at(grace + 1), CONFIG, status)
    assert [(r.name, r.grace_period_seconds) for r in late.delete] == [(W1, 0)]
    assert late.status["elastic"]["replacements"] == 1  # the same loss, not counted again
    assert late.worker_replacements == []


def test_two_workers_lost_at_once_are_both_replaced():
    seen = observed(*four(**{W0: failed(1), W2: failed(3, disrupted=True, reason="Evicted")}))
    p = plan(elastic_job(), seen, at(1), CONFIG, running_status())
    assert deleted_names(p) == [W0, W2] and p.gang_restart is None
    assert p.status["phase"] == "Running"  # master + 1 worker: minNodes 2
    elastic = p.status["elastic"]
    assert (elastic["replacements"], elastic["countedReplacements"]) == (2, 1)
    assert sorted(elastic["replacing"]) == [W0, W2]
    assert p.worker_replacements == ["PodFailed", "Evicted"]


def test_shrinking_below_min_nodes_says_so_and_waits_without_a_restart():
    seen = observed(*four(**{W0: failed(1), W1: failed(2)}))
    running = plan(elastic_job(min_nodes=3), observed(*four()), at(0), CONFIG, status={})
    p = plan(elastic_job(min_nodes=3), seen, at(1), CONFIG, running.status)
    assert p.gang_restart is None and p.status["restartCount"] == 0
    assert p.status["phase"] == "Pending"
    condition = find(p.status["conditions"], "Running")
    assert condition["status"] == "False" and condition["reason"] == "BelowMinNodes"
    # The replacements run: it trains again, same gang.
    back = (
        dataclasses.replace(pod("llm", 1), uid="new-1"),
        dataclasses.replace(pod("llm", 2), uid="new-2"),
    )
    again = plan(
        elastic_job(min_nodes=3),
        observed(*four(**{W0: back[0], W1: back[1]})),
        at(5),
        CONFIG,
        p.status,
    )
    assert again.status["phase"] == "Running" and again.status["restartCount"] == 0
    assert find(again.status["conditions"], "Running")["status"] == "True"


# ---- resizing: worker.replicas changed while the job runs ----------------------------


def sized(workers: int) -> dict:
    """The 1 + 3 elastic job (2 to 4 nodes) with ``workers`` workers asked for."""
    resized = elastic_job()
    resized["spec"]["worker"]["replicas"] = workers
    return resized


def test_fewer_workers_leave_gracefully_and_the_rest_keep_running():
    status = running_status(elastic={"desiredNodes": 4, "replacements": 0})
    p = plan(sized(1), observed(*four()), at(1), CONFIG, status)
    # The two workers past the new size go, with their grace period (their
    # trainers save); nobody is replaced and the gang is kept.
    assert [(r.name, r.grace_period_seconds) for r in p.delete] == [(W1, None), (W2, None)]
    assert p.create == [] and p.gang_restart is None and p.worker_replacements == []
    assert p.status["phase"] == "Running" and p.status["restartCount"] == 0
    assert p.status["elastic"]["desiredNodes"] == 2
    assert p.status["elastic"]["replacements"] == 0
    assert p.status["nodesReady"] == "2/2"
    (event,) = [e for e in p.events if e.reason == "ScaledDown"]
    assert W1 in event.message and W2 in event.message
    # While they terminate the job runs on: no wait, no second delete, no event.
    leaving = [dataclasses.replace(p_, deleting=True) for p_ in four()[2:]]
    later = plan(sized(1), observed(*four()[:2], *leaving), at(2), CONFIG, p.status)
    assert later.delete == [] and later.create == [] and later.events == []
    assert later.status["phase"] == "Running"


def test_more_workers_are_created_in_the_running_gang_and_not_counted_as_lost():
    two = gang(nodes=2)
    status = running_status(elastic={"desiredNodes": 2, "replacements": 0})
    p = plan(sized(3), observed(*two), at(1), CONFIG, status)
    created = sorted(m["metadata"]["name"] for m in p.create if m["kind"] == "Pod")
    assert created == [W1, W2]
    assert all(m["metadata"]["labels"]["torchfleet.dev/restart"] == "0" for m in p.create)
    assert p.delete == [] and p.gang_restart is None and p.worker_replacements == []
    assert p.status["phase"] == "Running"
    assert p.status["elastic"]["desiredNodes"] == 4
    assert p.status["elastic"]["replacements"] == 0
    assert [e.reason for e in p.events] == ["ScaledUp"]


def test_a_fixed_gang_has_no_surplus_to_remove():
    # The API server refuses a fixed gang's resize while it runs; a spec read
    # with fewer workers than pods (an old operator's leftovers) removes nothing.
    p = plan(job(workers=1), observed(*four()), at(1), CONFIG, running_status())
    assert p.delete == [] and "ScaledDown" not in [e.reason for e in p.events]
