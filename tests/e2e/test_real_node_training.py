"""Training on the real node: torchfleet-train's gang run by a real kubelet and
containerd (dev/realnode), where every failure the operator acts on is one the
kubelet and the kernel report, not the node agent's reading of them.

One job (a master and a worker, one process each, on synthetic tokens) runs
once per module, with its checkpoint claim made by the operator from a
claimTemplate and bound to a local PersistentVolume on the node; the worker
finds the master by its per-pod DNS name. On its way:

1. held at its save of step 20, a worker's training process is SIGKILLed: its
   launcher restarts the processes in place (the same pods), and they resume
   from step 20;
2. held at its save of step 40, the worker's process is SIGKILLed again: the
   in-place budget is spent, the worker's container exits, the kubelet reports
   it, and the operator restarts the gang (new pods), which resumes from 40;
3. held at step 50, the job is suspended, as Kueue preempts one: the operator
   deletes the pods with their grace period, the kubelet sends the trainer
   SIGTERM, it saves step 50, and the resumed job goes on from step 50 to the
   end.

The tests below each check one part of that run. What the trainer logged comes
from the files it kept on the checkpoint claim (this machine's folder behind
the local volume), which outlive the pods.
"""

from __future__ import annotations

import json
import os
import re
import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_training import events, get_job, wait_job
from tests.fixtures.e2e import E2E_NAMESPACE_PREFIX, Hold, held_at
from tests.fixtures.poll import wait_for
from tests.fixtures.realnode import (
    LOCAL_STORAGE_CLASS,
    REAL_NODE_ONLY,
    rank_pids,
    trainer_on_real_node,
)

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, REAL_NODE_ONLY, pytest.mark.timeout(900)]

NAME = "realtrain"
CLAIM = f"{NAME}-checkpoint"
TOTAL_STEPS = 60
CHECKPOINT_INTERVAL = 20
# The held points, in order: the in-place restart's kill, the gang restart's
# kill, the suspension. 50 is no periodic save: a checkpoint of step 50 can
# only be the save on SIGTERM.
IN_PLACE_KILL_AT, GANG_KILL_AT, SUSPEND_AT = 20, 40, 50
WAIT = 240


def _job() -> dict[str, Any]:
    trainer = {"name": "trainer", "env": [{"name": "OMP_NUM_THREADS", "value": "1"}]}
    template = {"spec": {"containers": [trainer]}}
    return {
        "apiVersion": "torchfleet.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": NAME},
        "spec": {
            "processesPerNode": 1,
            # Two pods on a two-core node: what each may use, not what it needs.
            "resources": {"cpu": "900m", "memory": "2Gi"},
            "checkpoint": {
                "claimTemplate": {
                    "size": "1Gi",
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": LOCAL_STORAGE_CLASS,
                }
            },
            "runPolicy": {"restartPolicy": "OnFailure", "backoffLimit": 3, "inPlaceRestarts": 1},
            "trainer": {
                "model": {"layers": 2, "heads": 2, "dim": 32, "maxSeqLen": 32},
                "data": {"kind": "synthetic", "seqLen": 32},
                "training": {
                    "steps": TOTAL_STEPS,
                    "globalBatchSize": 4,
                    "device": "cpu",
                    "logInterval": 10,
                },
                "parallel": {"dataParallelReplicate": 2, "dataParallelShard": 1},
                # Every save kept: the test finds each on the volume.
                "checkpoint": {"interval": CHECKPOINT_INTERVAL, "keepLast": 4},
            },
            "master": {"template": template},
            "worker": {"replicas": 1, "template": json.loads(json.dumps(template))},
        },
    }


@dataclass
class RealRun:
    namespace: str
    job: dict[str, Any]
    claim_dir: Path
    # The pods' uids at each held point, by pod name.
    uids: list[dict[str, str]]
    # The status once the in-place restart was counted, and once the gang
    # restart was.
    after_in_place: dict[str, Any]
    after_gang_restart: dict[str, Any]
    sigterm_seen: bool
    pods_at_end: list[dict[str, Any]]

    def rank0_events(self, kind: str) -> list[dict[str, Any]]:
        """Rank 0's events of one kind over every kept log (every gang and
        in-place round), in time order."""
        logs = sorted((self.claim_dir / "logs").glob("gen-*/round-*/rank-0.log"))
        found = [e for log in logs for e in events(log.read_text(errors="replace"), kind)]
        return sorted(found, key=lambda e: e["time"])


def _uids(cluster: Any, namespace: str) -> dict[str, str]:
    pods = cluster.get_json("pods", "-n", namespace)["items"]
    return {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
    }


