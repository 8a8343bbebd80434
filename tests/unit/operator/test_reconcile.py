"""plan = f(job, observed, now): the lifecycle, one table row per situation."""

from __future__ import annotations

import dataclasses

import pytest

from torchfleet_operator.desired import names
from torchfleet_operator.observed import Observed
from torchfleet_operator.reconcile import plan
from torchfleet_operator.status.conditions import find
from torchfleet_operator.status.rejections import after_execute, with_rejections

from .builders import (
    CONFIG,
    at,
    created_names,
    deleted_names,
    gang,
    job,
    literal_env,
    observed,
    pod,
    running_status,
    stamp,
)


def test_new_job_creates_service_then_one_pod_per_rank():
    p = plan(job(workers=2), Observed(), at(0), CONFIG, status={})
    assert [m["kind"] for m in p.create] == ["Service", "Pod", "Pod", "Pod"]
    assert created_names(p) == ["llm-master-0", "llm-worker-0", "llm-worker-1"]
    assert p.status["phase"] == "Pending"
    assert p.status["nodesReady"] == "0/3"


MOUNT = {
    "spec": {
        "containers": [{"name": "trainer", "volumeMounts": [{"name": "x", "mountPath": "/x"}]}]
    }
}


@pytest.mark.parametrize(
    ("spec", "seen", "dry_run"),
    [
        # One template for both roles: the master's own create is the check.
        ({}, observed(), []),
        (
            {"master": {"template": MOUNT}, "worker": {"replicas": 2, "template": MOUNT}},
            observed(),
            [],
        ),
        # The worker's own template: its first pod is dry-run before any pod exists.
        ({"worker": {"replicas": 2, "template": MOUNT}}, observed(), ["llm-worker-0"]),
        # Not a new gang (its master exists): nothing to check first.
        ({"worker": {"replicas": 2, "template": MOUNT}}, observed(pod("llm", 0)), []),
    ],
)
def test_a_new_gang_dry_runs_a_worker_only_when_its_template_is_not_the_masters(
    spec, seen, dry_run
):
    p = plan(job(**spec), seen, at(0), CONFIG, status={})
    assert [m["metadata"]["name"] for m in p.dry_run] == dry_run
    assert all(m in p.create for m in p.dry_run)  # checked, then created as planned


def test_reconciling_a_running_gang_again_changes_nothing():
    status = plan(job(), observed(*gang()), at(5), CONFIG, status={}).status
    again = plan(job(), observed(*gang()), at(6), CONFIG, status=status)
    assert again.create == [] and again.delete == [] and again.events == []
    assert again.status == status
    assert status["phase"] == "Running" and status["startTime"] == stamp(5)


def test_pods_already_created_but_not_yet_watched_are_not_created_again():
    seen = observed(
        pod("llm", 0, phase="Pending"), expected_created=frozenset({"llm-worker-0", "llm-worker-1"})
    )
    assert plan(job(), seen, at(1), CONFIG, status={}).create == []


def test_missing_pods_are_created_while_the_gang_is_still_forming():
    # e.g. the operator was killed half-way through creating the gang
    p = plan(
        job(), observed(pod("llm", 0, phase="Pending")), at(1), CONFIG, status={"phase": "Pending"}
    )
    assert created_names(p) == ["llm-worker-0", "llm-worker-1"]
    assert p.delete == []


@pytest.mark.parametrize(
    ("restart_policy", "exit_code", "outcome"),
    [
        ("ExitCode", 1, "Failed"),
        ("ExitCode", 137, "Restarting"),
        ("ExitCode", 143, "Restarting"),
        ("OnFailure", 1, "Restarting"),
        ("Never", 137, "Failed"),
    ],
)
def test_exit_code_policy_decides_restart_or_failure(restart_policy, exit_code, outcome):
    failed = pod("llm", 2, phase="Failed", exit_code=exit_code, reason="Error")
    p = plan(
        job(runPolicy={"restartPolicy": restart_policy}),
        observed(*gang(**{failed.name: failed})),
        at(100),
        CONFIG,
        status=running_status(),
    )
    assert p.status["phase"] == outcome
    if outcome == "Failed":
        message = find(p.status["conditions"], "Failed")["message"]
        assert "llm-worker-1" in message and f"exit code {exit_code}" in message
        assert p.status["restartCount"] == 0
    else:
        assert p.status["restartCount"] == 1
        # the whole gang goes, not just the failed pod
        assert deleted_names(p) == ["llm-master-0", "llm-worker-0", "llm-worker-1"]
        assert p.create == []
        assert p.gang_restart == "PodFailed"


