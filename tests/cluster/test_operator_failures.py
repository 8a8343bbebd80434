"""The operator under the failures production clusters produce (issue 20).

Real apiserver, scheduler, controller-manager and KWOK nodes. Where KWOK
cannot produce a failure by itself (a preemption's DisruptionTarget, a
kubelet admission failure, a trainer that exits beside a sidecar), the test
writes the pod's status through the status subresource, as the kubelet or
the scheduler would.
"""

from __future__ import annotations

import contextlib
import copy
import json
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from tests.fixtures.operator import CRD_FILE, apply_crd
from tests.fixtures.operator import kwok_job_spec as spec
from tests.fixtures.poll import wait_for
from torchfleet_operator.status.conditions import find

pytestmark = pytest.mark.cluster


def set_pod_status(job_driver: Any, namespace: str, pod: str, status: dict[str, Any]) -> None:
    job_driver.raw.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/{pod}/status",
        {"status": status},
        content_type="application/merge-patch+json",
    )


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def terminated(name: str, exit_code: int, finished: datetime, message: str = "") -> dict[str, Any]:
    return {
        "name": name,
        "image": "img",
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": {
            "terminated": {
                "exitCode": exit_code,
                "reason": "Error",
                "message": message,
                "startedAt": stamp(finished - timedelta(seconds=30)),
                "finishedAt": stamp(finished),
            }
        },
    }


# ---- 1. upgrade safety ------------------------------------------------------------------------


@contextlib.contextmanager
def looser_crd(cluster: Any) -> Iterator[None]:
    """The CRD with an open spec, as a newer (or rolled-back) CRD could have it: the
    apiserver then stores specs the operator's models reject. Restored afterwards."""
    crd = yaml.safe_load(CRD_FILE.read_text())
    loose = copy.deepcopy(crd)
    for version in loose["spec"]["versions"]:
        version["schema"]["openAPIV3Schema"]["properties"]["spec"] = {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
        }
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
        yaml.safe_dump(loose, file)
        file.flush()
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", file.name)
    # Established is not enough: the apiserver validates with the new schema a
    # moment later. Wait until a server-side dry run of a loose spec passes.
    probe = {
        "apiVersion": "torchfleet.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "loose-probe", "namespace": "default"},
        "spec": {**spec(workers=1), **NOT_UNDERSTOOD},
    }
    wait_for("the apiserver to serve the looser CRD", lambda: _accepted(cluster, probe), 30)
    try:
        yield
    finally:
        apply_crd(cluster.kubectl)


NOT_UNDERSTOOD = {"futureField": 1, "runPolicy": {"backoffLimit": -1}}
# Long enough for the looser CRD to be served and the three SpecNotUnderstood
# reports below on a loaded machine (25 s was once spent before the first patch).
TTL = 60
COND = "SpecNotUnderstood"


def _accepted(cluster: Any, manifest: dict[str, Any]) -> bool:
    out = cluster.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(manifest), check=False
    )
    return out.returncode == 0


def test_a_spec_the_operator_no_longer_understands_neither_kills_nor_revives_jobs(
    shared_operator, job_driver, namespace, cluster
):
    job_driver.create(namespace, "run", spec(workers=1))
    # Its TTL outlasts the SpecNotUnderstood reports below (see TTL).
    job_driver.create(
        namespace, "done", spec(workers=1, runPolicy={"ttlSecondsAfterFinished": TTL})
    )
    job_driver.create(namespace, "held", spec(workers=1, suspend=True))
    running = job_driver.wait_running_pods(namespace, "run", 2)
    job_driver.wait_phase(namespace, "run", "Running")
    job_driver.wait_running_pods(namespace, "done", 2)
    job_driver.succeed_pod(namespace, "done-master-0")
    completed = job_driver.wait_phase(namespace, "done", "Succeeded")["completionTime"]
    job_driver.wait_phase(namespace, "held", "Suspended")

    with looser_crd(cluster):
        for name in ("run", "done", "held"):
            # A merge patch: "done" keeps its TTL, which must fire whatever else changed.
            job_driver.patch(namespace, name, {"spec": NOT_UNDERSTOOD})
        for name in ("run", "done", "held"):
            reported = job_driver.wait_for(
                f"SpecNotUnderstood on {name}",
                lambda n=name: (
                    (
                        found := find(
                            job_driver.status(namespace, n).get("conditions"), "SpecNotUnderstood"
                        )
                    )
                    and found["status"] == "True"
                    and found
                ),
            )
            # The parse error, naming the field.
            assert "backoffLimit" in reported["message"] or "futureField" in reported["message"]
            job_driver.wait_events(namespace, name, {"SpecNotUnderstood"}, type="Warning")

        # The running job keeps its pods and its phase.
        run = job_driver.status(namespace, "run")
        assert run["phase"] == "Running"
        live = {p["metadata"]["uid"] for p in job_driver.live_pods(namespace, "run")}
        assert live == {p["metadata"]["uid"] for p in running}
        # The finished one stays Succeeded and goes at its TTL.
        assert job_driver.status(namespace, "done")["phase"] == "Succeeded"
        job_driver.wait_for(
            "TTL deletion of the finished job",
            lambda: job_driver.get(namespace, "done") is None,
            timeout=90,
        )
        gone = datetime.now(UTC)
        due = datetime.fromisoformat(completed.replace("Z", "+00:00")) + timedelta(seconds=TTL)
        assert gone >= due - timedelta(seconds=1)
        # The suspended one reports the problem and has no pods.
        held = job_driver.status(namespace, "held")
        assert held["phase"] == "Suspended" and not job_driver.pods(namespace, "held")

        # Once the specs parse again they are reconciled again at once: the
        # condition says so, the running gang is kept, the held job resumes.
        understood = {"futureField": None, "runPolicy": {"backoffLimit": 3}}
        job_driver.patch(namespace, "run", {"spec": understood})
        job_driver.patch(namespace, "held", {"spec": understood | {"suspend": False}})
        for name in ("run", "held"):
            job_driver.wait_for(
                f"{name} understood again",
                lambda n=name: (
                    (found := find(job_driver.status(namespace, n).get("conditions"), COND))
                    and found["status"] == "False"
                    and found["reason"] == "Understood"
                ),
            )
        job_driver.wait_running_pods(namespace, "held", 2)
        assert job_driver.status(namespace, "run")["phase"] == "Running"
        live = {p["metadata"]["uid"] for p in job_driver.live_pods(namespace, "run")}
        assert live == {p["metadata"]["uid"] for p in running}


