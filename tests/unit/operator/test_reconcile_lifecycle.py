"""plan/after_execute under real failures: upgrades, disruptions, deadlines, sidecars."""

from __future__ import annotations

import dataclasses

import pytest

from torchfleet_operator.api.parse import InvalidSpecError, parse_training_job
from torchfleet_operator.desired.pods import build_pod
from torchfleet_operator.observed import ObservedPod
from torchfleet_operator.reconcile import plan
from torchfleet_operator.status.conditions import find
from torchfleet_operator.status.rejections import after_execute

from .builders import (
    CONFIG,
    at,
    deleted_names,
    gang,
    job,
    literal_env,
    observed,
    pod,
    running_status,
    stamp,
)

# ---- 1. a stored spec this operator no longer understands ----------------------------------

UNKNOWN_FIELD = {"futureField": 1}


def test_a_running_job_whose_spec_stops_parsing_keeps_running_with_its_pods():
    p = plan(job(**UNKNOWN_FIELD), observed(*gang()), at(10), CONFIG, status=running_status())
    assert p.delete == [] and p.create == [] and not p.delete_job
    assert p.status["phase"] == "Running"
    condition = find(p.status["conditions"], "SpecNotUnderstood")
    assert condition["status"] == "True" and "futureField" in condition["message"]
    assert [(e.type, e.reason) for e in p.events] == [("Warning", "SpecNotUnderstood")]
    # The next pass says nothing new: one event, not one per pass.
    again = plan(job(**UNKNOWN_FIELD), observed(*gang()), at(11), CONFIG, status=p.status)
    assert again.events == [] and again.status == p.status


def test_a_value_outside_a_new_bound_is_not_understood_either():
    body = job(runPolicy={"backoffLimit": -5})
    p = plan(body, observed(*gang()), at(10), CONFIG, status=running_status())
    assert p.status["phase"] == "Running" and p.delete == []
    assert "backoffLimit" in find(p.status["conditions"], "SpecNotUnderstood")["message"]


def test_a_finished_job_keeps_its_phase_and_its_ttl_whatever_the_spec_says():
    status = {
        "phase": "Succeeded",
        "completionTime": stamp(0),
        "conditions": [{"type": "Succeeded", "status": "True", "reason": "Succeeded"}],
    }
    body = job(runPolicy={"ttlSecondsAfterFinished": 30, "backoffLimit": -1}, **UNKNOWN_FIELD)
    early = plan(body, observed(), at(10), CONFIG, status=status)
    assert early.status["phase"] == "Succeeded" and not early.delete_job
    assert early.requeue_after == pytest.approx(20)
    assert plan(body, observed(), at(30), CONFIG, status=status).delete_job


def test_a_suspended_job_with_a_spec_not_understood_reports_it_and_does_not_start():
    body = job(suspend=True, **UNKNOWN_FIELD)
    p = plan(body, observed(), at(0), CONFIG, status={"phase": "Suspended"})
    assert p.create == [] and p.status["phase"] == "Suspended"
    assert find(p.status["conditions"], "SpecNotUnderstood")["status"] == "True"
    # Resumed while still not understood, having run before: it still creates nothing.
    resumed = plan(
        job(**UNKNOWN_FIELD),
        observed(),
        at(1),
        CONFIG,
        status={**p.status, "startTime": stamp(0)},
    )
    assert resumed.create == [] and resumed.status["phase"] != "Failed"


def test_a_job_that_never_had_a_gang_is_still_gated_by_full_validation():
    p = plan(job(**UNKNOWN_FIELD), observed(), at(0), CONFIG, status={})
    assert p.status["phase"] == "Failed"
    assert find(p.status["conditions"], "Failed")["reason"] == "InvalidSpec"


def test_the_condition_clears_once_the_spec_parses_again():
    broken = plan(job(**UNKNOWN_FIELD), observed(*gang()), at(0), CONFIG, status=running_status())
    fixed = plan(job(), observed(*gang()), at(1), CONFIG, status=broken.status)
    assert find(fixed.status["conditions"], "SpecNotUnderstood")["status"] == "False"


# ---- 7. one author of the status -------------------------------------------------------------


