"""A fixed gang loses a worker's node silently, as a machine dies, and does not hang.

examples/shakespeare-ddp.yaml as a 1 + 2 gang of one process per pod (with
the default in-place budget, which a lost node does not use), its master on the
agent's first node and a worker alone on the second, under a collective timeout
of 600 s in every pod's env. After its first checkpoint (the trainer holds
itself there, tests/e2e/hold, until the node is dead: unheld, a fast machine
ran the remaining steps to Succeeded before the node died, and there was no
failure to recover from) the second node dies as a machine does (the
agent's silent-death annotation: no heartbeat, the pod's network gone before
its processes, nothing reset, no deletion confirmed). Its peers sit in a
collective that will never complete; a fixed gang cannot train on without the
rank, so what must happen is a gang restart, soon: the operator sees the node
lost (the node controller's 20 s grace here), restarts the gang with reason
NodeLost, force-deletes the pod its node will never confirm, and the next gang
resumes from the checkpoint once the node is back. The seconds from the death
to the new gang's first step are far below the collective timeout (and gloo's
30 minutes), which is what the test must catch.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.e2e.test_elastic import (
    a_worker_alone_and_quick_to_give_up,
    all_events,
    placement,
    pod_uid_or_none,
)
from tests.e2e.test_training import corpus_namespace, load_example, pod_uid, wait_job
from tests.fixtures.e2e import (
    E2E_NODES,
    NodeAgent,
    apply_objects,
    held_at,
    release_once_dead,
    silent_node,
)

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.timeout(900)]

NAME = "silent-gang"
WORKERS = (f"{NAME}-worker-0", f"{NAME}-worker-1")
PODS = (f"{NAME}-master-0", *WORKERS)
CHECKPOINT_INTERVAL = 20
STEPS = 40
# Far beyond RECOVERY_SECONDS: a gang that waited for it fails the test.
COLLECTIVE_TIMEOUT = 600.0
# The death to the new gang's first step: the node declared lost (20 s grace;
# meanwhile the survivors' launchers see its heartbeats stop and kill their
# stuck workers, lost_peer.py), the gang's pods deleted, the lost pod
# force-deleted, the node back, the new gang started and resumed. The bound
# catches the collective timeout.
RECOVERY_SECONDS = 300.0


def silent_gang() -> dict[str, Any]:
    job = load_example("shakespeare-ddp.yaml")
    job["metadata"]["name"] = NAME
    spec = job["spec"]
    spec["processesPerNode"] = 1
    spec["worker"]["replicas"] = 2
    trainer = spec["trainer"]
    trainer["training"] |= {"steps": STEPS, "globalBatchSize": 12, "logInterval": 2}
    trainer["parallel"]["dataParallelReplicate"] = 3
    trainer["checkpoint"]["interval"] = CHECKPOINT_INTERVAL
    return a_worker_alone_and_quick_to_give_up(job, COLLECTIVE_TIMEOUT)


def trainer_events(agent: NodeAgent, namespace: str, kind: str) -> list[dict[str, Any]]:
    return all_events(agent, namespace, kind, PODS)


def test_a_fixed_gang_on_a_silent_node_restarts_soon_and_resumes(
    cluster, node_agent, e2e_operator, job_driver
):
    wait_for = job_driver.wait_for
    with corpus_namespace(cluster, node_agent, e2e_operator, "e2e-silent") as namespace:
        job = silent_gang()
        (hold,) = held_at(job, node_agent, namespace, ("checkpoint", CHECKPOINT_INTERVAL))
        apply_objects(cluster, namespace, job)
        placed = wait_for(
            "the gang's three pods placed",
            lambda: len(p := placement(cluster, namespace)) == len(PODS) and p,
            timeout=60,
        )
        (victim,) = [pod for pod in WORKERS if placed[pod] != E2E_NODES[0]]
        saved = wait_for("the trainer held at its first checkpoint", hold.held, timeout=420)["step"]
        old_uid = pod_uid(cluster, namespace, victim)
        with silent_node(cluster, placed[victim]):
            lost_at = time.time()
            release_once_dead(wait_for, old_uid, hold)
            # The dead node never confirms the pod's deletion: the operator
            # force-deletes it once the node is lost.
            wait_for(
                "the lost pod force-deleted",
                lambda: pod_uid_or_none(cluster, namespace, victim) != old_uid,
                timeout=RECOVERY_SECONDS,
            )
            force_deleted_after = time.time() - lost_at
        # The new gang's: after its load (the old gang may log a step in flight
        # at the death).
        load = wait_for(
            "the new gang's checkpoint load",
            lambda: [
                e for e in trainer_events(node_agent, namespace, "resumed") if e["time"] > lost_at
            ],
            timeout=RECOVERY_SECONDS,
        )[0]
        resumed = wait_for(
            "the new gang's first step",
            lambda: [
                e for e in trainer_events(node_agent, namespace, "step") if e["time"] > load["time"]
            ],
            timeout=RECOVERY_SECONDS,
        )[0]
        job = wait_job(cluster, namespace, NAME, {"Succeeded", "Failed"}, timeout=600)

        assert job["status"]["phase"] == "Succeeded", job["status"]
        assert job["status"]["restartCount"] == 1, job["status"]
        # A lost node is never restarted in place: its pod is gone.
        assert not (job["status"].get("inPlaceRestarts") or {}).get("total"), job["status"]
        restarts = [e for e in job_driver.events(namespace, NAME) if e["reason"] == "NodeLost"]
        assert restarts and victim in restarts[0]["message"], restarts
        to_first_step = resumed["time"] - lost_at
        assert to_first_step < RECOVERY_SECONDS, to_first_step
        # The new gang resumed from the last checkpoint saved before the death:
        # the one the trainer was held at.
        assert load["step"] == saved < resumed["step"], (saved, load, resumed)
        assert saved == CHECKPOINT_INTERVAL < STEPS, saved
        print(
            f"\nfixed gang, silent node (collective timeout {COLLECTIVE_TIMEOUT:g}s): "
            f"death -> lost pod force-deleted {force_deleted_after:.1f}s; "
            f"-> new gang's first step {to_first_step:.1f}s (resumed at {load['step']})"
        )