def test_explicit_exit_code_lists_override_the_policy():
    failed = pod("llm", 1, phase="Failed", exit_code=3)
    spec = {"runPolicy": {"restartPolicy": "ExitCode", "retryableExitCodes": [3]}}
    p = plan(
        job(**spec),
        observed(*gang(**{failed.name: failed})),
        at(1),
        CONFIG,
        status=running_status(),
    )
    assert p.status["phase"] == "Restarting"


def test_new_gang_waits_for_old_pods_then_for_the_backoff():
    restarting = plan(
        job(),
        observed(
            *gang(phase="Running", **{"llm-worker-0": pod("llm", 1, phase="Failed", exit_code=137)})
        ),
        at(100),
        CONFIG,
        status=running_status(),
    )
    status = restarting.status
    assert restarting.requeue_after == 10  # base back-off before the first restart
    # Old pods still terminating: nothing is created yet.
    old = tuple(dataclasses.replace(p, deleting=True) for p in gang())
    waiting = plan(job(), observed(*old), at(101), CONFIG, status=status)
    assert waiting.create == [] and waiting.status["phase"] == "Restarting"
    # Old pods gone, back-off not over.
    early = plan(job(), observed(), at(105), CONFIG, status=status)
    assert early.create == [] and early.requeue_after == pytest.approx(5)
    # Back-off over: generation 1 is created with the restart count in env and labels.
    due = plan(job(), observed(), at(111), CONFIG, status=status)
    assert created_names(due) == ["llm-master-0", "llm-worker-0", "llm-worker-1"]
    master = next(m for m in due.create if m["kind"] == "Pod")
    assert master["metadata"]["labels"]["torchfleet.dev/restart"] == "1"
    env = literal_env(master)
    assert env["TORCHFLEET_RESTART_COUNT"] == "1"
    # New gang running: Running again, Restarting cleared.
    back = plan(job(), observed(*gang(restart=1)), at(120), CONFIG, status=due.status)
    assert back.status["phase"] == "Running"
    assert find(back.status["conditions"], "Restarting")["status"] == "False"


def test_backoff_doubles_with_each_restart():
    failed = pod("llm", 0, restart=2, phase="Failed", exit_code=137)
    p = plan(
        job(runPolicy={"backoffLimit": 5}),
        observed(*gang(restart=2, **{failed.name: failed})),
        at(0),
        CONFIG,
        status=running_status(restart=2),
    )
    assert p.status["restartCount"] == 3
    assert p.requeue_after == 40


def test_backoff_limit_exhausted_fails_with_the_pod_and_exit_code():
    failed = pod("llm", 1, restart=3, phase="Failed", exit_code=137)
    p = plan(
        job(runPolicy={"backoffLimit": 3}),
        observed(*gang(restart=3, **{failed.name: failed})),
        at(0),
        CONFIG,
        status=running_status(restart=3),
    )
    assert p.status["phase"] == "Failed"
    failed_condition = find(p.status["conditions"], "Failed")
    assert failed_condition["reason"] == "BackoffLimitExceeded"
    assert "llm-worker-0" in failed_condition["message"]
    assert "137" in failed_condition["message"]
    # A failed job must not hold GPUs: every pod goes, whatever cleanPodPolicy says.
    assert deleted_names(p) == ["llm-master-0", "llm-worker-0", "llm-worker-1"]


@pytest.mark.parametrize(
    ("clean_pod_policy", "deleted"),
    [
        ("Running", ["llm-worker-1"]),
        ("All", ["llm-master-0", "llm-worker-0", "llm-worker-1"]),
        ("None", []),
    ],
)
def test_master_success_finishes_the_job_and_applies_clean_pod_policy(clean_pod_policy, deleted):
    pods = gang(
        **{
            "llm-master-0": pod("llm", 0, phase="Succeeded", exit_code=0),
            "llm-worker-0": pod("llm", 1, phase="Succeeded", exit_code=0),
        }
    )
    p = plan(
        job(runPolicy={"cleanPodPolicy": clean_pod_policy}),
        observed(*pods),
        at(50),
        CONFIG,
        status=running_status(),
    )
    assert p.status["phase"] == "Succeeded"
    assert p.status["completionTime"] == stamp(50)
    assert deleted_names(p) == deleted
    assert [e.reason for e in p.events] == ["Succeeded"]