def _kill_worker_rank(cluster: Any, namespace: str) -> None:
    uid = cluster.get_json("pod", f"{NAME}-worker-0", "-n", namespace)["metadata"]["uid"]
    (pid,) = wait_for("the worker's training process", lambda: rank_pids(uid), 60)
    os.kill(pid, signal.SIGKILL)


def _report(cluster: Any, namespace: str, claim_dir: Path) -> str:
    pods = cluster.kubectl("get", "pods,tj,pvc", "-n", namespace, "-o", "wide", check=False).stdout
    event_lines = cluster.kubectl("get", "events", "-n", namespace, check=False).stdout
    tails = {
        str(log.relative_to(claim_dir)): log.read_text(errors="replace")[-1200:]
        for log in sorted(claim_dir.glob("logs/gen-*/round-*/rank-*.log"))
    }
    return f"{pods}\n{event_lines}\nkept logs:\n{json.dumps(tails, indent=1)}"


@pytest.fixture(scope="module")
def real_run(cluster, real_node, python_image, local_volumes, e2e_operator) -> Iterator[RealRun]:
    namespace = f"{E2E_NAMESPACE_PREFIX}real-training-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    claim_dir = local_volumes.provide(namespace, CLAIM)
    job = trainer_on_real_node(_job(), python_image)
    holds = held_at(
        job,
        local_volumes,
        namespace,
        ("checkpoint", IN_PLACE_KILL_AT),
        ("checkpoint", GANG_KILL_AT),
        ("step", SUSPEND_AT),
    )
    try:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job))
        yield _run(cluster, namespace, claim_dir, holds)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{_report(cluster, namespace, claim_dir)}") from None
    finally:
        for hold in holds:
            hold.release()  # a failed run leaves no trainer waiting
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _status(cluster: Any, namespace: str) -> dict[str, Any]:
    status = get_job(cluster, namespace, NAME).get("status") or {}
    assert status.get("phase") not in ("Failed", "Succeeded"), status
    return dict(status)


def _run(cluster: Any, namespace: str, claim_dir: Path, holds: list[Hold]) -> RealRun:
    in_place, gang, suspend = holds
    uids = []

    # 1. The in-place restart. The operator dates a failure from its scrapes:
    # the held trainer still serves /metrics, and the status shows its step.
    wait_for("the trainer held at its save of step 20", in_place.held, WAIT)
    wait_for(
        "a step of the first round in status",
        lambda: (_status(cluster, namespace).get("progress") or {}).get("step"),
        60,
    )
    uids.append(_uids(cluster, namespace))
    _kill_worker_rank(cluster, namespace)
    in_place.release()
    after_in_place = wait_for(
        "the in-place restart in status",
        lambda: (s := _status(cluster, namespace)).get("inPlaceRestarts") and s,
        120,
    )

    # 2. The gang restart: the in-place budget (1) is spent.
    wait_for("the trainer held at its save of step 40", gang.held, WAIT)
    uids.append(_uids(cluster, namespace))
    _kill_worker_rank(cluster, namespace)
    gang.release()
    after_gang = wait_for(
        "the gang restart in status",
        lambda: (s := _status(cluster, namespace)).get("restartCount") == 1 and s,
        WAIT,
    )

    # 3. The suspension: the kubelet's SIGTERM reaches the held trainer.
    wait_for("the trainer held at step 50", suspend.held, WAIT)
    uids.append(_uids(cluster, namespace))
    patch = json.dumps({"spec": {"suspend": True}})
    cluster.kubectl("patch", "tj", NAME, "-n", namespace, "--type=merge", "-p", patch)
    sigterm_seen = wait_for("the held trainer's SIGTERM", suspend.sigterm, 120) is not None
    suspend.release()
    wait_for(
        "the suspended job's pods gone",
        lambda: not cluster.get_json("pods", "-n", namespace)["items"],
        120,
    )
    patch = json.dumps({"spec": {"suspend": False}})
    cluster.kubectl("patch", "tj", NAME, "-n", namespace, "--type=merge", "-p", patch)
    done = wait_job(cluster, namespace, NAME, {"Succeeded", "Failed"}, timeout=WAIT)
    return RealRun(
        namespace=namespace,
        job=done,
        claim_dir=claim_dir,
        uids=uids,
        after_in_place=after_in_place,
        after_gang_restart=after_gang,
        sigterm_seen=sigterm_seen,
        pods_at_end=cluster.get_json("pods", "-n", namespace)["items"],
    )


