"""spec.managedBy: which jobs this operator runs, and what a pass does with
the others (policy/managed.py, applied first in reconcile.plan)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from kubernetes import client

from torchfleet_operator.api import constants as c
from torchfleet_operator.api import reasons as r
from torchfleet_operator.api.parse import parse_training_job
from torchfleet_operator.controller import Controller, Snapshot
from torchfleet_operator.desired.workload import SUSPENDED_ANNOTATION
from torchfleet_operator.kube import Executor
from torchfleet_operator.observed import KueueView, Observed, ObservedWorkload
from torchfleet_operator.planning import EventSpec
from torchfleet_operator.policy.managed import manager_elsewhere
from torchfleet_operator.reconcile import plan

from .builders import CONFIG, at, gang, job, running_status


@pytest.mark.parametrize(
    ("spec", "manager"),
    [
        ({}, None),  # unset: this operator's
        ({"managedBy": ""}, None),  # empty: this operator's, as unset
        ({"managedBy": "torchfleet.dev/operator"}, None),  # this operator's own value
        ({"managedBy": "kueue.x-k8s.io/multikueue"}, "kueue.x-k8s.io/multikueue"),
        ({"managedBy": "example.com/other"}, "example.com/other"),  # any other controller
        ({"managedBy": "torchfleet.dev/operator2"}, "torchfleet.dev/operator2"),  # not a prefix
        ({"managedBy": " torchfleet.dev/operator"}, " torchfleet.dev/operator"),  # exact only
        ({"managedBy": None}, None),  # null: unset
        (None, None),  # no spec at all (the parse reports it)
    ],
)
def test_who_runs_the_job(spec: Any, manager: str | None) -> None:
    assert manager_elsewhere(spec) == manager


def test_the_constants_are_the_values_the_description_names() -> None:
    assert manager_elsewhere({"managedBy": c.MANAGED_BY_OPERATOR}) is None
    assert manager_elsewhere({"managedBy": c.MANAGED_BY_MULTIKUEUE}) == c.MANAGED_BY_MULTIKUEUE


def test_the_models_take_the_field_and_its_length_limit() -> None:
    long = "x" * (c.MAX_MANAGED_BY_LENGTH + 1)
    assert parse_training_job(job(managedBy=c.MANAGED_BY_MULTIKUEUE)).spec.managed_by == (
        c.MANAGED_BY_MULTIKUEUE
    )
    with pytest.raises(ValueError, match="managedBy"):
        parse_training_job(job(managedBy=long))


def _deleting(body: dict[str, Any]) -> dict[str, Any]:
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return body


ELSEWHERE = [
    # a new job: this operator would create its Service and pods
    ("new", job(managedBy=c.MANAGED_BY_MULTIKUEUE), Observed()),
    # pods of its own name exist (made by someone): none deleted, none counted
    ("pods exist", job(managedBy="example.com/other"), Observed(pods=gang("llm", 3))),
    # the other controller wrote a status: not this operator's to change
    (
        "status mirrored",
        job(managedBy=c.MANAGED_BY_MULTIKUEUE, status=running_status()),
        Observed(pods=()),
    ),
    # a spec this operator cannot parse: still not this operator's to report on
    ("spec not parsed", job(managedBy="example.com/other", nonsense=1), Observed()),
    # being deleted: no status write either
    ("deleting", _deleting(job(managedBy="example.com/other")), Observed()),
]


@pytest.mark.parametrize(
    ("body", "seen"), [row[1:] for row in ELSEWHERE], ids=[r[0] for r in ELSEWHERE]
)
def test_a_job_managed_elsewhere_gets_nothing_but_one_event(body: Any, seen: Observed) -> None:
    decided = plan(body, seen, at(0), CONFIG)
    manager = body["spec"]["managedBy"]
    assert decided.managed_by == manager
    assert decided.create == [] and decided.delete == [] and decided.dry_run == []
    assert decided.workload_patches == [] and not decided.delete_job
    assert decided.status == {}  # and the shell writes none (controller._leave_alone)
    assert decided.requeue_after is None  # nothing requeued: no hot loop
    [event] = decided.events
    assert (event.type, event.reason, event.once) == ("Normal", r.EVENT_MANAGED_ELSEWHERE, True)
    assert f"spec.managedBy is {manager}" in event.message


def test_the_event_says_what_multikueue_does() -> None:
    [event] = plan(job(managedBy=c.MANAGED_BY_MULTIKUEUE), Observed(), at(0), CONFIG).events
    assert "MultiKueue runs it on a worker cluster and mirrors its status" in event.message


@pytest.mark.parametrize("value", ["", c.MANAGED_BY_OPERATOR])
def test_this_operators_values_run_the_job_as_usual(value: str) -> None:
    decided = plan(job(managedBy=value), Observed(), at(0), CONFIG, status={})
    assert decided.managed_by is None
    assert [m["kind"] for m in decided.create] == ["Service", "Pod", "Pod", "Pod"]
    assert decided.status["phase"] == "Pending"


class _EventsOnly(Executor):
    """The shell's side of a pass of a job managed elsewhere: it may post the
    event and nothing else (no children, no status write)."""

    def __init__(self) -> None:
        super().__init__(client.ApiClient(), 1)
        self.posted: list[list[EventSpec]] = []

    def post_events(self, namespace: str, job: dict[str, Any], events: Any) -> None:
        self.posted.append(list(events))

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a job managed elsewhere executed a plan")

    def write_status(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a job managed elsewhere got a status write")


def test_the_shell_posts_the_event_once_writes_nothing_and_requeues_nothing() -> None:
    async def passes() -> tuple[list[float | None], list[list[EventSpec]]]:
        executor = _EventsOnly()
        controller = Controller(CONFIG, executor)
        body = job(managedBy=c.MANAGED_BY_MULTIKUEUE, status=running_status())
        snapshot = Snapshot(body=body, observed=Observed())
        delays = [controller.reconcile(("team", "llm"), snapshot) for _ in range(3)]
        await controller.stop()
        return delays, executor.posted

    delays, posted = asyncio.run(passes())
    assert delays == [None, None, None]  # no requeue, not even the resync's
    assert [[e.reason for e in events] for events in posted] == [[r.EVENT_MANAGED_ELSEWHERE]]


# ---- which worker cluster runs a MultiKueue job ---------------------------------


def _manager_workload(
    cluster: str | None,
    admitted_at: str | None = "2026-11-29T01:00:00Z",
    finished: bool = False,
    evictions: tuple[int, ...] = (),
) -> ObservedWorkload:
    """The manager's Workload of the job, as MultiKueue leaves it (with
    Kueue's eviction counts, one per reason)."""
    conditions = []
    if admitted_at is not None:
        for type_ in ("QuotaReserved", "Admitted"):
            conditions.append({"type": type_, "status": "True", "lastTransitionTime": admitted_at})
    if finished:
        conditions.append({"type": "Finished", "status": "True"})
    status: dict[str, Any] = {"conditions": conditions}
    if admitted_at is not None:
        status["admission"] = {"clusterQueue": "cq"}
    if cluster is not None:
        status["clusterName"] = cluster
    if evictions:
        status["schedulingStats"] = {
            "evictions": [
                {"reason": f"Reason{i}", "underlyingCause": "", "count": n}
                for i, n in enumerate(evictions)
            ]
        }
    return ObservedWorkload({"metadata": {"name": "trainingjob-llm-1a2b3"}, "status": status})