def test_all_workers_success_policy_waits_for_every_pod():
    pods = gang(**{"llm-master-0": pod("llm", 0, phase="Succeeded")})
    spec = {"runPolicy": {"successPolicy": "AllWorkers"}}
    assert (
        plan(job(**spec), observed(*pods), at(1), CONFIG, status=running_status()).status["phase"]
        == "Running"
    )
    done = gang(phase="Succeeded")
    assert (
        plan(job(**spec), observed(*done), at(1), CONFIG, status=running_status()).status["phase"]
        == "Succeeded"
    )


def test_suspend_deletes_pods_keeps_status_and_resume_recreates():
    status = running_status(restart=1)
    suspended = plan(job(suspend=True), observed(*gang(restart=1)), at(10), CONFIG, status=status)
    assert suspended.status["phase"] == "Suspended"
    assert suspended.status["restartCount"] == 1
    assert suspended.status["startTime"] == stamp(0)
    assert len(suspended.delete) == 3 and suspended.create == []
    still = plan(job(suspend=True), observed(), at(11), CONFIG, status=suspended.status)
    assert still.create == [] and still.delete == []
    resumed = plan(job(), observed(), at(12), CONFIG, status=suspended.status)
    assert len(created_names(resumed)) == 3
    assert find(resumed.status["conditions"], "Suspended")["status"] == "False"


def test_deadline_exceeded_fails_and_wakes_up_in_time_before():
    spec = {"runPolicy": {"activeDeadlineSeconds": 60}}
    before = plan(job(**spec), observed(*gang()), at(40), CONFIG, status=running_status())
    assert before.status["phase"] == "Running" and before.requeue_after == pytest.approx(20)
    after = plan(job(**spec), observed(*gang()), at(61), CONFIG, status=running_status())
    assert after.status["phase"] == "Failed"
    assert find(after.status["conditions"], "Failed")["reason"] == "DeadlineExceeded"
    assert len(after.delete) == 3


def test_ttl_deletes_the_finished_job_when_due():
    spec = {"runPolicy": {"ttlSecondsAfterFinished": 30}}
    done = {"phase": "Succeeded", "completionTime": stamp(0), "restartCount": 0}
    early = plan(job(**spec), observed(), at(10), CONFIG, status=done)
    assert not early.delete_job and early.requeue_after == pytest.approx(20)
    assert plan(job(**spec), observed(), at(30), CONFIG, status=done).delete_job


