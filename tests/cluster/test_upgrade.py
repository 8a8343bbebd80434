"""A real upgrade and a real rollback, over jobs in every state that must survive one.

The previous release's operator and CRD run first: a pinned commit of this
repository (PREVIOUS_RELEASE, the one place it is named), checked out with
``git worktree`` into the test's tmp dir and run from its own sources. Then this
checkout's CRD and operator replace them (the upgrade), and then the previous
ones come back (the rollback). Across both, watched on the API server:

- a Running job keeps its pods (same UIDs) and is never restarted;
- no job's phase changes that nothing asked to change;
- a Succeeded job's TTL, started under the old operator, fires under the new;
- a suspended job stays suspended, holding no pods;
- a job queued in Kueue keeps its Workload (same UID) and its place, unadmitted.

The range this covers is PREVIOUS_RELEASE to this checkout: move the pin to the
last release that users run when a new one is cut.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.kueue import job_condition, workloads
from tests.fixtures.operator import REPO, apply_crd, kwok_job_spec

pytestmark = pytest.mark.cluster

# The last release whose jobs this checkout must take over and hand back.
PREVIOUS_RELEASE = "d970e0d65421844ea49c7b8052b79d726e07298c"
CRD_PATH = Path("crds") / "trainingjobs.torchfleet.dev.yaml"
# Long enough that the upgrade happens before it fires, short enough to wait for.
TTL = 30
GPU = "nvidia.com/gpu"


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The previous release's sources, checked out beside this one."""
    known = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"],
        capture_output=True,
    )
    if known.returncode != 0:
        pytest.fail(
            f"commit {PREVIOUS_RELEASE} (the previous release) is not in this clone: "
            "the upgrade test needs the repository's history (not a shallow clone)",
            pytrace=False,
        )
    checkout = tmp_path_factory.mktemp("previous-release") / "torchfleet"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(checkout), PREVIOUS_RELEASE],
        check=True,
        capture_output=True,
    )
    try:
        yield checkout
    finally:
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "remove", "--force", str(checkout)],
            capture_output=True,
        )