def _dispatched_events(workload: ObservedWorkload | None) -> list[EventSpec]:
    body = job(managedBy=c.MANAGED_BY_MULTIKUEUE, scheduling={"queueName": "team-queue"})
    seen = Observed(kueue=KueueView(workload=workload))
    return [e for e in plan(body, seen, at(0), CONFIG).events if e.reason == r.EVENT_DISPATCHED]


DISPATCHES = [
    ("no Workload yet", None, False),
    ("queued, dispatched nowhere", _manager_workload(None, admitted_at=None), False),
    ("dispatched: admitted on a worker", _manager_workload("worker-1"), True),
    ("a cluster named, not admitted yet", _manager_workload("worker-1", admitted_at=None), False),
    ("finished: said before", _manager_workload("worker-1", finished=True), False),
]


@pytest.mark.parametrize(
    ("workload", "said"), [row[1:] for row in DISPATCHES], ids=[r[0] for r in DISPATCHES]
)
def test_the_manager_says_which_worker_cluster_runs_the_job(
    workload: ObservedWorkload | None, said: bool
) -> None:
    events = _dispatched_events(workload)
    assert len(events) == int(said), events
    if said:
        [event] = events
        assert (event.type, event.once) == ("Normal", True)
        assert "worker cluster worker-1 (Workload trainingjob-llm-1a2b3)" in event.message
        assert event.key.startswith("worker-1.")