@pytest.mark.parametrize(
    ("body_change", "field"),
    [
        ({"spec": {"worker": {"replicas": -1}}}, "spec.worker.replicas"),
        ({"spec": {"runPolicy": {"restartPolicy": "Sometimes"}}}, "spec.runPolicy.restartPolicy"),
        ({"metadata": {"name": "a" * 60}}, "metadata.name"),
    ],
)
def test_invalid_spec_fails_with_the_field_and_creates_nothing(body_change, field):
    body = job()
    for section, values in body_change.items():
        body[section] = {**body[section], **values}
    p = plan(body, observed(), at(0), CONFIG, status={})
    assert p.create == []
    assert p.status["phase"] == "Failed"
    failed = find(p.status["conditions"], "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert field in failed["message"]


def test_invalid_spec_names_the_field_a_cross_field_rule_blames():
    # The rule lives on the checkpoint section but blames one field inside it.
    body = job()
    body["spec"]["checkpoint"] = {"claimName": "data", "claimTemplate": {"size": "1Gi"}}
    p = plan(body, observed(), at(0), CONFIG, status={})
    failed = find(p.status["conditions"], "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert failed["message"].startswith("spec.checkpoint.claim")


@pytest.mark.parametrize(
    ("name", "workers", "problem"),
    [
        ("a" * 48, 4095, None),  # the API's longest name fits the largest gang
        ("a" * 53, 1000, "at most 52 characters"),
        ("9lives", 1, "DNS-1035"),
        ("Upper", 1, "DNS-1035"),
    ],
)
def test_child_names_must_fit_a_dns_label_never_truncated(name, workers, problem):
    found = names.name_problem(name, workers)
    if problem is None:
        assert found is None
        assert len(names.worker_pod_name(name, workers - 1)) <= 63
    else:
        assert "metadata.name" in found and problem in found


def test_evicted_pod_restarts_even_under_never():
    evicted = pod("llm", 1, phase="Failed", reason="Evicted", disrupted=True)
    p = plan(
        job(runPolicy={"restartPolicy": "Never"}),
        observed(*gang(**{evicted.name: evicted})),
        at(0),
        CONFIG,
        status=running_status(),
    )
    assert p.status["phase"] == "Restarting" and p.gang_restart == "Evicted"


def test_pod_on_a_not_ready_node_is_lost_after_the_grace_period():
    pods = gang(**{"llm-worker-1": pod("llm", 2, node_name="node-b")})
    lost_since = {"node-b": at(0)}
    early = plan(
        job(), observed(*pods, nodes_not_ready=lost_since), at(10), CONFIG, status=running_status()
    )
    assert early.status["phase"] == "Running" and early.requeue_after == pytest.approx(20)
    late = plan(
        job(), observed(*pods, nodes_not_ready=lost_since), at(31), CONFIG, status=running_status()
    )
    assert late.status["phase"] == "Restarting" and late.gang_restart == "NodeLost"


def test_a_pod_that_vanishes_from_a_running_gang_restarts_it():
    pods = gang()[:2]  # llm-worker-1 deleted by hand (or evicted and removed)
    p = plan(job(), observed(*pods), at(0), CONFIG, status=running_status())
    assert p.status["phase"] == "Restarting"
    assert "llm-worker-1" in find(p.status["conditions"], "Restarting")["message"]


def test_stale_status_cannot_undo_a_restart():
    # The cache still says restart 0, but generation-1 pods exist: they are kept.
    p = plan(job(), observed(*gang(restart=1)), at(0), CONFIG, status=running_status(0))
    assert p.status["restartCount"] == 1
    assert p.delete == []


def test_rejections_become_a_condition_with_the_apiservers_message():
    status = with_rejections(
        {"phase": "Pending"},
        [("Pod", "llm-master-0", 403, 'pods "llm-master-0" is forbidden: exceeded quota: q')],
        at(0),
    )
    condition = find(status["conditions"], "ChildrenRejected")
    assert condition["status"] == "True" and "exceeded quota" in condition["message"]
    missing_crd = with_rejections(
        {}, [("PodGroup", "llm", 404, "the server could not find the requested resource")], at(0)
    )
    assert find(missing_crd["conditions"], "ChildrenRejected")["reason"] == "PodGroupCRDMissing"
    held_name = with_rejections(
        {}, [("Service", "llm", 409, 'Service "llm" already exists and is not ...')], at(0)
    )
    assert find(held_name["conditions"], "ChildrenRejected")["reason"] == "NameConflict"
    cleared = with_rejections(status, [], at(1))
    assert find(cleared["conditions"], "ChildrenRejected")["status"] == "False"


def test_a_template_spec_of_the_wrong_shape_is_an_invalid_spec_not_a_crash():
    spec = {"worker": {"replicas": 1, "template": {"spec": {"containers": "trainer"}}}}
    p = plan(job(**spec), observed(), at(0), CONFIG, status={})
    assert p.status["phase"] == "Failed" and p.create == []
    assert "template.spec" in find(p.status["conditions"], "Failed")["message"]


def test_scraped_progress_and_new_checkpoints_land_in_the_status():
    figures = {"step": 120, "loss": 1.9, "updateTime": stamp(9)}
    p = plan(
        job(),
        observed(*gang(), progress=figures, checkpoint_step=100),
        at(10),
        CONFIG,
        status=running_status(),
    )
    assert p.status["progress"] == figures
    assert p.status["lastCheckpoint"] == {"step": 100, "time": stamp(9)}  # when scraped
    same = plan(
        job(),
        observed(*gang(), progress=figures, checkpoint_step=100),
        at(20),
        CONFIG,
        status=p.status,
    )
    assert same.status == p.status  # the checkpoint time is that of its first sighting


@pytest.mark.parametrize(
    ("spec", "expected_step", "expected_percent"),
    [
        ({}, 300, 100),  # torchfleet-train exits 0 only after its last step
        ({"command": ["torchrun", "train.py"]}, 270, 90),  # a user's script: as last seen
    ],
)
def test_success_completes_the_trainers_progress_only(spec, expected_step, expected_percent):
    last_scrape = {"step": 270, "totalSteps": 300, "percent": 90, "etaSeconds": 6}
    done = gang(phase="Succeeded")
    status = running_status() | {"progress": last_scrape}
    p = plan(job(**spec), observed(*done), at(50), CONFIG, status=status)
    assert p.status["phase"] == "Succeeded"
    progress = p.status["progress"]
    assert (progress["step"], progress["percent"]) == (expected_step, expected_percent)
    assert ("etaSeconds" in progress) is (expected_step != 300)


def test_a_pod_being_deleted_by_someone_else_restarts_a_running_gang():
    going = dataclasses.replace(pod("llm", 0), deleting=True)
    p = plan(job(), observed(*gang(**{going.name: going})), at(0), CONFIG, status=running_status())
    assert p.status["phase"] == "Restarting" and p.status["restartCount"] == 1
    # ...but the operator's own deletions are not failures.
    ours = observed(*gang(**{going.name: going}), expected_deleted=frozenset({going.uid}))
    assert plan(job(), ours, at(0), CONFIG, status=running_status()).status["restartCount"] == 0


def test_children_refused_a_moment_ago_wait_for_their_backoff():
    seen = Observed(has_service=True, held=frozenset({"llm-master-0"}))
    assert created_names(plan(job(), seen, at(0), CONFIG, status={})) == [
        "llm-worker-0",
        "llm-worker-1",
    ]


def test_pods_wait_while_their_pod_group_is_refused():
    seen = Observed(has_service=True, held=frozenset({"llm"}))
    p = plan(job(scheduling={"podGroup": "Volcano"}), seen, at(0), CONFIG, status={})
    assert p.create == []


@pytest.mark.parametrize(
    ("seen", "status", "expected_kinds"),
    [
        (observed(), {}, ["PodGroup", "Pod", "Pod", "Pod"]),  # a new job
        (observed(pod("llm", 0)), {"phase": "Pending"}, ["PodGroup", "Pod", "Pod"]),  # forming
        (observed(*gang()), running_status(), []),  # complete
        # the missing pod was refused a moment ago: nothing to post before its back-off
        (observed(*gang()[:2], held=frozenset({"llm-worker-1"})), {"phase": "Pending"}, []),
    ],
)
def test_pod_group_is_posted_with_every_batch_of_pods(seen, status, expected_kinds):
    p = plan(job(scheduling={"podGroup": "Coscheduling"}), seen, at(0), CONFIG, status=status)
    assert [m["kind"] for m in p.create] == expected_kinds


def test_pod_group_is_posted_again_for_the_next_generation():
    # The group is not watched: posting it with the new gang (a 409 when it is
    # still there) brings back one deleted by hand before the gang schedules.
    grouped = job(scheduling={"podGroup": "Volcano"})
    failed = pod("llm", 1, phase="Failed", exit_code=137)
    restarting = plan(
        grouped, observed(*gang(**{failed.name: failed})), at(100), CONFIG, running_status()
    )
    due = plan(grouped, observed(), at(111), CONFIG, status=restarting.status)
    assert [m["kind"] for m in due.create] == ["PodGroup", "Pod", "Pod", "Pod"]


def test_a_job_being_deleted_keeps_its_status_and_touches_nothing():
    """Held by someone's finalizer, it is still read until it goes."""
    status = plan(job(), observed(*gang()), at(5), CONFIG, status={}).status
    deleting = job()
    deleting["metadata"]["deletionTimestamp"] = stamp(6)
    decided = plan(deleting, observed(*gang()), at(7), CONFIG, status=status)
    assert decided.status == status and decided.status["phase"] == "Running"
    assert decided.create == [] and decided.delete == [] and decided.events == []
    assert after_execute(decided.status, status, [], False, at(7)) == status
