"""The pod index the operator's own informer keeps: events in, jobs to wake out."""

from __future__ import annotations

import json
from typing import Any

import pytest

from torchfleet_contract import pod as contract
from torchfleet_operator.desired.labels import (
    JOB_NAME_LABEL,
    NODE_RANK_LABEL,
    RESTART_LABEL,
    ROLE_LABEL,
)
from torchfleet_operator.informer import PodIndex, parse_event, scopes


def pod(
    name: str, job: str = "llm", namespace: str = "team", node: str | None = None, **status: Any
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "labels": {
                JOB_NAME_LABEL: job,
                ROLE_LABEL: "worker",
                NODE_RANK_LABEL: "1",
                RESTART_LABEL: "0",
            },
        },
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": "Pending", **status},
    }


def event(kind: str, manifest: dict[str, Any]) -> Any:
    parsed = parse_event(kind, manifest)
    assert parsed is not None
    return parsed


def test_events_keep_one_summary_per_pod_and_name_the_job_they_concern():
    index = PodIndex()
    assert index.apply(event("ADDED", pod("a"))) == ("team", "llm")
    index.apply(event("MODIFIED", pod("a", node="n1", phase="Running")))
    index.apply(event("ADDED", pod("b", job="other")))
    assert [(p.name, p.phase, p.node_name) for p in index[("team", "llm")]] == [
        ("a", "Running", "n1")
    ]
    assert set(index) == {("team", "llm"), ("team", "other")}
    assert index.apply(event("DELETED", pod("a", node="n1"))) == ("team", "llm")
    assert ("team", "llm") not in index
    assert index.jobs_on_node("n1") == []


def preempted(name: str, message: str) -> dict[str, Any]:
    """A pod whose trainer container ended (143) with ``message``."""
    terminated = {"exitCode": 143, "message": message, "finishedAt": "2026-01-01T12:01:44Z"}
    return pod(
        name,
        phase="Failed",
        containerStatuses=[{"name": "trainer", "state": {"terminated": terminated}}],
    )


def report(step: int, second: int) -> str:
    return json.dumps(
        {
            contract.SAVED_CHECKPOINT_STEP: step,
            contract.SAVED_CHECKPOINT_TIME: f"2026-01-01T12:01:{second:02d}Z",
        }
    )


def test_a_preempted_trainers_save_outlives_its_pod_and_only_a_newer_one_replaces_it():
    index = PodIndex()
    job = ("team", "llm")
    # Seen only in the DELETED event (no pass saw the pod end): kept, and the job woken.
    assert index.apply(event("DELETED", preempted("a", report(139, 43)))) == job
    assert (index.saved[job].step, index.saved[job].time.second) == (139, 43)
    assert index.apply(event("DELETED", preempted("b", report(120, 40)))) is None  # older
    index.replace([event("ADDED", preempted("c", report(150, 50)))], lambda _ns: True)
    assert index.saved[job].step == 150
    index.forget(job)
    assert job not in index.saved


@pytest.mark.parametrize(
    "message",
    [
        "Traceback (most recent call last): ...",  # the kubelet's log tail
        json.dumps({contract.SAVED_CHECKPOINT_STEP: -1, contract.SAVED_CHECKPOINT_TIME: "x"}),
        json.dumps({contract.SAVED_CHECKPOINT_STEP: True, contract.SAVED_CHECKPOINT_TIME: "x"}),
        json.dumps({contract.SAVED_CHECKPOINT_STEP: 5}),
        json.dumps([5]),
        "{" * 5000,
    ],
)
def test_a_message_that_is_not_exactly_a_save_report_is_no_save(message):
    assert parse_event("DELETED", preempted("a", message)).saved is None


@pytest.mark.parametrize(
    ("report", "read"),
    [
        ({"inPlaceRestarts": 1, "inPlaceReason": "worker_killed"}, (1, "worker_killed")),
        ({"inPlaceRestarts": 2, "inPlaceReason": None}, (2, None)),
        # Beside a saved preemption's report, each is read.
        (json.loads(report(139, 43)) | {"inPlaceRestarts": 1}, (1, None)),
        ({"inPlaceRestarts": -1}, None),
        ({"inPlaceRestarts": True}, None),
        ({"inPlaceRestarts": 1, "inPlaceReason": "oops"}, None),
        (json.loads(report(139, 43)), None),
    ],
)
def test_the_in_place_restarts_a_trainer_left_are_read_from_its_message(report, read):
    assert parse_event("MODIFIED", preempted("a", json.dumps(report))).pod.in_place_report == read