def test_after_execute_adds_refusals_and_keeps_a_standing_one():
    decided = plan(job(), observed(), at(0), CONFIG, status={}).status
    refused = after_execute(decided, {}, [("Pod", "llm-master-0", 403, "quota")], False, at(0))
    condition = find(refused["conditions"], "ChildrenRejected")
    assert condition["status"] == "True" and "quota" in condition["message"]
    # Next pass: the refused pod waits for its back-off, nothing was tried, the refusal stands.
    held = after_execute(decided, refused, [], True, at(1))
    assert find(held["conditions"], "ChildrenRejected") == condition
    # Retried and accepted: cleared.
    next_plan = plan(job(), observed(), at(2), CONFIG, status=refused).status
    accepted = after_execute(next_plan, refused, [], False, at(2))
    assert find(accepted["conditions"], "ChildrenRejected")["status"] == "False"


INVALID_POD = (
    "Pod",
    "llm-worker-0",
    422,
    'Pod "llm-worker-0" is invalid: spec.containers[0].volumeMounts[0].name: Not found: "nope"',
)


@pytest.mark.parametrize(
    "refusal, spec_edited, fails",
    [
        pytest.param(INVALID_POD, False, True, id="422 invalid pod: permanent"),
        pytest.param(("Pod", "llm-worker-0", 400, "bad request"), False, True, id="400 too"),
        pytest.param(
            ("Pod", "llm-worker-0", 403, "exceeded quota"), False, False, id="403 retried"
        ),
        pytest.param(("PodGroup", "llm", 422, "invalid"), False, False, id="not a pod"),
        pytest.param(INVALID_POD, True, False, id="template edited since: tried again"),
    ],
)
def test_a_pod_refused_as_invalid_fails_the_job_instead_of_retrying_for_ever(
    refusal, spec_edited, fails
):
    decided = plan(job(), observed(), at(0), CONFIG, status={}).status
    refused = after_execute(
        decided, {}, [("Pod", "llm-master-0", 403, "quota"), refusal], False, at(0)
    )
    if fails:  # the permanent refusal is the one the condition names
        assert find(refused["conditions"], "ChildrenRejected")["reason"] == "PodInvalid"
    body = job()
    if spec_edited:
        body["metadata"]["generation"] = 2
    pods = gang()[:1]  # a master created before the worker was refused
    p = plan(body, observed(*pods), at(1), CONFIG, status=refused)
    if not fails:
        assert p.status.get("phase") != "Failed"
        return
    failed = find(p.status["conditions"], "Failed")
    assert p.status["phase"] == "Failed" and failed["reason"] == "InvalidSpec"
    assert failed["message"].startswith("the API server refused the pod template: Pod llm-worker-0")
    assert refusal[3] in failed["message"] and p.create == []
    assert deleted_names(p) == ["llm-master-0"]  # it holds nothing: the job cannot run
    assert [(e.type, e.reason) for e in p.events] == [("Warning", "InvalidSpec")]


# ---- 3. disruptions, first failure, never-started pods ------------------------------------


def test_a_disruption_restarts_without_counting_toward_the_backoff_limit():
    preempted = pod(
        "llm", 1, phase="Failed", reason="PreemptionByScheduler", disrupted=True, exit_code=143
    )
    p = plan(
        job(runPolicy={"backoffLimit": 0}),
        observed(*gang(**{preempted.name: preempted})),
        at(0),
        CONFIG,
        status=running_status(),
    )
    assert p.status["phase"] == "Restarting"
    assert p.status["restartCount"] == 1 and p.status["disruptions"] == 1
    assert p.gang_restart == p.disruption == "PreemptionByScheduler"
    assert "not counted" in find(p.status["conditions"], "Restarting")["message"]
    # The next (program) failure is the first counted one: backoffLimit 0 fails it.
    failed = pod("llm", 0, restart=1, phase="Failed", exit_code=137)
    after = plan(
        job(runPolicy={"backoffLimit": 0}),
        observed(*gang(restart=1, **{failed.name: failed})),
        at(60),
        CONFIG,
        status={**running_status(1), "disruptions": 1},
    )
    assert find(after.status["conditions"], "Failed")["reason"] == "BackoffLimitExceeded"


@pytest.mark.parametrize(
    ("oom_at", "exit_1_at", "outcome"),
    [(1, 2, "Restarting"), (3, 2, "Failed"), (2, 2, "Restarting")],
)
def test_the_first_failure_by_finished_at_decides_the_batch(oom_at, exit_1_at, outcome):
    oom = pod("llm", 1, phase="Failed", exit_code=137, finished_at=at(oom_at))
    peer = pod("llm", 2, phase="Failed", exit_code=1, finished_at=at(exit_1_at))
    p = plan(
        job(runPolicy={"restartPolicy": "ExitCode"}),
        observed(*gang(**{oom.name: oom, peer.name: peer})),
        at(15),  # past the settle time: the batch is complete
        CONFIG,
        status=running_status(),
    )
    assert p.status["phase"] == outcome