def test_each_dispatch_is_said_once_even_to_the_same_cluster_again() -> None:
    first = _dispatched_events(_manager_workload("worker-1"))
    # the same dispatch seen again, its status changed (an admission check's time)
    again = _dispatched_events(_manager_workload("worker-1", "2026-11-29T01:00:07Z"))
    moved = _dispatched_events(_manager_workload("worker-2", evictions=(1,)))
    # back on the first cluster, within the same second: the evictions tell it apart
    back = _dispatched_events(_manager_workload("worker-1", evictions=(1, 1)))
    keys = [events[0].key for events in (first, again, moved, back)]
    assert keys == ["worker-1.0", "worker-1.0", "worker-2.1", "worker-1.2"]


def test_the_shell_posts_each_dispatch_once() -> None:
    workloads = [
        None,
        _manager_workload("worker-1"),
        _manager_workload("worker-1"),
        _manager_workload("worker-2", evictions=(1,)),
    ]

    async def passes() -> list[list[EventSpec]]:
        executor = _EventsOnly()
        controller = Controller(CONFIG, executor)
        body = job(managedBy=c.MANAGED_BY_MULTIKUEUE, scheduling={"queueName": "team-queue"})
        body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-queue"}
        for workload in workloads[1:]:  # the Workload exists: nothing to create
            observed = Observed(kueue=KueueView(workload=workload))
            controller.reconcile(("team", "llm"), Snapshot(body=body, observed=observed))
        await controller.stop()
        return executor.posted

    posted = asyncio.run(passes())
    said = [[(e.reason, e.key.split(".")[0]) for e in events] for events in posted]
    assert said == [
        [(r.EVENT_MANAGED_ELSEWHERE, ""), (r.EVENT_DISPATCHED, "worker-1")],
        [(r.EVENT_DISPATCHED, "worker-2")],
    ]


# ---- spec.suspend on the manager --------------------------------------------------


def _with(workload: ObservedWorkload, active: bool = True, **status: Any) -> ObservedWorkload:
    manifest = copy.deepcopy(workload.manifest)
    manifest["apiVersion"] = "kueue.x-k8s.io/v1beta2"
    manifest["spec"] = {"active": active}
    if not active and status.pop("by_job", True):
        manifest["metadata"]["annotations"] = {SUSPENDED_ANNOTATION: "true"}
    for type_ in status.pop("conditions", ()):
        manifest["status"]["conditions"].append({"type": type_, "status": "True"})
    return ObservedWorkload(manifest)


SUSPENDS = [
    # suspended while it runs on a worker: the Workload deactivated, nothing said
    ("suspended, running", True, _with(_manager_workload("worker-1")), [False], False),
    # Kueue evicted it (Deactivated): its quota handed back, so MultiKueue removes the copy
    (
        "suspended, evicted",
        True,
        _with(_manager_workload("worker-1"), active=False, conditions=["Evicted"]),
        ["hand back"],
        False,
    ),
    # suspended, quota back, nothing left to do
    ("suspended, idle", True, _with(_manager_workload(None, None), active=False), [], False),
    # resumed: the job's own deactivation undone, to be dispatched anew
    ("resumed", False, _with(_manager_workload(None, None), active=False), [True], False),
    # deactivated by someone else (no mark of the job's): left as it is
    (
        "deactivated by another",
        False,
        _with(_manager_workload(None, None), active=False, by_job=False),
        [],
        False,
    ),
    # running and not suspended: only the dispatch is said
    ("running", False, _with(_manager_workload("worker-1")), [], True),
]


@pytest.mark.parametrize(
    ("suspend", "workload", "writes", "said"),
    [row[1:] for row in SUSPENDS],
    ids=[row[0] for row in SUSPENDS],
)
def test_suspend_on_the_manager_deactivates_the_workload(
    suspend: bool, workload: ObservedWorkload, writes: list[Any], said: bool
) -> None:
    body = job(
        managedBy=c.MANAGED_BY_MULTIKUEUE, suspend=suspend, scheduling={"queueName": "team-queue"}
    )
    decided = plan(body, Observed(kueue=KueueView(workload=workload)), at(0), CONFIG)
    done = [
        "hand back" if p.field_manager else p.body["spec"]["active"]
        for p in decided.workload_patches
    ]
    assert done == writes
    assert all(p.name == workload.name for p in decided.workload_patches)
    assert decided.status == {} and decided.create == []
    assert any(e.reason == r.EVENT_DISPATCHED for e in decided.events) == said