class PhaseWatch:
    """Every phase each TrainingJob of a namespace shows, in order, from a watch
    (a poll could miss a flip that a later write undid)."""

    def __init__(self, cluster: Any, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.phases: dict[str, list[str]] = defaultdict(list)
        self.deleted: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def __enter__(self) -> PhaseWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def settled(self, job_driver: Any, namespace: str) -> dict[str, list[str]]:
        """The phases seen so far, once the watch has caught up with each live
        job's current phase (and left out the jobs that are gone)."""

        def caught_up() -> dict[str, list[str]] | None:
            current = {
                job["metadata"]["name"]: (job.get("status") or {}).get("phase")
                for job in job_driver.raw.request("GET", job_driver.job_path(namespace))["items"]
            }
            seen = {name: list(self.phases[name]) for name in current}
            if all(
                seen[name][-1:] == ([phase] if phase else []) for name, phase in current.items()
            ):
                return seen
            return None

        return dict(job_driver.wait_for("the phase watch to catch up", caught_up, timeout=30))

    def _follow(self) -> None:
        """Watches from a list, and lists again whenever the watch breaks (a CRD
        replaced mid-watch ends it; an old resourceVersion answers 410)."""
        from kubernetes import client, watch

        api = client.CustomObjectsApi(self.cluster.api_client())
        group = {"group": "torchfleet.dev", "version": "v1alpha1", "plural": "trainingjobs"}
        version = None
        while not self._stop.is_set():
            try:
                if version is None:
                    listed = api.list_namespaced_custom_object(namespace=self.namespace, **group)
                    for job in listed["items"]:
                        self._saw(job)
                    version = listed["metadata"]["resourceVersion"]
                stream = watch.Watch()
                for event in stream.stream(
                    api.list_namespaced_custom_object,
                    namespace=self.namespace,
                    resource_version=version,
                    timeout_seconds=5,
                    allow_watch_bookmarks=True,
                    **group,
                ):
                    job = event["object"]
                    if event["type"] == "ERROR":  # 410 Gone and the like: list again
                        version = None
                        break
                    version = job["metadata"]["resourceVersion"]
                    if event["type"] == "DELETED":
                        self.deleted.add(job["metadata"]["name"])
                    elif event["type"] != "BOOKMARK":
                        self._saw(job)
                    if self._stop.is_set():
                        stream.stop()
            except Exception:  # a broken connection or an expired version: list again
                version = None
                time.sleep(0.2)

    def _saw(self, job: dict[str, Any]) -> None:
        phase = (job.get("status") or {}).get("phase")
        seen = self.phases[job["metadata"]["name"]]
        if phase and (not seen or seen[-1] != phase):
            seen.append(phase)


def uids(pods: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["uid"] for p in pods}


def workload_of(job_driver: Any, namespace: str, job: str) -> dict[str, Any]:
    (found,) = [
        w
        for w in workloads(job_driver, namespace)
        if w["metadata"]["labels"].get("torchfleet.dev/job-name") == job
    ]
    return found


def test_upgrade_and_rollback_keep_every_job_as_it_was(
    cluster,
    operator_factory,
    job_driver,
    kueue_objects,
    namespace,
    previous_release,
):
    old_crd, new_crd = previous_release / CRD_PATH, REPO / CRD_PATH
    # No quota for GPUs: the queued job waits for the whole test.
    flavor = kueue_objects.flavor("default")
    cq = kueue_objects.cluster_queue("no-gpus", [(flavor, {GPU: 0})])
    queue = kueue_objects.local_queue(namespace, "team-a", cq)

    def assert_kept(running_pods: set[str], workload_uid: str, during: str) -> None:
        assert uids(job_driver.pods(namespace, "running")) == running_pods, during
        running = job_driver.status(namespace, "running")
        assert running["phase"] == "Running" and not running.get("restartCount"), (during, running)
        paused = job_driver.get(namespace, "paused")
        assert paused is not None and paused["spec"]["suspend"] is True, during
        assert paused["status"]["phase"] == "Suspended", (during, paused["status"])
        assert job_driver.pods(namespace, "paused") == [], during
        assert workload_of(job_driver, namespace, "queued")["metadata"]["uid"] == workload_uid
        assert job_driver.pods(namespace, "queued") == [], during
        admitted = job_condition(job_driver, namespace, "queued", "Admitted")
        assert not admitted or admitted["status"] != "True", (during, admitted)

    with PhaseWatch(cluster, namespace) as watched:
        # The previous release runs every kind of job.
        apply_crd(cluster.kubectl, old_crd)
        old = operator_factory(namespaces=(namespace,), source=previous_release)
        job_driver.create(namespace, "running", kwok_job_spec(workers=1))
        job_driver.create(namespace, "paused", kwok_job_spec(workers=1, suspend=True))
        job_driver.create(
            namespace,
            "queued",
            kwok_job_spec(workers=0, resources={"gpus": 8}, scheduling={"queueName": queue}),
        )
        job_driver.create(
            namespace, "done", kwok_job_spec(workers=0, runPolicy={"ttlSecondsAfterFinished": TTL})
        )
        pods = uids(job_driver.wait_running_pods(namespace, "running", 2))
        job_driver.wait_phase(namespace, "running", "Running")
        job_driver.wait_phase(namespace, "paused", "Suspended")
        job_driver.wait_for(
            "the queued job's Workload, waiting for quota",
            lambda: any(
                w["metadata"]["labels"].get("torchfleet.dev/job-name") == "queued"
                for w in workloads(job_driver, namespace)
            ),
        )
        workload = workload_of(job_driver, namespace, "queued")["metadata"]["uid"]
        job_driver.wait_running_pods(namespace, "done", 1)
        job_driver.succeed_pod(namespace, "done-master-0")
        finished = time.monotonic()
        job_driver.wait_phase(namespace, "done", "Succeeded")
        assert_kept(pods, workload, "under the previous release")
        before = watched.settled(job_driver, namespace)

        # The upgrade: this checkout's CRD, then its operator.
        old.stop()
        apply_crd(cluster.kubectl, new_crd)
        assert job_driver.status(namespace, "done")["phase"] == "Succeeded", "TTL fired early"
        new = operator_factory(namespaces=(namespace,))
        # It has read every job (a pass for each) before anything is judged.
        passes = new.passes((namespace, "paused"))
        job_driver.patch(namespace, "paused", {"metadata": {"labels": {"upgraded": "yes"}}})
        new.wait_idle_after(passes, (namespace, "paused"))
        assert_kept(pods, workload, "after the upgrade")
        # The TTL the previous release started fires under this one.
        job_driver.wait_for(
            "the finished job's TTL",
            lambda: job_driver.get(namespace, "done") is None,
            timeout=TTL + 30,
        )
        assert time.monotonic() - finished >= TTL - 1, "deleted before its TTL"

        # The rollback: the previous CRD, then the previous operator.
        new.stop()
        apply_crd(cluster.kubectl, old_crd)
        back = operator_factory(namespaces=(namespace,), source=previous_release)
        passes = back.passes()  # the previous release counts passes of all jobs only
        job_driver.patch(namespace, "paused", {"metadata": {"labels": {"rolled-back": "yes"}}})
        back.wait_idle_after(passes)
        assert_kept(pods, workload, "after the rollback")
        after = watched.settled(job_driver, namespace)
        back.stop()
    apply_crd(cluster.kubectl)

    # No phase changed from the upgrade on: each job's phases, as the watch saw
    # them, are the ones it had shown when the previous release handed over.
    # ("done" is gone by then: its TTL fired.)
    assert after == {name: seen for name, seen in before.items() if name != "done"}, (
        before,
        after,
    )
    assert before["running"][-1] == "Running" and before["paused"][-1] == "Suspended"
    assert watched.deleted == {"done"}