@pytest.mark.parametrize(
    ("now", "master_phase", "outcome", "wake_in"),
    [
        # The peer's exit 1 arrived first; the OOM kill may still be on its way.
        (3, "Running", "Running", CONFIG.failure_settle_seconds - 1),
        (2 + CONFIG.failure_settle_seconds, "Running", "Failed", None),
        # Every pod of the gang has ended: nothing more will come.
        (3, "Failed", "Failed", None),
        # A kubelet clock ahead of ours: never longer than the settle time.
        (-60, "Running", "Running", CONFIG.failure_settle_seconds),
    ],
)
def test_a_job_ending_failure_waits_for_the_rest_of_its_batch(now, master_phase, outcome, wake_in):
    peer = pod("llm", 1, phase="Failed", exit_code=1, finished_at=at(2))
    ended = {"exit_code": 1, "finished_at": at(2)} if master_phase == "Failed" else {}
    master = pod("llm", 0, phase=master_phase, **ended)
    p = plan(
        job(workers=1, runPolicy={"restartPolicy": "ExitCode"}),
        observed(master, peer),
        at(now),
        CONFIG,
        status=running_status(),
    )
    assert p.status["phase"] == outcome
    if wake_in is not None:
        assert p.requeue_after == pytest.approx(wake_in)
        assert p.delete == [] and p.create == [] and p.gang_restart is None


def test_an_oom_kill_reported_after_its_peers_exit_1_restarts_the_gang():
    """The batch in pieces: exit 1 seen first (no decision), then the OOM kill."""
    peer = pod("llm", 1, phase="Failed", exit_code=1, finished_at=at(2))
    spec = {"runPolicy": {"restartPolicy": "ExitCode"}}
    first = plan(
        job(workers=1, **spec), observed(pod("llm", 0), peer), at(4), CONFIG, running_status()
    )
    assert first.status["phase"] == "Running"
    oom = pod("llm", 0, phase="Failed", exit_code=137, finished_at=at(1))
    second = plan(job(workers=1, **spec), observed(oom, peer), at(5), CONFIG, first.status)
    assert second.status["phase"] == "Restarting" and second.gang_restart == "PodFailed"


ADMISSION_FAILURE = {
    "metadata": {
        "name": "llm-worker-0",
        "uid": "u",
        "labels": {
            "torchfleet.dev/node-rank": "1",
            "torchfleet.dev/restart": "0",
            "torchfleet.dev/role": "worker",
        },
    },
    "spec": {"nodeName": "node-a"},
    "status": {
        "phase": "Failed",
        "reason": "UnexpectedAdmissionError",
        "message": "Allocate failed due to no healthy devices present",
    },
}


def test_a_pod_that_never_started_restarts_even_under_never_with_the_kubelets_reason():
    never = ObservedPod.from_manifest(ADMISSION_FAILURE)
    assert never is not None and never.never_started
    p = plan(
        job(runPolicy={"restartPolicy": "Never"}),
        observed(*gang(**{never.name: never})),
        at(0),
        CONFIG,
        status=running_status(),
    )
    assert p.status["phase"] == "Restarting"
    assert p.gang_restart == "UnexpectedAdmissionError" and p.disruption is None
    assert "no healthy devices" in find(p.status["conditions"], "Restarting")["message"]


# ---- 4. time limits ----------------------------------------------------------------------------


def test_start_time_is_the_first_unsuspended_pass_and_resets_on_resume():
    first = plan(job(), observed(), at(3), CONFIG, status={})
    assert first.status["startTime"] == stamp(3) and first.status["phase"] == "Pending"
    suspended = plan(job(suspend=True), observed(), at(10), CONFIG, status=first.status)
    assert suspended.status["startTime"] == stamp(3)
    resumed = plan(job(), observed(), at(500), CONFIG, status=suspended.status)
    assert resumed.status["startTime"] == stamp(500)


def test_a_gang_that_never_schedules_times_out_and_holds_no_pods():
    body = job(runPolicy={"activeDeadlineSeconds": 60})
    pending = gang(phase="Pending")
    status = plan(body, observed(*pending), at(0), CONFIG, status={}).status
    p = plan(body, observed(*pending), at(60), CONFIG, status=status)
    assert find(p.status["conditions"], "Failed")["reason"] == "DeadlineExceeded"
    assert deleted_names(p) == ["llm-master-0", "llm-worker-0", "llm-worker-1"]


