"""A fixed gang restarts in place: no pod deleted or created.

A fixed 1 + 2 Shakespeare job (one process per pod) with
``runPolicy.inPlaceRestarts: 1`` loses a worker's training process to SIGKILL
after its first checkpoint. Every pod's launcher restarts its process, the gang
meets again in a new rendezvous round and resumes from the checkpoint; the
operator counts the restart from the master's /metrics (status.inPlaceRestarts,
toward backoffLimit) and never touches the pods: same uids, restartCount 0. The
killed rank's output of the first round is on the checkpoint volume.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_training import (
    corpus_namespace,
    events,
    get_job,
    load_example,
    pod_uid,
    wait_job,
)
from tests.fixtures.e2e import NodeAgent, apply_objects

from nodeagent import procs  # isort: skip  (dev/ is put on the path by the fixtures)

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.timeout(900)]

NAME = "in-place"
PODS = (f"{NAME}-master-0", f"{NAME}-worker-0", f"{NAME}-worker-1")
# Enough steps after the first checkpoint (50) for the kill, the new round and a
# scrape of its count (every 2 s) before the run ends: a step takes about 20 ms.
STEPS = 300


def in_place_shakespeare() -> dict[str, Any]:
    """examples/shakespeare-ddp.yaml as a fixed 1 + 2 gang of one process per pod
    that restarts in place once."""
    job = load_example("shakespeare-ddp.yaml")
    job["metadata"]["name"] = NAME
    spec = job["spec"]
    spec["processesPerNode"] = 1
    spec["worker"]["replicas"] = 2
    spec["runPolicy"] |= {"inPlaceRestarts": 1, "backoffLimit": 2}
    spec["trainer"]["training"] |= {"steps": STEPS, "globalBatchSize": 12}
    spec["trainer"]["parallel"]["dataParallelReplicate"] = 3
    return job


def training_process(agent_pod_uid: str) -> procs.PodProcess:
    (worker,) = [
        p for p in procs.pod_processes(agent_pod_uid) if "torchfleet_trainer.worker" in p.cmdline
    ]
    return worker


def test_a_killed_rank_is_restarted_in_place_without_new_pods(
    cluster, node_agent: NodeAgent, e2e_operator, job_driver
):
    with corpus_namespace(cluster, node_agent, e2e_operator, "e2e-in-place") as namespace:
        apply_objects(cluster, namespace, in_place_shakespeare())
        # From the trainer's log, faster than any scrape: the run takes seconds.
        job_driver.wait_for(
            "a checkpoint to resume from",
            lambda: any(
                events(log, "checkpoint") for log in node_agent.logs(namespace, PODS[0], "trainer")
            ),
            timeout=300,
            interval=0.05,
        )
        uids = {pod: pod_uid(cluster, namespace, pod) for pod in PODS}
        victim = training_process(uids[PODS[2]])
        # The rendezvous round numbers the ranks: the victim's own says which file is its.
        environ = Path(f"/proc/{victim.pid}/environ").read_bytes().split(b"\0")
        rank = next(v.split(b"=", 1)[1].decode() for v in environ if v.startswith(b"RANK="))
        killed_at = time.time()
        procs.kill(victim, signal.SIGKILL)
        counted = job_driver.wait_for(
            "the in-place restart in status",
            lambda: (s := get_job(cluster, namespace, NAME)["status"]).get("inPlaceRestarts") and s,
            timeout=120,
        )
        seen_after = time.time() - killed_at
        job = wait_job(cluster, namespace, NAME, {"Succeeded", "Failed"}, timeout=540)
        logs = node_agent.claim_dir(namespace, f"{NAME}-checkpoint") / "logs" / "gen-0"
        first_round = (logs / "round-0" / f"rank-{rank}.log").read_text(errors="replace")
        rank_zero = (logs / "round-0" / "rank-0.log").read_text(errors="replace")
        second_round = sorted(p.name for p in (logs / "round-1").iterdir())
        victim_node = job_driver.get_core(namespace, "pods", PODS[2])["spec"]["nodeName"]
        uids_after = {pod: pod_uid_after(job_driver, namespace, pod) for pod in PODS}

    status = job["status"]
    assert status["phase"] == "Succeeded", status
    in_place = counted["inPlaceRestarts"]
    assert in_place["total"] == 1 and in_place["inGang"] == 1, in_place
    assert in_place["lastReason"] == "worker_killed", in_place
    # No gang restart: the same pods all along, and the restart counted.
    assert status["restartCount"] == 0 and status["countedRestarts"] == 1, status
    assert status["restarts"] == 1, status
    assert uids_after == uids
    # Every rank's output of each round is on the volume, the killed one's included
    # (only rank 0 logs the steps), and the second round has a file per rank.
    assert first_round.startswith(
        f"=== torchfleet-train rank {rank}, generation 0, round 0, node {victim_node}"
    ), first_round[:300]
    assert '"event":"step"' in rank_zero, rank_zero[-500:]
    assert second_round == ["rank-0.log", "rank-1.log", "rank-2.log"], second_round
    print(f"\nin-place e2e: kill -> counted in status after {seen_after:.1f}s")


def pod_uid_after(job_driver: Any, namespace: str, pod: str) -> str | None:
    found = job_driver.get_core(namespace, "pods", pod)
    return found["metadata"]["uid"] if found else None
