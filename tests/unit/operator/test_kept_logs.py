"""policy/kept_logs.py and the failure policy's use of it: which kept log file a
gang restart's condition and event name. One row per case."""

from __future__ import annotations

from typing import Any

import pytest

from torchfleet_contract import pod as contract
from torchfleet_operator.policy import kept_logs
from torchfleet_operator.reconcile import plan
from torchfleet_operator.status.conditions import find

from .builders import CONFIG, at, gang, job, observed, pod, running_status, spec_of

TRAINER = {"training": {"steps": 10, "globalBatchSize": 12}}
CKPT = {"claimName": "ckpt"}


def keeping(generations: str, replicas: int = 2) -> dict[str, Any]:
    """A worker role whose trainer container keeps ``generations`` of logs."""
    env = [{"name": contract.LOG_KEEP_GENERATIONS, "value": generations}]
    container = {"name": "trainer", "env": env}
    return {"replicas": replicas, "template": {"spec": {"containers": [container]}}}


@pytest.mark.parametrize(
    ("spec", "restart", "round_", "rank", "phrase"),
    [
        (
            {"checkpoint": CKPT},
            0,
            0,
            2,
            "its output is kept in /checkpoints/logs/gen-0/round-0/rank-2.log on the "
            "checkpoint volume",
        ),
        (
            {"checkpoint": CKPT | {"mountPath": "/ckpt"}, "processesPerNode": 4},
            3,
            1,
            1,
            "its ranks' output is kept in /ckpt/logs/gen-3/round-1/rank-4.log to rank-7.log "
            "on the checkpoint volume",
        ),
        (  # the trainer's own checkpoint.dir is where it writes
            {
                "checkpoint": CKPT,
                "trainer": {
                    "checkpoint": {"dir": "/checkpoints/run-a/"},
                    "training": {"globalBatchSize": 12},
                },
            },
            1,
            0,
            0,
            "its output is kept in /checkpoints/run-a/logs/gen-1/round-0/rank-0.log on the "
            "checkpoint volume",
        ),
        (  # an elastic job's ranks change per round: the generation's folder
            {"checkpoint": CKPT, "elastic": {"minNodes": 2, "maxNodes": 3}},
            2,
            0,
            1,
            "the ranks' output is kept under /checkpoints/logs/gen-2/ on the checkpoint volume",
        ),
        ({}, 0, 0, 1, None),  # no checkpoint volume: nothing kept
        ({"checkpoint": CKPT, "command": ["python", "x.py"]}, 0, 0, 1, None),  # own command
        ({"checkpoint": CKPT, "worker": keeping("0")}, 0, 0, 1, None),  # turned off
        ({"checkpoint": CKPT, "worker": keeping(" 00 ")}, 0, 0, 1, None),
        (  # turned off for the workers only: the master keeps its own
            {"checkpoint": CKPT, "worker": keeping("0")},
            0,
            0,
            0,
            "its output is kept in /checkpoints/logs/gen-0/round-0/rank-0.log on the "
            "checkpoint volume",
        ),
        (  # kept, if fewer generations
            {"checkpoint": CKPT, "worker": keeping("2")},
            0,
            0,
            1,
            "its output is kept in /checkpoints/logs/gen-0/round-0/rank-1.log on the "
            "checkpoint volume",
        ),
    ],
)
def test_the_pods_kept_logs(spec, restart, round_, rank, phrase):
    assert kept_logs.pod_logs(spec_of(**spec), restart, round_, rank) == phrase


def test_a_rounds_folder_is_named_while_any_role_keeps_its_logs():
    for spec, named in (({"worker": keeping("0")}, True), ({}, True)):
        assert (kept_logs.round_logs(spec_of(checkpoint=CKPT, **spec), 0, 0) is not None) == named
    off = {"containers": [keeping("0")["template"]["spec"]["containers"][0]]}
    both_off = spec_of(checkpoint=CKPT, worker=keeping("0"), master={"template": {"spec": off}})
    assert kept_logs.round_logs(both_off, 0, 0) is None


def failed_pass(status: dict[str, Any], **spec: Any) -> Any:
    """Worker 2 of a running gang exited 1 under OnFailure."""
    pods = [*gang("llm", 3)[:2], pod("llm", 2, phase="Failed", exit_code=1, finished_at=at(5))]
    body = job(status=running_status(**status), runPolicy={"restartPolicy": "OnFailure"}, **spec)
    return plan(body, observed(*pods), at(10), CONFIG)


def test_a_gang_restart_names_the_failed_pods_log_file_in_its_condition_and_event():
    status = {"inPlaceRestarts": {"total": 1, "gang": 0, "inGang": 1}}
    decided = failed_pass(status, checkpoint=CKPT, trainer=TRAINER)
    named = "its output is kept in /checkpoints/logs/gen-0/round-1/rank-2.log"
    restarting = find(decided.status["conditions"], "Restarting")
    assert restarting and named in restarting["message"], restarting
    (event,) = [e for e in decided.events if e.reason == "PodFailed"]
    assert named in event.message


def test_a_permanent_failure_names_it_too_and_a_pod_that_never_ran_does_not():
    body = job(status=running_status(), runPolicy={"restartPolicy": "Never"}, checkpoint=CKPT)
    pods = [*gang("llm", 3)[:2], pod("llm", 2, phase="Failed", exit_code=3, finished_at=at(5))]
    decided = plan(body, observed(*gang("llm", 3)[:2], *pods[2:]), at(30), CONFIG)
    failed = find(decided.status["conditions"], "Failed")
    assert failed and "rank-2.log" in failed["message"], failed
    evicted = [*gang("llm", 3)[:2], pod("llm", 2, phase="Failed", disrupted=True, reason="Evicted")]
    decided = plan(
        job(status=running_status(), checkpoint=CKPT), observed(*evicted), at(10), CONFIG
    )
    restarting = find(decided.status["conditions"], "Restarting")
    assert restarting and "kept" not in restarting["message"], restarting


def test_a_pod_whose_ranks_lost_a_peer_names_the_rounds_folder_not_its_own_files():
    """Exit 202: the rank that failed is another pod's, not reported yet."""
    pods = [*gang("llm", 3)[1:], pod("llm", 0, phase="Failed", exit_code=202, finished_at=at(5))]
    body = job(status=running_status(), checkpoint=CKPT, trainer=TRAINER)
    decided = plan(body, observed(*pods), at(10), CONFIG)
    restarting = find(decided.status["conditions"], "Restarting")
    assert restarting, decided.status["conditions"]
    assert restarting["message"].endswith(
        "every rank's output of the round is kept under /checkpoints/logs/gen-0/round-0/ "
        "on the checkpoint volume"
    ), restarting
