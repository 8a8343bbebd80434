"""policy/elastic.py: which lost pods are replaced alone, resizes. One row per case."""

from __future__ import annotations

import pytest

from torchfleet_operator.api.parse import read_status
from torchfleet_operator.policy import elastic
from torchfleet_operator.policy.failure import Failure
from torchfleet_operator.status.conditions import find

from .builders import a_pass, deleted_names, gang, observed, pod, running_status, spec_of, status_of

MASTER, W0, W1 = "llm-master-0", "llm-worker-0", "llm-worker-1"
ELASTIC = {"minNodes": 2, "maxNodes": 4, "maxRestarts": 1}


def lost(name: str, retryable: bool = True, disruption: bool = False) -> Failure:
    return Failure(name, "PodFailed", 1, retryable, "", disruption)


@pytest.mark.parametrize(
    ("failures", "replacing", "to_gang", "new", "counted"),
    [
        ([], {}, [], [], 0),
        ([lost(W1)], {}, [], [W1], 1),
        ([lost(W1, disruption=True)], {}, [], [W1], 0),  # replaced, not counted
        ([lost(MASTER)], {}, [MASTER], [], 0),  # the master holds the rendezvous
        ([lost(W1, retryable=False)], {}, [W1], [], 0),
        ([lost(W1), lost(MASTER)], {}, [W1, MASTER], [], 0),  # the gang takes every pod
        ([lost(W1)], {W1: "llm-2-0"}, [], [], 0),  # the same loss, seen again
    ],
)
def test_replace_workers(failures, replacing, to_gang, new, counted):
    decided = elastic.replace_workers(failures, MASTER, gang(), replacing, 0, 0)
    assert [f.pod for f in decided.gang] == to_gang
    assert [f.pod for f in decided.new] == new
    assert decided.counted == counted


def test_a_replacement_is_done_once_its_new_pod_exists():
    replacing = {W1: "old-uid", W0: ""}
    assert elastic.still_replacing(replacing, gang()) == {}
    assert elastic.still_replacing(replacing, gang()[:1]) == replacing


@pytest.mark.parametrize(
    ("counted_before", "phase", "deleted", "events"),
    [(0, "Running", [W1], ["WorkerReplaced"]), (1, "Failed", [], [])],
)
def test_replace_lost_workers_until_max_restarts(counted_before, phase, deleted, events):
    status = running_status(
        elastic={"replacements": counted_before, "countedReplacements": counted_before}
    )
    step = a_pass(observed(*gang()), status, elastic=ELASTIC)
    left = elastic.replace_lost_workers(step, spec_of(elastic=ELASTIC), list(gang()), [lost(W1)])
    assert left == []
    assert status_of(step)["phase"] == phase
    assert deleted_names(step.plan) == deleted
    assert [e.reason for e in step.plan.events] == events
    if phase == "Failed":
        assert find(status_of(step)["conditions"], "Failed")["reason"] == "ElasticRestartsExceeded"


@pytest.mark.parametrize(
    ("workers", "pods", "shown", "deleted", "events"),
    [
        (1, gang(nodes=3), 3, [W1], ["ScaledDown"]),  # 3 -> 2 nodes: worker-1 leaves
        (3, gang(nodes=3), 3, [], ["ScaledUp"]),  # 3 -> 4 nodes: one more joins
        (2, gang(nodes=3), 3, [], []),
    ],
)
def test_resize(workers, pods, shown, deleted, events):
    spec = spec_of(workers=workers, elastic=ELASTIC)
    step = a_pass(observed(*pods), running_status(elastic={"desiredNodes": shown}), workers=workers)
    step.old_status = read_status(running_status(elastic={"desiredNodes": shown}))
    elastic.resize(step, spec, elastic.surplus(spec, list(pods)))
    assert deleted_names(step.plan) == deleted
    assert [e.reason for e in step.plan.events] == events


@pytest.mark.parametrize(
    ("running", "trains"),
    [((0, 1), True), ((0,), False), ((1, 2), False), ((0, 1, 2), True)],
)
def test_an_elastic_job_trains_with_its_master_and_min_nodes(running, trains):
    pods = [pod("llm", rank) for rank in running]
    assert elastic.runs(pods, MASTER, 2) is trains