def test_the_job_trains_to_the_end_on_the_real_kubelet(real_run: RealRun, real_node):
    assert real_run.job["status"]["phase"] == "Succeeded", real_run.job["status"]
    steps = [e["step"] for e in real_run.rank0_events("step")]
    assert steps and max(steps) == TOTAL_STEPS
    # Its last pods ran on the real node, under containerd, and found each
    # other by DNS name: the worker's rendezvous is the master's per-pod name.
    pods = real_run.pods_at_end
    assert {p["spec"]["nodeName"] for p in pods} == {real_node.name}, pods
    assert all(
        s["containerID"].startswith("containerd://")
        for p in pods
        for s in p["status"]["containerStatuses"]
    )
    worker = next(p for p in pods if p["metadata"]["name"] == f"{NAME}-worker-0")
    env = {e["name"]: e.get("value") for e in worker["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == f"{NAME}-master-0.{NAME}.{real_run.namespace}.svc", env


def test_a_killed_process_restarts_in_place_in_the_same_pods(real_run: RealRun):
    status = real_run.after_in_place
    assert status["inPlaceRestarts"]["total"] == 1, status["inPlaceRestarts"]
    assert status["inPlaceRestarts"]["lastReason"] == "worker_killed", status["inPlaceRestarts"]
    assert status.get("restartCount", 0) == 0, status
    # The kill came while both pods ran; the next hold found the same pods.
    assert real_run.uids[1] == real_run.uids[0] and len(real_run.uids[0]) == 2, real_run.uids


def test_a_spent_budget_restarts_the_gang_with_new_pods(real_run: RealRun):
    status = real_run.after_gang_restart
    assert status["restartCount"] == 1, status
    before, after = real_run.uids[1], real_run.uids[2]
    assert before.keys() == after.keys() and not set(before.values()) & set(after.values())


def test_each_restart_resumes_from_the_last_save(real_run: RealRun):
    saved = [e["step"] for e in real_run.rank0_events("checkpoint")]
    resumed = [e["step"] for e in real_run.rank0_events("resumed")]
    # In place from 20, the new gang from 40, the resumed job from its save on
    # SIGTERM at 50.
    assert resumed == [IN_PLACE_KILL_AT, GANG_KILL_AT, SUSPEND_AT], (resumed, saved)
    assert SUSPEND_AT in saved and TOTAL_STEPS in saved, saved


def test_suspension_sends_sigterm_and_the_trainer_saves_where_it_was(real_run: RealRun):
    assert real_run.sigterm_seen
    (preempted,) = real_run.rank0_events("preempted")
    assert (preempted["step"], preempted["saved"]) == (SUSPEND_AT, True), preempted
    # The suspension is no failure: no restart counted for it.
    status = real_run.job["status"]
    assert status["restartCount"] == 1 and status["countedRestarts"] == 2, status


def test_the_checkpoint_claim_is_the_local_volume(real_run: RealRun, cluster):
    claim = cluster.get_json("pvc", CLAIM, "-n", real_run.namespace)
    assert claim["status"]["phase"] == "Bound", claim["status"]
    volume = cluster.get_json("pv", claim["spec"]["volumeName"])
    assert Path(volume["spec"]["local"]["path"]) == real_run.claim_dir
    # The trainer's checkpoints are in that folder on this machine.
    saved = {
        int(match.group(1))
        for path in real_run.claim_dir.rglob("step-*")
        if (match := re.fullmatch(r"step-(\d+)", path.name))
    }
    assert saved == {IN_PLACE_KILL_AT, GANG_KILL_AT, SUSPEND_AT, TOTAL_STEPS}, saved


def test_the_gang_restart_says_why_from_the_kubelets_report(real_run: RealRun, cluster):
    """The worker's launcher, its budget spent, wrote where its ranks' output
    was kept to its termination-message file; the kubelet read it into the
    pod's status, and the operator's event carries it. The file is on the
    claim."""
    failed = [
        e
        for e in cluster.get_json("events", "-n", real_run.namespace)["items"]
        if e["reason"] == "PodFailed" and e["involvedObject"]["kind"] == "TrainingJob"
    ]
    assert len(failed) == 1, failed
    message = failed[0]["message"]
    assert f"{NAME}-worker-0" in message, message
    named = re.search(r"kept (?:in|under) (\S+?)(?: to rank-\d+\.log)? on the", message)
    assert named, message
    mount = real_run.job["spec"]["checkpoint"]["mountPath"]
    kept = Path(named.group(1))
    # The round the in-place restart began: generation 0, round 1.
    assert kept.is_relative_to(f"{mount}/logs/gen-0/round-1"), message
    assert (real_run.claim_dir / kept.relative_to(mount)).exists(), message
