"""policy/failure.py: classify, fail or restart, wait for the old gang. One row per case."""

from __future__ import annotations

import dataclasses

import pytest

from torchfleet_operator.policy import failure
from torchfleet_operator.policy.failure import Failure
from torchfleet_operator.reconcile import plan
from torchfleet_operator.status.conditions import find

from .builders import (
    CONFIG,
    a_pass,
    at,
    created_names,
    deleted_names,
    gang,
    job,
    observed,
    pod,
    running_status,
    spec_of,
    stamp,
)


@pytest.mark.parametrize(
    ("restart_policy", "code", "retryable_codes", "permanent_codes", "retryable"),
    [
        ("OnFailure", 1, (), (), True),
        ("Never", 137, (), (), False),
        ("ExitCode", 1, (), (), False),  # the program's own error
        ("ExitCode", 137, (), (), True),  # a signal: OOM kill, preemption
        ("ExitCode", None, (), (), True),  # never exited: not the program's verdict
        ("ExitCode", 3, (3,), (), True),  # an explicit list wins over the policy
        ("OnFailure", 3, (), (3,), False),
        ("Never", 3, (3,), (), True),
    ],
)
def test_exit_is_retryable(restart_policy, code, retryable_codes, permanent_codes, retryable):
    assert (
        failure.exit_is_retryable(restart_policy, code, retryable_codes, permanent_codes)
        is retryable
    )


@pytest.mark.parametrize(
    ("restarts", "base", "cap", "seconds"),
    [(0, 10, 300, 10), (1, 10, 300, 20), (5, 10, 300, 300), (10_000, 10, 300, 300), (3, 0, 300, 0)],
)
def test_restart_backoff_doubles_up_to_its_cap(restarts, base, cap, seconds):
    assert failure.restart_backoff(restarts, base, cap) == seconds


def test_the_first_to_exit_decides_and_an_exit_comes_before_a_taking():
    oom = Failure("w1", "PodFailed", 137, True, "", finished_at=at(1))
    peer = Failure("w0", "PodFailed", 1, False, "", finished_at=at(2))
    taken = Failure("w2", "Evicted", None, True, "", disruption=True)
    assert failure.first_failure([peer, taken, oom]) is oom
    same_second = Failure("w3", "PodFailed", 1, False, "", finished_at=at(1))
    assert failure.first_failure([same_second, oom]) is oom  # the retryable one is the cause
    # A rank whose collective lost its peer says it is a consequence (202): any
    # other exit is the cause, even one its pod reported a second later.
    lost_peer = Failure("m0", "PodFailed", 202, True, "", finished_at=at(0))
    assert failure.first_failure([lost_peer, oom]) is oom
    assert failure.first_failure([lost_peer, taken]) is lost_peer  # exited before a pod taken


# (pod as seen, node state, status, expected failure reasons)
FAILED = pod("llm", 1, phase="Failed", exit_code=1, finished_at=at(3))
EVICTED = pod("llm", 2, disrupted=True, reason="Evicted")
LOST_NODE = {"node-a": at(-100)}


@pytest.mark.parametrize(
    ("pods", "not_ready", "status", "reasons"),
    [
        (gang(), {}, running_status(), []),
        (gang(**{"llm-worker-0": FAILED}), {}, running_status(), ["PodFailed"]),
        (gang(**{"llm-worker-1": EVICTED}), {}, running_status(), ["Evicted"]),
        (gang(), LOST_NODE, running_status(), ["NodeLost"] * 3),
        (gang(), {"node-a": at(-5)}, running_status(), []),  # within the grace
        # A pod gone from a gang that ran whole is lost; from one still forming, not yet made.
        (gang()[:2], {}, running_status(), ["PodDeleted"]),
        (gang()[:2], {}, {"phase": "Pending", "restartCount": 0}, []),
    ],
)
def test_failures_of_the_current_gang(pods, not_ready, status, reasons):
    step = a_pass(observed(*pods, nodes_not_ready=not_ready), status, now=0)
    found = failure.failures(step, spec_of(), list(pods), 0)
    assert sorted(f.reason for f in found) == sorted(reasons)


def test_a_node_within_its_grace_wakes_the_pass_when_the_grace_ends():
    step = a_pass(observed(*gang(), nodes_not_ready={"node-a": at(-5)}), running_status())
    assert failure.failures(step, spec_of(), list(gang()), 0) == []
    assert step.plan.requeue_after == 25  # node_lost_grace_seconds 30


@pytest.mark.parametrize(
    ("found", "status", "backoff_limit", "phase", "reason", "counted", "disruptions"),
    [
        # A retryable failure restarts the gang and counts.
        ([Failure("llm-worker-0", "PodFailed", 1, True, "")], {}, 3, "Restarting", None, 1, 0),
        # A disruption restarts it without counting.
        (
            [Failure("llm-worker-0", "Evicted", None, True, "", disruption=True)],
            {"countedRestarts": 3},
            3,
            "Restarting",
            None,
            3,
            1,
        ),
        # A spent backoffLimit fails the job.
        (
            [Failure("llm-worker-0", "PodFailed", 1, True, "")],
            {"countedRestarts": 3},
            3,
            "Failed",
            "BackoffLimitExceeded",
            3,
            0,
        ),
        # A permanent failure of a gang that has ended fails it at once.
        (
            [Failure("llm-worker-0", "PodFailed", 1, False, "", finished_at=at(-60))],
            {},
            3,
            "Failed",
            "PodFailedPermanently",
            None,
            0,
        ),
    ],
)
def test_on_failure_restarts_or_fails(
    found, status, backoff_limit, phase, reason, counted, disruptions
):
    pods = gang()
    step = a_pass(
        observed(*pods), running_status(**status), runPolicy={"backoffLimit": backoff_limit}
    )
    spec = spec_of(runPolicy={"backoffLimit": backoff_limit})
    decided = failure.on_failure(step, spec, list(pods), 0, found)
    assert decided.status["phase"] == phase
    assert decided.status.get("countedRestarts") == counted
    assert int(decided.status.get("disruptions") or 0) == disruptions
    if phase == "Restarting":
        assert decided.status["restartCount"] == 1
        assert decided.gang_restart == found[0].reason
        assert sorted(ref.name for ref in decided.delete) == sorted(p.name for p in pods)
        assert decided.requeue_after == 10  # the first back-off
    else:
        assert find(decided.status["conditions"], "Failed")["reason"] == reason
        assert decided.gang_restart is None