def test_backoff_limit_exceeded_deletes_every_pod_whatever_clean_pod_policy_says():
    failed = pod("llm", 1, phase="Failed", exit_code=137)
    p = plan(
        job(runPolicy={"backoffLimit": 0, "cleanPodPolicy": "None"}),
        observed(*gang(**{failed.name: failed})),
        at(0),
        CONFIG,
        status=running_status(),
    )
    assert find(p.status["conditions"], "Failed")["reason"] == "BackoffLimitExceeded"
    assert deleted_names(p) == ["llm-master-0", "llm-worker-0", "llm-worker-1"]


# ---- 5. the trainer container decides, not the pod -------------------------------------------


def sidecar_pod(rank: int, trainer_exit: int) -> ObservedPod:
    role = "master" if rank == 0 else "worker"
    name = "llm-master-0" if rank == 0 else f"llm-worker-{rank - 1}"
    summary = ObservedPod.from_manifest(
        {
            "metadata": {
                "name": name,
                "uid": name,
                "labels": {
                    "torchfleet.dev/node-rank": str(rank),
                    "torchfleet.dev/restart": "0",
                    "torchfleet.dev/role": role,
                },
            },
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {"name": "log-shipper", "state": {"running": {}}},
                    {
                        "name": "trainer",
                        "state": {
                            "terminated": {
                                "exitCode": trainer_exit,
                                "finishedAt": "2026-01-01T12:00:01Z",
                                "message": "Traceback ...\nValueError: bad batch",
                            }
                        },
                    },
                ],
            },
        }
    )
    assert summary is not None
    return summary


def test_a_trainer_failing_beside_a_running_sidecar_restarts_the_gang():
    failed = sidecar_pod(2, trainer_exit=1)
    assert failed.phase == "Failed" and failed.sidecars_running
    p = plan(
        job(), observed(*gang(**{failed.name: failed})), at(5), CONFIG, status=running_status()
    )
    assert p.status["phase"] == "Restarting"
    assert "ValueError: bad batch" in find(p.status["conditions"], "Restarting")["message"]
    # The pod whose sidecar still runs gets its grace period, not a force delete.
    grace = {ref.name: ref.grace_period_seconds for ref in p.delete}
    assert grace["llm-worker-1"] is None


def test_a_trainer_succeeding_beside_a_sidecar_succeeds_and_stops_the_sidecar():
    done = sidecar_pod(0, trainer_exit=0)
    p = plan(job(), observed(*gang(**{done.name: done})), at(5), CONFIG, status=running_status())
    assert p.status["phase"] == "Succeeded"
    assert "llm-master-0" in deleted_names(p)


# ---- 6. say why ----------------------------------------------------------------------------------


def test_a_pending_gang_says_why_from_the_scheduler_and_clears_once_scheduled():
    unscheduled = dataclasses.replace(
        pod("llm", 1, phase="Pending"),
        unschedulable="Unschedulable: 0/4 nodes are available: insufficient nvidia.com/gpu",
    )
    pods = gang(phase="Running", **{unscheduled.name: unscheduled})
    p = plan(job(), observed(*pods), at(1), CONFIG, status={})
    condition = find(p.status["conditions"], "Scheduled")
    assert condition["status"] == "False" and condition["reason"] == "Unschedulable"
    assert condition["message"] == (
        "pod llm-worker-0: 0/4 nodes are available: insufficient nvidia.com/gpu"
    )
    scheduled = plan(job(), observed(*gang()), at(2), CONFIG, status=p.status)
    assert find(scheduled.status["conditions"], "Scheduled")["status"] == "True"


def test_the_trainer_container_falls_back_to_its_logs_for_the_termination_message():
    spec = parse_training_job(job()).spec
    built = build_pod("llm", "team", "uid-1", spec, 0, 0, "img")
    assert built["spec"]["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_a_long_termination_message_keeps_its_tail():
    manifest = {
        **ADMISSION_FAILURE,
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "trainer",
                    "state": {
                        "terminated": {
                            "exitCode": 2,
                            "finishedAt": "2026-01-01T12:00:01Z",
                            "message": "x" * 5000
                            + "torchrun: error: argument --node_rank: invalid int value",
                        }
                    },
                }
            ],
        },
    }
    summary = ObservedPod.from_manifest(manifest)
    assert summary is not None and summary.message is not None
    assert len(summary.message) < 500 and summary.message.endswith("invalid int value")