# ---- 3. disruptions, batches, admission failures ------------------------------------------


def test_a_preemption_restarts_without_counting_and_the_job_then_succeeds(
    shared_operator, job_driver, namespace
):
    job_driver.create(namespace, "llm", spec(workers=1, runPolicy={"backoffLimit": 0}))
    job_driver.wait_running_pods(namespace, "llm", 2)
    job_driver.wait_phase(namespace, "llm", "Running")
    now = datetime.now(UTC)
    set_pod_status(
        job_driver,
        namespace,
        "llm-worker-0",
        {
            "phase": "Failed",
            "conditions": [
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "PreemptionByScheduler",
                    "message": "preempted by a higher-priority pod",
                    "lastTransitionTime": stamp(now),
                }
            ],
            "containerStatuses": [terminated("trainer", 143, now)],
        },
    )
    job_driver.wait_running_pods(namespace, "llm", 2, restart=1)
    status = job_driver.wait_phase(namespace, "llm", "Running")
    assert status["restartCount"] == 1 and status["disruptions"] == 1
    assert (
        shared_operator.metric(
            "torchfleet_operator_disruptions_total", reason="PreemptionByScheduler"
        )
        >= 1
    )
    job_driver.succeed_pod(namespace, "llm-master-0")
    job_driver.wait_phase(namespace, "llm", "Succeeded")


def test_an_oom_kill_followed_by_peers_exiting_1_restarts_under_exit_code(
    shared_operator, job_driver, namespace
):
    job_driver.create(namespace, "llm", spec(runPolicy={"restartPolicy": "ExitCode"}))
    job_driver.wait_running_pods(namespace, "llm", 3)
    job_driver.wait_phase(namespace, "llm", "Running")
    now = datetime.now(UTC)
    # The peers' exit 1 is written first, the OOM kill (earlier finishedAt) after it.
    for pod, code, finished in (
        ("llm-worker-1", 1, now),
        ("llm-master-0", 1, now),
        ("llm-worker-0", 137, now - timedelta(seconds=3)),
    ):
        set_pod_status(
            job_driver,
            namespace,
            pod,
            {"phase": "Failed", "containerStatuses": [terminated("trainer", code, finished)]},
        )
    job_driver.wait_running_pods(namespace, "llm", 3, restart=1)
    status = job_driver.wait_phase(namespace, "llm", "Running")
    assert status["restartCount"] == 1 and not status.get("disruptions")


def test_a_kubelet_admission_failure_restarts_with_the_kubelets_reason(
    shared_operator, job_driver, namespace
):
    job_driver.create(namespace, "llm", spec(workers=1, runPolicy={"restartPolicy": "Never"}))
    job_driver.wait_running_pods(namespace, "llm", 2)
    job_driver.wait_phase(namespace, "llm", "Running")
    set_pod_status(
        job_driver,
        namespace,
        "llm-worker-0",
        {
            "phase": "Failed",
            "reason": "UnexpectedAdmissionError",
            "message": "Allocate failed due to no healthy devices present",
            "containerStatuses": None,
        },
    )
    job_driver.wait_running_pods(namespace, "llm", 2, restart=1)
    job_driver.wait_events(namespace, "llm", {"UnexpectedAdmissionError"}, type="Warning")


# ---- 4. time limits ---------------------------------------------------------------------------

NOWHERE = {"spec": {"nodeSelector": {"torchfleet.dev/no-such-node": "true"}}}