def test_a_log_tail_is_no_in_place_report():
    tail = "torchfleet-train: ...\nRuntimeError: inPlaceRestarts"
    assert parse_event("MODIFIED", preempted("a", tail)).pod.in_place_report is None


@pytest.mark.parametrize(
    ("manifest", "why"),
    [
        ({"metadata": {"uid": "u", "namespace": "team"}}, "no job label"),
        ({"metadata": {"namespace": "team", "labels": {JOB_NAME_LABEL: "llm"}}}, "no uid"),
    ],
)
def test_what_is_not_a_job_pod_is_not_an_event(manifest, why):
    assert parse_event("ADDED", manifest) is None, why


def test_a_pod_that_loses_its_torchfleet_labels_leaves_the_index():
    index = PodIndex()
    index.apply(event("ADDED", pod("a", node="n1")))
    stripped = pod("a", node="n1")
    del stripped["metadata"]["labels"][ROLE_LABEL]
    index.apply(event("MODIFIED", stripped))
    assert ("team", "llm") not in index
    assert index.jobs_on_node("n1") == []


def test_jobs_on_a_node_follow_their_pods():
    index = PodIndex()
    index.apply(event("ADDED", pod("a", node="n1")))
    index.apply(event("ADDED", pod("b", node="n1")))
    index.apply(event("ADDED", pod("c", job="other", node="n2")))
    assert index.jobs_on_node("n1") == [("team", "llm")]
    index.apply(event("DELETED", pod("a", node="n1")))
    assert index.jobs_on_node("n1") == [("team", "llm")]  # b is still there
    index.apply(event("DELETED", pod("b", node="n1")))
    assert index.jobs_on_node("n1") == []
    assert index.jobs_on_node("n2") == [("team", "other")]


def test_a_deletion_of_an_unknown_pod_changes_nothing():
    index = PodIndex()
    index.apply(event("ADDED", pod("a")))
    assert index.apply(event("DELETED", pod("ghost"))) is None
    assert [p.name for p in index[("team", "llm")]] == ["a"]


def test_an_update_the_summary_does_not_keep_wakes_no_job():
    index = PodIndex()
    index.apply(event("ADDED", pod("a", node="n1", phase="Running")))
    touched = pod("a", node="n1", phase="Running")
    touched["metadata"]["resourceVersion"] = "99"  # neither is in the summary
    touched["metadata"]["annotations"] = {"note": "unrelated"}
    assert index.apply(event("MODIFIED", touched)) is None
    assert index.apply(event("MODIFIED", pod("a", node="n1", phase="Failed"))) == ("team", "llm")
    assert [p.phase for p in index[("team", "llm")]] == ["Failed"]


def test_a_relist_replaces_its_scope_only_and_names_every_job_that_changed():
    index = PodIndex()
    index.apply(event("ADDED", pod("kept")))
    index.apply(event("ADDED", pod("gone", job="finished")))
    index.apply(event("ADDED", pod("elsewhere", namespace="other-team")))
    changed = index.replace(
        [
            event("ADDED", pod("kept")),  # unchanged: its job is not woken
            event("ADDED", pod("new", job="fresh", node="n1")),
        ],
        in_scope=lambda ns: ns == "team",
    )
    assert changed == {("team", "finished"), ("team", "fresh")}
    assert set(index) == {("team", "llm"), ("team", "fresh"), ("other-team", "llm")}
    assert index.jobs_on_node("n1") == [("team", "fresh")]


@pytest.mark.parametrize(
    ("namespaces", "listed", "covers", "not_covers"),
    [
        ((), [None], "anything", None),
        (("a", "b"), ["a", "b"], "a", "c"),
        (("team-*",), [None], "team-x", "other"),
    ],
)
def test_scopes_watch_named_namespaces_each_and_globs_cluster_wide(
    namespaces, listed, covers, not_covers
):
    found = scopes(namespaces)
    assert [namespace for namespace, _ in found] == listed
    assert any(in_scope(covers) for _, in_scope in found)
    if not_covers is not None:
        assert not any(in_scope(not_covers) for _, in_scope in found)