def test_a_permanent_failure_waits_for_its_peers_before_failing_the_job():
    found = [Failure("llm-worker-0", "PodFailed", 1, False, "", finished_at=at(-2))]
    step = a_pass(observed(*gang()), running_status())
    decided = failure.on_failure(step, spec_of(), list(gang()), 0, found)
    assert decided.status["phase"] == "Running"  # not decided yet
    assert decided.requeue_after == 8  # failure_settle_seconds 10, 2 already waited


@pytest.mark.parametrize(("now", "waits", "wake"), [(5, True, 5), (11, False, None)])
def test_the_next_gang_waits_out_its_back_off(now, waits, wake):
    restarting = {
        "type": "Restarting",
        "status": "True",
        "reason": "PodFailed",
        "message": "",
        "lastTransitionTime": stamp(0),
    }
    status = running_status(restart=1, phase="Restarting", conditions=[restarting])
    step = a_pass(observed(), status, now=now)
    assert failure.in_restart_backoff(step, 1) is waits
    assert step.plan.requeue_after == wake


@pytest.mark.parametrize(
    ("lost_since", "force_deleted", "wake"),
    [(-70, True, None), (-10, False, 50), (None, True, None)],  # None: out of service
)
def test_terminating_pods_on_a_lost_node_are_force_deleted_past_the_grace(
    lost_since, force_deleted, wake
):
    terminating = dataclasses.replace(pod("llm", 1), deleting=True)
    since = None if lost_since is None else at(lost_since)
    step = a_pass(observed(terminating, nodes_not_ready={"node-a": since}), running_status(1))
    failure.wait_for_terminating(step, 1, [terminating])
    assert [(ref.name, ref.grace_period_seconds) for ref in step.plan.delete] == (
        [("llm-worker-0", 0)] if force_deleted else []
    )
    assert step.plan.requeue_after == wake
    created = step.condition("Created")
    assert created is not None and created.status == "False"
    assert "on lost nodes" in (created.message or "")


def test_a_restart_recorded_before_a_crash_deletes_the_old_gang_and_counts_once():
    """The controller writes a restart's bump before it deletes anything; should it
    crash in between, the next pass (fresh expectations: nothing expected deleted)
    finds the old gang a generation behind, deletes it and counts nothing again."""
    failed = pod("llm", 1, phase="Failed", exit_code=1, finished_at=at(1))
    old_gang = gang(**{"llm-worker-0": failed})
    spec = {"runPolicy": {"restartPolicy": "OnFailure"}}
    restarted = plan(job(**spec), observed(*old_gang), at(2), CONFIG, status=running_status())
    assert restarted.gang_restart == "PodFailed" and restarted.status["restartCount"] == 1
    # The crash: the bump is stored, the deletes never ran.
    after_crash = plan(job(**spec), observed(*old_gang), at(3), CONFIG, status=restarted.status)
    assert deleted_names(after_crash) == sorted(p.name for p in old_gang)
    assert after_crash.gang_restart is None
    assert after_crash.status["restartCount"] == 1
    assert after_crash.status["countedRestarts"] == 1
    assert after_crash.status["phase"] == "Restarting"
    assert created_names(after_crash) == []  # not before the old pods are gone


@pytest.mark.parametrize(
    ("reason", "message", "described"),
    [
        ("OOMKilled", None, "pod llm-worker-0 PodFailed with exit code 137: OOMKilled"),
        ("OOMKilled", "tail", "pod llm-worker-0 PodFailed with exit code 137: OOMKilled: tail"),
        ("Error", "tail", "pod llm-worker-0 PodFailed with exit code 137: tail"),  # says nothing
    ],
)
def test_the_kubelets_reason_is_named_when_it_says_more_than_error(reason, message, described):
    failed = pod("llm", 1, phase="Failed", exit_code=137, reason=reason, message=message)
    assert failure.pod_failure(failed, spec_of()).describe() == described


@pytest.mark.parametrize(
    ("code", "reason", "retryable"),
    [
        (1, "OOMKilled", True),  # torchrun's exit after the kernel killed a worker
        (1, "Error", False),  # the program's own error
        (137, "OOMKilled", True),
    ],
)
def test_an_oom_kill_is_a_signal_whatever_the_main_process_exits(code, reason, retryable):
    failed = pod("llm", 1, phase="Failed", exit_code=code, reason=reason)
    judged = failure.pod_failure(failed, spec_of(runPolicy={"restartPolicy": "ExitCode"}))
    assert judged.retryable is retryable
    assert judged.exit_code == code  # reported as it was
