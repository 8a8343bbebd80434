"""Kueue preemption with real training: the preempted trainer saves at the step it
reached, and the re-admitted job resumes at exactly that step.

A low-priority Shakespeare job (examples/shakespeare-ddp.yaml, here trained for
150 steps with no periodic checkpoint before the end) trains in a ClusterQueue
with room for one job's CPUs. A high-priority job arrives: Kueue preempts the
low one, the operator deletes its pods with their grace period, the trainer
gets SIGTERM and saves a checkpoint at its current step (its only one), the
quota is handed back, the high job runs and ends; Kueue re-admits the low job,
which resumes at that step and finishes with the validation loss of an
uninterrupted run (the same threshold as test_training.py).

The second test preempts the same job twice: first Kueue reclaims the quota
it borrowed in its cohort (its lender's own job arrives), then a
higher-priority job of its own queue preempts it. Each ClusterQueue has a
nominal quota of its own; the low job's covers its CPUs but only half its
memory, so it runs on memory lent by the other, and may borrow no CPU: the
urgent job (less memory) then fits in its queue's own quota only once the low
job is gone, so Kueue must preempt it rather than lend.

The trainer holds itself where each preemption comes (tests/e2e/hold: once it
has logged the step, until the test has seen the SIGTERM reach it): unheld, a
fast machine trains past that step, or to the end, before Kueue acts, and the
step saved is whichever one the SIGTERM found.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from tests.e2e.test_training import (
    SHAKESPEARE,
    VAL_LOSS_THRESHOLD,
    StatusWatch,
    events,
    failure_report,
    get_job,
    wait_job,
    write_corpus,
)
from tests.fixtures.e2e import LOCAL_PLACEMENT, Hold, apply_objects, held_at
from tests.fixtures.kueue import job_workload
from torchfleet_operator.status.conditions import find

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.timeout(1200)]

# Half the example's 300: what is asserted happens by step 100, and at 150 steps
# (the cosine schedule ending there) the validation loss is still well below the
# threshold. Saves the test tier about 20 s of training.
TOTAL_STEPS = 150
# The trainer holds once it has logged this step (a log step: every 10) until
# its SIGTERM came: the preemption saves exactly there.
PREEMPT_AT_STEP = 60
# The twice-preempted job: the reclaim at the first, the priority preemption
# at the second (in the run resumed after the first).
RECLAIM_AT_STEP = 60
PRIORITY_AT_STEP = 100
# The phases the watch must have seen, in order, from the first Running: ran,
# preempted (Pending), ran, preempted, ran, succeeded. Fewer statuses seen
# would prove nothing of what the status said on the way.
TWICE_PREEMPTED_PHASES = ["Running", "Pending", "Running", "Pending", "Running", "Succeeded"]
# Kueue's reasons (its Workload's Preempted condition) for a reclaim of lent
# quota (0.17 says the first here).
RECLAIMS = ("InCohortReclamation", "InCohortReclaimWhileBorrowing")
# How far a shown checkpoint time may be from the trainer's log of the save:
# the operator dates it from the trainer's report, the log line comes just after.
CHECKPOINT_TIME_TOLERANCE = 1.5


def queued(manifest: dict[str, Any], name: str, queue: str, priority: str) -> dict[str, Any]:
    job = copy.deepcopy(manifest)
    job["metadata"] = {"name": name}
    job["spec"]["scheduling"] = {"queueName": queue, "priorityClassName": priority}
    return job


def short_job(name: str, queue: str, priority: str, memory: str = "2Gi") -> dict[str, Any]:
    """Same shape and CPUs as the Shakespeare job (``memory`` per pod), runs a
    few seconds and succeeds."""
    template = {"spec": copy.deepcopy(LOCAL_PLACEMENT)}
    return {
        "apiVersion": "torchfleet.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "resources": {"cpu": 1, "memory": memory},
            "command": ["python", "-c", "import time; time.sleep(5)"],
            "master": {"template": template},
            "worker": {"replicas": 1, "template": template},
            "scheduling": {"queueName": queue, "priorityClassName": priority},
        },
    }


def low_shakespeare(name: str, queue: str, priority: str) -> dict[str, Any]:
    job = queued(SHAKESPEARE, name, queue, priority)
    job["spec"]["trainer"]["training"]["steps"] = TOTAL_STEPS
    # No periodic checkpoint before the end: a checkpoint of a preempted run
    # can only be its save on SIGTERM (with the example's 50, a SIGTERM that
    # came during step 100's evaluation stopped on a periodic one).
    job["spec"]["trainer"]["checkpoint"]["interval"] = TOTAL_STEPS
    return job


def preempted_at(log: Callable[[], str], hold: Hold, wait_for: Any) -> int:
    """The held trainer let go once its SIGTERM came; the step it then saved at
    (its run's ``log``)."""
    wait_for("the held trainer's SIGTERM", hold.sigterm, timeout=120)
    hold.release()
    (preempted,) = wait_for(
        "the trainer's save on SIGTERM", lambda: events(log(), "preempted"), timeout=120
    )
    assert preempted["saved"], preempted
    return int(preempted["step"])


def collapsed(values: list[Any]) -> list[Any]:
    """``values`` with each run of equal ones once."""
    return [value for value, _ in itertools.groupby(values)]


def test_preempted_job_resumes_at_the_step_it_was_preempted(
    cluster, kueue, kueue_objects, node_agent, e2e_operator, e2e_namespace, job_driver
):
    namespace = e2e_namespace
    low = kueue_objects.priority_class("e2e-low", 100)
    high = kueue_objects.priority_class("e2e-high", 1000)
    flavor = kueue_objects.flavor("e2e-cpu")
    # Room for exactly one job: 2 pods x (1 CPU, 2Gi).
    cq = kueue_objects.cluster_queue(
        "e2e-one-job",
        [(flavor, {"cpu": 2, "memory": "4Gi"})],
        preemption={"withinClusterQueue": "LowerPriority"},
    )
    queue = kueue_objects.local_queue(namespace, "team-a", cq)
    write_corpus(cluster, namespace, node_agent)
    name = "low"
    master = f"{name}-master-0"
    low_job = low_shakespeare(name, queue, low)
    (hold,) = held_at(low_job, node_agent, namespace, ("step", PREEMPT_AT_STEP))

    def first_run() -> str:
        return (node_agent.logs(namespace, master, "trainer") or [""])[0]

    try:
        with StatusWatch(cluster, namespace, name) as statuses:
            apply_objects(cluster, namespace, low_job)
            job_driver.wait_for(f"the trainer held at step {PREEMPT_AT_STEP}", hold.held, 540)
            apply_objects(cluster, namespace, short_job("urgent", queue, high))
            # The low job's trainer got SIGTERM and saved where it was held.
            stopped_at = preempted_at(first_run, hold, job_driver.wait_for)
            assert stopped_at == PREEMPT_AT_STEP, stopped_at
            assert [e["step"] for e in events(first_run(), "checkpoint")] == [stopped_at]
            job = get_job(cluster, namespace, name)
            evicted = find(job["status"]["conditions"], "Evicted")
            assert evicted["status"] == "True" and evicted["reason"] == "Preempted", evicted

            assert wait_job(cluster, namespace, "urgent", {"Succeeded"}, 300)
            job = wait_job(cluster, namespace, name, {"Succeeded", "Failed"}, 540)
        seen = statuses.seen
        assert job["status"]["phase"] == "Succeeded", job["status"]
        assert job["status"]["restartCount"] == 0 and job["status"]["disruptions"] == 1

        runs = node_agent.logs(namespace, master, "trainer")
        assert len(runs) == 2, f"expected the preempted run and the resumed one: {len(runs)}"
        final = runs[-1]
        assert [e["step"] for e in events(final, "resumed")] == [stopped_at]
        steps_after = [e["step"] for e in events(final, "step")]
        assert min(steps_after) > stopped_at and max(steps_after) == TOTAL_STEPS
        evals = events(final, "eval")
        assert evals and evals[-1]["step"] == TOTAL_STEPS
        assert evals[-1]["val_loss"] < VAL_LOSS_THRESHOLD

        # What the status said on the way. The save on SIGTERM came after the
        # operator's last scrape; the trainer's termination message told it:
        # progress never went back (the run resumed at the last step it had
        # shown or later), the checkpoint is dated when it was saved, and no
        # second counts as recomputed (no step was done twice).
        phases = collapsed([s["phase"] for s in seen if s.get("phase")])
        assert phases[phases.index("Running") :] == TWICE_PREEMPTED_PHASES[2:], phases
        steps = [s["progress"]["step"] for s in seen if "step" in (s.get("progress") or {})]
        assert steps == sorted(steps), f"progress went backwards: {steps}"
        (save,) = events(first_run(), "checkpoint")
        shown = next(s["lastCheckpoint"] for s in seen if s.get("lastCheckpoint"))
        assert shown["step"] == stopped_at, shown
        saved_at = datetime.fromisoformat(shown["time"]).timestamp()
        assert abs(saved_at - save["time"]) < CHECKPOINT_TIME_TOLERANCE, (shown, save["time"])
        assert job["status"]["timeAccounting"]["recomputedSeconds"] == 0, job["status"]
    except AssertionError as error:
        raise AssertionError(
            f"{error}\n{failure_report(cluster, namespace, node_agent, e2e_operator)}"
        ) from None
    finally:
        hold.release()  # a failed test leaves no trainer waiting


def cohort_queue(
    kueue_objects: Any,
    base: str,
    cohort: str,
    flavor: str,
    quota: dict[str, dict[str, str | int]],
    preemption: dict[str, str],
) -> str:
    """A ClusterQueue in ``cohort``: ``quota`` per resource, its nominalQuota
    and any borrowingLimit. The cohort's field is ``cohort`` in Kueue's
    v1beta1, ``cohortName`` in v1beta2."""
    name = kueue_objects.name(base)
    field = "cohort" if kueue_objects.api.endswith("/v1beta1") else "cohortName"
    resources = [{"name": resource, **limits} for resource, limits in sorted(quota.items())]
    spec = {
        field: cohort,
        "namespaceSelector": {},
        "preemption": preemption,
        "resourceGroups": [
            {
                "coveredResources": sorted(quota),
                "flavors": [{"name": flavor, "resources": resources}],
            }
        ],
    }
    queue = {"apiVersion": kueue_objects.api, "kind": "ClusterQueue"}
    kueue_objects.apply({**queue, "metadata": {"name": name}, "spec": spec})
    return name


def workload_preempted(job_driver: Any, namespace: str, job: str) -> dict[str, Any] | None:
    """The job's Workload's Preempted condition (Kueue's reason: why), once true."""
    workload = job_workload(job_driver, namespace, job) or {}
    found = find((workload.get("status") or {}).get("conditions"), "Preempted")
    return found if found and found["status"] == "True" else None


def preempted_again(
    job_driver: Any, namespace: str, job: str, before: dict[str, Any]
) -> dict[str, Any] | None:
    """The Workload's Preempted condition once it is not ``before`` (Kueue sets
    a new reason, or sets it true again after it was cleared)."""
    now = workload_preempted(job_driver, namespace, job)
    fields = ("reason", "lastTransitionTime")
    changed = now and any(now[f] != before[f] for f in fields)
    return now if changed else None


def test_a_reclaimed_then_preempted_job_resumes_each_time_at_its_save(
    cluster, kueue, kueue_objects, node_agent, e2e_operator, e2e_namespace, job_driver
):
    namespace = e2e_namespace
    wait_for = job_driver.wait_for
    low = kueue_objects.priority_class("e2e-low", 100)
    high = kueue_objects.priority_class("e2e-high", 1000)
    flavor = kueue_objects.flavor("e2e-cpu")
    cohort = kueue_objects.name("e2e-cohort")
    # The lender: room for one job (2 pods x (1 CPU, 2Gi)), taken back from
    # a borrower whenever its own jobs need it.
    lender = cohort_queue(
        kueue_objects,
        "e2e-lender",
        cohort,
        flavor,
        {"cpu": {"nominalQuota": 2}, "memory": {"nominalQuota": "4Gi"}},
        {"reclaimWithinCohort": "Any", "withinClusterQueue": "Never"},
    )
    # The borrower: the low job's CPUs and half its memory of its own; it
    # borrows the other half and may borrow no CPU. Lower priorities are
    # preempted within it.
    borrower = cohort_queue(
        kueue_objects,
        "e2e-borrower",
        cohort,
        flavor,
        {
            "cpu": {"nominalQuota": 2, "borrowingLimit": 0},
            "memory": {"nominalQuota": "2Gi", "borrowingLimit": "2Gi"},
        },
        {"reclaimWithinCohort": "Never", "withinClusterQueue": "LowerPriority"},
    )
    lender_queue = kueue_objects.local_queue(namespace, "lender", lender)
    borrower_queue = kueue_objects.local_queue(namespace, "borrower", borrower)
    write_corpus(cluster, namespace, node_agent)
    name = "low"
    master = f"{name}-master-0"
    low_job = low_shakespeare(name, borrower_queue, low)
    reclaim_hold, priority_hold = held_at(
        low_job, node_agent, namespace, ("step", RECLAIM_AT_STEP), ("step", PRIORITY_AT_STEP)
    )

    def runs() -> list[str]:
        return node_agent.logs(namespace, master, "trainer")

    def run_log(index: int) -> Callable[[], str]:
        return lambda: next(iter(runs()[index : index + 1]), "")

    try:
        with StatusWatch(cluster, namespace, name) as statuses:
            apply_objects(cluster, namespace, low_job)

            # 1. The lent memory reclaimed by the lender's own job (as low a
            # priority: a reclaim, not a priority preemption).
            wait_for(f"the trainer held at step {RECLAIM_AT_STEP}", reclaim_hold.held, 540)
            apply_objects(cluster, namespace, short_job("owner", lender_queue, low))
            reclaimed = wait_for(
                "the low job's Workload preempted by the reclaim",
                lambda: workload_preempted(job_driver, namespace, name),
                120,
            )
            reclaimed_at = preempted_at(run_log(0), reclaim_hold, wait_for)
            assert wait_job(cluster, namespace, "owner", {"Succeeded"}, 300)

            # 2. Preempted for a higher priority in its own queue, once it ran again.
            wait_for(
                f"the resumed trainer held at step {PRIORITY_AT_STEP}", priority_hold.held, 540
            )
            apply_objects(cluster, namespace, short_job("urgent", borrower_queue, high, "1Gi"))
            prioritized = wait_for(
                "the low job's Workload preempted again, for the urgent one",
                lambda: preempted_again(job_driver, namespace, name, reclaimed),
                120,
            )
            priority_at = preempted_at(run_log(1), priority_hold, wait_for)
            assert wait_job(cluster, namespace, "urgent", {"Succeeded"}, 300)
            job = wait_job(cluster, namespace, name, {"Succeeded", "Failed"}, 540)
        seen = statuses.seen

        # Kueue's own word for each: a reclaim in the cohort, then a
        # preemption within the ClusterQueue.
        assert reclaimed["reason"] in RECLAIMS, reclaimed
        assert prioritized["reason"] == "InClusterQueue", prioritized
        assert job["status"]["phase"] == "Succeeded", job["status"]
        # Two disruptions, neither counted as the program's failure.
        assert job["status"]["restartCount"] == 0, job["status"]
        assert job["status"]["disruptions"] == 2, job["status"]
        # Each save exactly where the trainer was held when its SIGTERM came.
        assert (reclaimed_at, priority_at) == (RECLAIM_AT_STEP, PRIORITY_AT_STEP)

        # Three runs: each preempted one saved once, where it stopped; each
        # later one resumed exactly there and trained on from the next step.
        logs = runs()
        assert len(logs) == 3, f"expected two preempted runs and the last: {len(logs)}"
        saves = [reclaimed_at, priority_at, TOTAL_STEPS]
        for log, saved in zip(logs, saves, strict=True):
            assert [e["step"] for e in events(log, "checkpoint")] == [saved]
        for log, resumed in zip(logs[1:], saves, strict=False):
            assert [e["step"] for e in events(log, "resumed")] == [resumed]
            assert min(e["step"] for e in events(log, "step")) > resumed
        evals = events(logs[-1], "eval")
        assert evals and evals[-1]["step"] == TOTAL_STEPS
        assert evals[-1]["val_loss"] < VAL_LOSS_THRESHOLD

        # What the status said on the way, every write of it the watch saw:
        # each phase in turn (a watch that missed some proves nothing).
        phases = collapsed([s["phase"] for s in seen if s.get("phase")])
        assert phases[phases.index("Running") :] == TWICE_PREEMPTED_PHASES, phases
        assert len(seen) >= len(TWICE_PREEMPTED_PHASES) + len(saves), len(seen)
        # Progress never went back, over the whole watch.
        steps = [s["progress"]["step"] for s in seen if "step" in (s.get("progress") or {})]
        assert steps == sorted(steps), f"progress went backwards: {steps}"
        # Each save shown, dated when it was saved, right after its
        # preemption: before the job ran again.
        checkpoints = [s["lastCheckpoint"] for s in seen if s.get("lastCheckpoint")]
        assert collapsed([c["step"] for c in checkpoints]) == saves, checkpoints
        for saved, log in zip(saves, logs, strict=True):
            (save,) = events(log, "checkpoint")
            for checkpoint in (c for c in checkpoints if c["step"] == saved):
                saved_at = datetime.fromisoformat(checkpoint["time"]).timestamp()
                assert abs(saved_at - save["time"]) < CHECKPOINT_TIME_TOLERANCE, (checkpoint, save)
        first_running = next(i for i, s in enumerate(seen) if s.get("phase") == "Running")
        running_again = [
            i
            for i, (before, after) in enumerate(itertools.pairwise(seen), start=1)
            if i > first_running
            and before.get("phase") == "Pending"
            and after.get("phase") == "Running"
        ]
        assert len(running_again) == 2, running_again
        for saved, resumed_index in zip(saves, running_again, strict=False):
            first_shown = next(
                i
                for i, s in enumerate(seen)
                if (s.get("lastCheckpoint") or {}).get("step") == saved
            )
            assert first_shown < resumed_index, (saved, first_shown, resumed_index)
        # No step was trained twice, in any status.
        recomputed = [
            s["timeAccounting"]["recomputedSeconds"] for s in seen if s.get("timeAccounting")
        ]
        assert recomputed and set(recomputed) == {0}, recomputed
    except AssertionError as error:
        raise AssertionError(
            f"{error}\n{failure_report(cluster, namespace, node_agent, e2e_operator)}"
        ) from None
    finally:
        for hold in (reclaim_hold, priority_hold):
            hold.release()  # a failed test leaves no trainer waiting