def test_a_gang_that_never_schedules_says_why_then_fails_at_its_deadline_holding_no_pods(
    shared_operator, job_driver, namespace
):
    job_driver.create(
        namespace, "llm", spec(workers=1, template=NOWHERE, runPolicy={"activeDeadlineSeconds": 15})
    )
    waiting = job_driver.wait_for(
        "the scheduler's reason in the Scheduled condition",
        lambda: (
            (found := find(job_driver.status(namespace, "llm").get("conditions"), "Scheduled"))
            and found["status"] == "False"
            and found
        ),
    )
    assert waiting["reason"] == "Unschedulable"
    assert "nodes are available" in waiting["message"], waiting
    failed = job_driver.wait_phase(namespace, "llm", "Failed", timeout=60)
    assert find(failed.get("conditions"), "Failed")["reason"] == "DeadlineExceeded"
    started = datetime.fromisoformat(failed["startTime"].replace("Z", "+00:00"))
    ended = datetime.fromisoformat(failed["completionTime"].replace("Z", "+00:00"))
    assert 15 <= (ended - started).total_seconds() <= 25
    job_driver.wait_for("no pods held", lambda: not job_driver.pods(namespace, "llm"))


def test_a_job_suspended_past_its_deadline_resumes_and_runs(shared_operator, job_driver, namespace):
    job_driver.create(
        namespace, "llm", spec(workers=1, suspend=True, runPolicy={"activeDeadlineSeconds": 5})
    )
    created = job_driver.wait_phase(namespace, "llm", "Suspended")
    assert "startTime" not in created
    resume_after = time.monotonic() + 6
    job_driver.wait_for("the deadline to pass", lambda: time.monotonic() > resume_after, 10)
    resumed = time.monotonic()
    job_driver.patch(namespace, "llm", {"spec": {"suspend": False}})
    job_driver.wait_running_pods(namespace, "llm", 2)
    job_driver.wait_phase(namespace, "llm", "Running")
    # It fails at its deadline counted from the resume, not from the creation
    # (which was already more than the deadline ago), less at most the second
    # that status.startTime's whole seconds drop.
    failed = job_driver.wait_phase(namespace, "llm", "Failed", timeout=30)
    assert time.monotonic() - resumed >= 5 - 1
    assert find(failed.get("conditions"), "Failed")["reason"] == "DeadlineExceeded"
    job_driver.wait_for("no pods held", lambda: not job_driver.pods(namespace, "llm"))


# ---- 5. sidecars -----------------------------------------------------------------------------

WITH_SIDECAR = {
    "spec": {
        "nodeSelector": {"torchfleet.dev/fake-node": "true"},
        "initContainers": [
            {"name": "log-shipper", "image": "busybox", "restartPolicy": "Always"},
        ],
    }
}


def trainer_ended_beside_sidecar(exit_code: int, message: str = "") -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "phase": "Running",
        "initContainerStatuses": [
            {
                "name": "log-shipper",
                "image": "busybox",
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "started": True,
                "state": {"running": {"startedAt": stamp(now)}},
            }
        ],
        "containerStatuses": [terminated("trainer", exit_code, now, message)],
    }


def test_a_trainer_failing_beside_a_sidecar_restarts_and_says_why(
    shared_operator, job_driver, namespace
):
    job_driver.create(namespace, "llm", spec(workers=1, template=WITH_SIDECAR))
    pods = job_driver.wait_running_pods(namespace, "llm", 2)
    assert pods[0]["spec"]["initContainers"][0]["restartPolicy"] == "Always"
    job_driver.wait_phase(namespace, "llm", "Running")
    why = "torchrun: error: argument --node_rank: invalid int value: '$(RANK)'"
    set_pod_status(job_driver, namespace, "llm-worker-0", trainer_ended_beside_sidecar(2, why))
    job_driver.wait_running_pods(namespace, "llm", 2, restart=1)
    events = job_driver.wait_events(namespace, "llm", {"PodFailed"}, type="Warning")
    assert any(why in e["message"] for e in events), [e["message"] for e in events]


def test_a_trainer_succeeding_beside_a_sidecar_succeeds_and_its_pod_goes(
    shared_operator, job_driver, namespace
):
    job_driver.create(namespace, "llm", spec(workers=1, template=WITH_SIDECAR))
    job_driver.wait_running_pods(namespace, "llm", 2)
    job_driver.wait_phase(namespace, "llm", "Running")
    set_pod_status(job_driver, namespace, "llm-master-0", trainer_ended_beside_sidecar(0))
    job_driver.wait_phase(namespace, "llm", "Succeeded")
    job_driver.wait_for("the sidecar's pod deleted", lambda: not job_driver.pods(namespace, "llm"))


# ---- 6. rejected at apply ------------------------------------------------------------------------


def test_rank_in_the_command_with_several_processes_is_rejected_at_apply(
    shared_operator, job_driver, namespace
):
    bad = spec(workers=1, processesPerNode=2)
    bad["command"] = ["torchrun", "--node_rank=$(RANK)", "train.py"]
    with pytest.raises(ApiException) as rejected:
        job_driver.create(namespace, "llm", bad)
    assert rejected.value.status == 422
    assert "spec.command" in rejected.value.body and "$(NODE_RANK)" in rejected.value.body