@pytest.mark.parametrize("variable", ["$(RANK)", "$(WORLD_SIZE)"])
def test_per_process_variables_in_the_command_need_one_process_per_node(variable):
    several = job(command=["torchrun", f"--node_rank={variable}", "t.py"], processesPerNode=4)
    with pytest.raises(InvalidSpecError, match=r"\$\(NODE_RANK\)"):
        parse_training_job(several)
    in_args = job(command=["torchrun"], args=[variable], processesPerNode=2)
    with pytest.raises(InvalidSpecError):
        parse_training_job(in_args)
    parse_training_job(job(command=["echo", variable], processesPerNode=1))


# ---- 2. a node that never comes back --------------------------------------------------------


def env_of(restart: int) -> dict[str, str]:
    spec = parse_training_job(job(processesPerNode=2)).spec
    built = build_pod("llm", "team", "uid-1", spec, 1, restart, "img")
    return literal_env(built)


def test_each_gang_generation_has_its_own_rendezvous():
    old, new = env_of(3), env_of(4)
    assert old["PET_RDZV_ID"] == "llm-gen3" and new["PET_RDZV_ID"] == "llm-gen4"
    assert old["MASTER_PORT"] != new["MASTER_PORT"]
    assert old["PET_MASTER_PORT"] == old["MASTER_PORT"]
    assert old["MASTER_ADDR"] == new["MASTER_ADDR"]  # the same name, another rendezvous


def test_old_pods_stuck_on_a_lost_node_are_force_deleted_after_the_grace():
    config = dataclasses.replace(CONFIG, node_loss_force_delete_seconds=60)
    stuck = dataclasses.replace(pod("llm", 2, node_name="node-b"), deleting=True)
    status = {**running_status(1), "phase": "Restarting"}
    lost = {"node-b": at(0)}
    early = plan(job(), observed(stuck, nodes_not_ready=lost), at(30), config, status=status)
    assert early.delete == [] and early.requeue_after == pytest.approx(30)
    created = find(early.status["conditions"], "Created")["message"]
    assert "llm-worker-1 (node node-b)" in created
    late = plan(job(), observed(stuck, nodes_not_ready=lost), at(60), config, status=status)
    assert [(r.name, r.grace_period_seconds) for r in late.delete] == [("llm-worker-1", 0)]
    # out-of-service taint: at once.
    tainted = plan(
        job(), observed(stuck, nodes_not_ready={"node-b": None}), at(1), config, status=status
    )
    assert [r.grace_period_seconds for r in tainted.delete] == [0]


def test_an_image_pull_back_off_past_its_bound_restarts_with_the_kubelets_reason():
    config = dataclasses.replace(CONFIG, image_pull_bound_seconds=120)
    stuck = dataclasses.replace(
        pod("llm", 1, phase="Pending"),
        stuck_reason="ImagePullBackOff",
        stuck_message='Back-off pulling image "registry/trainer:typo"',
        started_at=at(0),
    )
    pods = gang(**{stuck.name: stuck})
    status = {**running_status(), "phase": "Pending"}
    early = plan(job(), observed(*pods), at(60), config, status=status)
    assert early.gang_restart is None and early.requeue_after == pytest.approx(60)
    late = plan(job(), observed(*pods), at(120), config, status=status)
    assert late.gang_restart == "ImagePullBackOff" and late.disruption is None
    assert "registry/trainer:typo" in find(late.status["conditions"], "Restarting")["message"]


def test_a_job_failed_for_its_invalid_spec_is_not_reported_twice():
    failed = plan(job(**UNKNOWN_FIELD), observed(), at(0), CONFIG, status={}).status
    again = plan(job(**UNKNOWN_FIELD), observed(), at(1), CONFIG, status=failed)
    assert again.events == [] and again.status == failed


def test_peers_exiting_1_after_a_preempted_rank_do_not_fail_the_job():
    preempted = pod(
        "llm", 1, phase="Failed", exit_code=143, disrupted=True, reason="PreemptionByScheduler",
        finished_at=at(1),
    )  # fmt: skip
    peer = pod("llm", 2, phase="Failed", exit_code=1, finished_at=at(3))
    p = plan(
        job(runPolicy={"restartPolicy": "ExitCode"}),
        observed(*gang(**{preempted.name: preempted, peer.name: peer})),
        at(5),
        CONFIG,
        status=running_status(),
    )
    assert p.status["phase"] == "Restarting" and p.disruption == "PreemptionByScheduler"
