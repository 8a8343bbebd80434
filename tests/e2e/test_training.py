"""Real training through the operator: TrainingJobs applied with kubectl, their
pods run as processes by the node agent, scraped by a real Prometheus.

The Shakespeare job runs once per module (it is the expensive part) with a
worker process killed midway; the tests below each check one aspect of that
run: success and validation loss, the gang restart and resume, the progress in
the job's status, the series in Prometheus, and the loss curve TensorBoard
serves (its HTTP API, and its page rendered by headless Chromium).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.e2e import (
    LOCAL_PLACEMENT,
    OPERATOR_NAMESPACE,
    REPO,
    Hold,
    NodeAgent,
    apply_objects,
    held_at,
    on_session_nodes,
)
from tests.fixtures.operator import free_port
from tests.fixtures.poll import poll, wait_for
from torchfleet_operator.api import GROUP, PLURAL, VERSION
from torchfleet_trainer.launcher import procname

from nodeagent import procs  # isort: skip  (dev/ is put on the path by the fixtures)

# Bounds, not targets: ranks start slowly when the two cores are busy.
pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.timeout(1200)]

EXAMPLES = REPO / "examples"
SHARED_CORPUS = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"
# Nats per character: uniform guessing over the 65 characters gives 4.17 and
# the corpus' unigram entropy is 3.31, so a model below 2.8 has learned from
# context. The example ends near 2.4 (measured on this machine).
VAL_LOSS_THRESHOLD = 2.8
KILL_AFTER_STEP = 100
# How long one watch request of the status watch lasts: also the longest it
# takes to notice it was stopped when no status write comes.
WATCH_TIMEOUT_SECONDS = 10


def load_example(name: str) -> dict[str, Any]:
    """An example, placed on this session's agent nodes (not a demo's)."""
    return on_session_nodes(dict(yaml.safe_load((EXAMPLES / name).read_text())))


SHAKESPEARE = load_example("shakespeare-ddp.yaml")
TOTAL_STEPS = SHAKESPEARE["spec"]["trainer"]["training"]["steps"]
LOG_INTERVAL = SHAKESPEARE["spec"]["trainer"]["training"]["logInterval"]


def get_job(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    return dict(cluster.get_json("trainingjob", name, "-n", namespace))


def wait_job(
    cluster: Any, namespace: str, name: str, phases: set[str], timeout: float
) -> dict[str, Any]:
    return dict(
        wait_for(
            f"job {name} in {sorted(phases)}",
            lambda: (
                (job := get_job(cluster, namespace, name)).get("status", {}).get("phase") in phases
                and job
            ),
            timeout,
            1,
            explain=lambda: str(get_job(cluster, namespace, name).get("status")),
        )
    )


def events(log: str, kind: str) -> list[dict[str, Any]]:
    """The trainer's JSON log lines of one event kind."""
    found = []
    for line in log.splitlines():
        if line.startswith("{") and f'"event":"{kind}"' in line:
            found.append(json.loads(line))
    return found


def pod_uid(cluster: Any, namespace: str, name: str) -> str:
    return str(cluster.get_json("pod", name, "-n", namespace)["metadata"]["uid"])


def failure_report(cluster: Any, namespace: str, agent: NodeAgent, operator: Any) -> str:
    pods = cluster.kubectl("get", "pods,tj", "-n", namespace, "-o", "wide", check=False).stdout
    tail = {
        d.name: (d / "logs" / "trainer.log").read_text(errors="replace")[-1500:]
        for d in (agent.state_dir / "pods").glob(f"{namespace}_*")
        if (d / "logs" / "trainer.log").exists()
    }
    return f"{pods}\noperator:\n{operator.logs(30)}\ntrainer logs:\n{json.dumps(tail, indent=1)}"


# ---- the Shakespeare run ------------------------------------------------------------


@dataclass
class ShakespeareRun:
    namespace: str
    job: dict[str, Any]
    first_master_log: str
    final_master_log: str
    checkpoint_step_at_kill: int
    killed_rank: int
    progress_seen: list[dict[str, Any]] = field(default_factory=list)
    printed_rows: list[str] = field(default_factory=list)
    claim_dir: Path | None = None


class StatusWatch:
    """Every status the API server sent for one TrainingJob, in order, from a
    watch in a thread (one connection, not a poll: a poll sees only the writes
    that last until it looks, and a gang restart's reset can last less than a
    second before the new gang's scrape); what `kubectl get -w` shows.

    A watch the API server ends (its timeout; it also ends them when a CRD is
    applied) resumes from the last version seen, or lists again when that
    version is gone (410). Nothing else is swallowed: any other error ends the
    watch and is raised when the block ends, with the statuses seen so far."""

    def __init__(self, cluster: Any, namespace: str, name: str) -> None:
        from kubernetes import client

        self.api = client.CustomObjectsApi(cluster.api_client())
        self.namespace, self.name = namespace, name
        self.seen: list[dict[str, Any]] = []
        self.stopped = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._record, daemon=True)

    def __enter__(self) -> StatusWatch:
        self.thread.start()
        return self

    def __exit__(self, failed: type[BaseException] | None, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(timeout=WATCH_TIMEOUT_SECONDS + 30)
        if failed is not None:
            return  # the block's own failure is the one to see
        assert not self.thread.is_alive(), "the status watch did not stop"
        if self.error is not None:
            raise AssertionError(
                f"the status watch failed after {len(self.seen)} statuses: {self.error!r}"
            ) from self.error

    def progress(self) -> list[dict[str, Any]]:
        """Every status.progress seen, an unchanged one once."""
        found: list[dict[str, Any]] = []
        for status in self.seen:
            progress = status.get("progress")
            if progress and progress not in found[-1:]:
                found.append(progress)
        return found

    def _record(self) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import ProtocolError

        version = None
        try:
            while not self.stopped.is_set():
                stream = watch.Watch().stream(
                    self.api.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    self.namespace,
                    PLURAL,
                    field_selector=f"metadata.name={self.name}",
                    resource_version=version,
                    timeout_seconds=WATCH_TIMEOUT_SECONDS,
                    allow_watch_bookmarks=True,
                )
                try:
                    for event in stream:
                        obj = event["object"]
                        version = obj["metadata"]["resourceVersion"]
                        # A bookmark carries no status; an unchanged one is no news.
                        status = obj.get("status") or {}
                        if event["type"] != "BOOKMARK" and status not in self.seen[-1:]:
                            self.seen.append(copy.deepcopy(status))
                        if self.stopped.is_set():
                            break
                except ApiException as error:  # the client raises the watch's ERROR events
                    if error.status != 410:
                        raise
                    version = None  # compacted: start again from a fresh list
                except ProtocolError:
                    pass  # the server ended the connection: resume from `version`
        except BaseException as error:  # surfaced by __exit__, not lost in the thread
            self.error = error


def _shows_the_running_gang(job: dict[str, Any], checkpoint: int) -> bool:
    """The status holds a scrape of the running gang (its rates) taken once it
    had saved the checkpoint."""
    status = job.get("status") or {}
    progress = status.get("progress") or {}
    saved = (status.get("lastCheckpoint") or {}).get("step")
    return "tokensPerSecond" in progress and isinstance(saved, int) and saved >= checkpoint


def write_corpus(cluster: Any, namespace: str, agent: NodeAgent) -> None:
    """The corpus PVC the example mounts, filled through the agent's local volume."""
    import demo  # dev/demo.py: builds a corpus when ../shared is absent

    corpus_dir = agent.claim_dir(namespace, "shakespeare-corpus")
    corpus_dir.mkdir(parents=True, exist_ok=True)
    demo.write_corpus(corpus_dir / "input.txt", SHARED_CORPUS)
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "shakespeare-corpus"},
        "spec": {"accessModes": ["ReadOnlyMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    apply_objects(cluster, namespace, claim)


@contextlib.contextmanager
def corpus_namespace(cluster: Any, agent: NodeAgent, operator: Any, prefix: str) -> Iterator[str]:
    """A fresh namespace holding the corpus claim, deleted afterwards; a failed
    assertion inside carries the pods', operator's and trainers' state."""
    namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    try:
        write_corpus(cluster, namespace, agent)
        yield namespace
    except AssertionError as error:
        raise AssertionError(
            f"{error}\n{failure_report(cluster, namespace, agent, operator)}"
        ) from None
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture(scope="module")
def shakespeare(cluster, node_agent, e2e_operator, prometheus) -> Iterator[ShakespeareRun]:
    with corpus_namespace(cluster, node_agent, e2e_operator, "e2e-shakespeare") as namespace:
        job_manifest = copy.deepcopy(SHAKESPEARE)
        # In-place restarts off: the kill restarts the whole gang, the path this
        # module proves (test_node_health.py proves the in-place one).
        job_manifest["spec"]["runPolicy"]["inPlaceRestarts"] = 0
        name = job_manifest["metadata"]["name"]
        (hold,) = held_at(job_manifest, node_agent, namespace, ("checkpoint", KILL_AFTER_STEP))
        try:
            with StatusWatch(cluster, namespace, name) as statuses:
                apply_objects(cluster, namespace, job_manifest)
                run = _run_with_a_killed_worker(cluster, namespace, name, node_agent, hold)
        finally:
            hold.release()  # a failed run leaves no trainer waiting
        run.progress_seen = statuses.progress()
        yield run


def _run_with_a_killed_worker(
    cluster: Any, namespace: str, name: str, agent: NodeAgent, hold: Hold
) -> ShakespeareRun:
    rows: list[str] = []
    master = f"{name}-master-0"

    def observe() -> dict[str, Any]:
        job = get_job(cluster, namespace, name)
        rows.append(cluster.kubectl("get", "tj", name, "-n", namespace, "--no-headers").stdout)
        return job

    def held() -> dict[str, Any] | None:
        job = observe()
        assert job.get("status", {}).get("phase") not in ("Failed", "Succeeded"), job["status"]
        return hold.held()

    # Midway: the trainer holds itself once it has saved step KILL_AFTER_STEP
    # (tests/e2e/hold); its peers wait for it in their next all-reduce, and its
    # /metrics still serves. An idle machine runs 100 steps in 2 s, quicker
    # than the operator's 2 s scrapes: held, the status shows this gang's
    # progress and its checkpoint before the kill, as on a slower machine, and
    # no later save can come before the kill.
    saved = wait_for(f"the trainer held at its save of step {KILL_AFTER_STEP}", held, 540)
    checkpoint_at_kill = int(saved["step"])
    ranks = procs.rank_processes(pod_uid(cluster, namespace, f"{name}-worker-0"))
    assert len(ranks) == 2, f"expected 2 rank processes in the worker pod: {ranks}"
    killed_rank = procname.rank_of(ranks[0].pid)
    assert killed_rank is not None, f"not a training process: {ranks[0]}"
    wait_for(
        "the gang's progress and checkpoint in status",
        lambda: _shows_the_running_gang(observe(), checkpoint_at_kill),
        timeout=120,
    )
    procs.kill(ranks[0], signal.SIGKILL)
    hold.release()

    job = wait_for(
        "the job finished",
        lambda: (j := observe()).get("status", {}).get("phase") in ("Succeeded", "Failed") and j,
        timeout=540,
        interval=0.5,
    )
    master_logs = agent.logs(namespace, master, "trainer")
    return ShakespeareRun(
        namespace=namespace,
        job=job,
        first_master_log=master_logs[0],
        final_master_log=master_logs[-1],
        checkpoint_step_at_kill=checkpoint_at_kill,
        killed_rank=killed_rank,
        printed_rows=rows,
        claim_dir=agent.claim_dir(namespace, f"{name}-checkpoint"),
    )


def test_the_restart_names_the_failed_pods_kept_logs_and_they_hold_its_lines(
    shakespeare: ShakespeareRun, job_driver
):
    """The gang restart deleted the killed rank's pod and its logs with it; the
    Restarting event names where its ranks' output was kept, and it is there."""
    restarts = [
        e
        for e in job_driver.events(shakespeare.namespace, shakespeare.job["metadata"]["name"])
        if e["reason"] == "PodFailed"
    ]
    assert restarts, "no PodFailed event for the gang restart"
    # The killed rank's pod, or (when the master's report came first) the master,
    # whose ranks lost their peer (202) and so name the whole round's folder.
    named = re.search(r"kept (in|under) (\S+)( to (rank-\d+\.log))? on the", restarts[0]["message"])
    assert named, restarts[0]["message"]
    mount = shakespeare.job["spec"]["checkpoint"]["mountPath"]
    killed_file = f"{mount}/logs/gen-0/round-0/rank-{shakespeare.killed_rank}.log"
    if named.group(1) == "under":
        assert named.group(2) == f"{mount}/logs/gen-0/round-0/", named.group(0)
    else:  # worker 0 is node rank 1 of 2-process pods: global ranks 2 and 3
        assert named.group(2, 4) == (f"{mount}/logs/gen-0/round-0/rank-2.log", "rank-3.log")
        assert shakespeare.killed_rank in (2, 3), killed_file
    assert shakespeare.claim_dir is not None
    killed = (
        shakespeare.claim_dir / "logs" / "gen-0" / "round-0" / f"rank-{shakespeare.killed_rank}.log"
    )
    text = killed.read_text(errors="replace")
    assert text.startswith(
        f"=== torchfleet-train rank {shakespeare.killed_rank}, generation 0, round 0"
    ), text[:300]


def test_torchfleet_logs_reads_a_gone_ranks_kept_log_from_the_volume(
    shakespeare: ShakespeareRun, cluster
):
    """`torchfleet logs JOB --generation 0 --rank N`: the killed rank's pod is
    long gone; a short-lived pod reads its kept file off the checkpoint claim,
    and the command prints it whole, then deletes that pod."""
    assert shakespeare.claim_dir is not None
    kept = shakespeare.claim_dir / "logs" / "gen-0" / "round-0"
    name = shakespeare.job["metadata"]["name"]
    base = [
        str(Path(sys.executable).parent / "torchfleet"), "logs", name,
        "--kubeconfig", cluster.kubeconfig, "-n", shakespeare.namespace,
    ]  # fmt: skip
    args = ["--generation", "0", "--round", "0", "--rank", str(shakespeare.killed_rank)]
    out = subprocess.run([*base, *args], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert out.stdout == (kept / f"rank-{shakespeare.killed_rank}.log").read_text(errors="replace")
    missing = subprocess.run(
        [*base, "--generation", "7"], capture_output=True, text=True, timeout=180
    )
    assert missing.returncode == 1 and "gen-7/round-0/rank-0.log" in missing.stderr, missing
    readers = cluster.get_json(
        "pods", "-n", shakespeare.namespace, "-l", "app.kubernetes.io/component=kept-log-reader"
    )["items"]
    assert all(p["metadata"].get("deletionTimestamp") for p in readers), readers


def test_shakespeare_job_succeeds_below_the_loss_threshold(shakespeare: ShakespeareRun):
    assert shakespeare.job["status"]["phase"] == "Succeeded"
    evals = events(shakespeare.final_master_log, "eval")
    assert evals, "the final run logged no evaluation"
    final = evals[-1]
    assert final["step"] == TOTAL_STEPS
    assert final["val_loss"] < VAL_LOSS_THRESHOLD


def test_killed_worker_restarts_the_gang_and_resumes_from_the_last_checkpoint(
    shakespeare: ShakespeareRun,
):
    assert shakespeare.job["status"]["restartCount"] == 1
    saved_before_crash = [e["step"] for e in events(shakespeare.first_master_log, "checkpoint")]
    assert saved_before_crash, "the first gang saved no checkpoint"
    last_saved = max(saved_before_crash)
    # The kill came while the trainer was held at its save of KILL_AFTER_STEP:
    # the last checkpoint before the crash is that one, exactly.
    assert last_saved == shakespeare.checkpoint_step_at_kill == KILL_AFTER_STEP

    resumed = events(shakespeare.final_master_log, "resumed")
    assert [e["step"] for e in resumed] == [last_saved]
    steps_after = [e["step"] for e in events(shakespeare.final_master_log, "step")]
    assert steps_after, "the restarted gang logged no steps"
    # Nothing before the checkpoint was trained again.
    assert min(steps_after) > last_saved
    assert max(steps_after) == TOTAL_STEPS


def test_progress_and_checkpoint_in_status_and_printer_columns(shakespeare: ShakespeareRun):
    status = shakespeare.job["status"]
    assert "lastCheckpoint" in status and "progress" in status, status
    assert status["progress"]["step"] == TOTAL_STEPS
    assert status["progress"]["totalSteps"] == TOTAL_STEPS
    # Finished: no time left to show. The stored status lost the key the last
    # pass dropped (the status write nulls it), not just the pass's copy.
    assert status["progress"]["percent"] == 100 and "etaSeconds" not in status["progress"]
    midway = [p for p in shakespeare.progress_seen if 0 < p["step"] < TOTAL_STEPS]
    # A scrape carries the trainer's rates; the reset at the gang restart does not.
    scraped = [p for p in midway if "tokensPerSecond" in p]
    assert scraped, "status.progress never showed a run in progress"
    assert all(p["loss"] > 0 and p["tokensPerSecond"] > 0 for p in scraped)
    # Nor, before a gang's first step, the trainer's gauges' initial zeros.
    zeros = [p for p in shakespeare.progress_seen if 0 in (p.get("loss"), p.get("tokensPerSecond"))]
    assert not zeros, zeros
    assert any("etaSeconds" in p for p in scraped)
    # Never stale: between the restart and the new gang's first step, status showed
    # the old gang's last step (held while its master could still save) or the
    # step the new gang resumes from (a checkpoint the first gang saved).
    resets = {p["step"] for p in midway if "tokensPerSecond" not in p}
    saved = {e["step"] for e in events(shakespeare.first_master_log, "checkpoint")}
    shown = {p["step"] for p in scraped}
    assert resets & saved, "status never showed the resumed step before the new gang's step"
    assert resets <= saved | shown, (resets, saved, shown)
    # kubectl get tj shows the percentage column while it runs.
    percents = {row.split()[4] for row in shakespeare.printed_rows if len(row.split()) > 4}
    assert any(p.isdigit() and 0 < int(p) < 100 for p in percents), shakespeare.printed_rows[-5:]
    assert shakespeare.claim_dir is not None and any(shakespeare.claim_dir.iterdir())


# The accounting's buckets are whole seconds between the status's timestamps, and
# the splits of running time are rounded to the millisecond.
GOODPUT_SUM_TOLERANCE = 0.01


def test_goodput_after_the_restart_is_below_one_and_adds_up(shakespeare: ShakespeareRun):
    status = shakespeare.job["status"]
    account = status["timeAccounting"]
    assert 0 < status["goodput"] < 1, status  # the restart cost time
    assert account["restartingSeconds"] > 0
    phases = ("queuedSeconds", "suspendedSeconds", "restartingSeconds", "runningSeconds")
    parts = ("productiveSeconds", "recomputedSeconds", "checkpointSeconds")
    assert sum(account[k] for k in phases) == pytest.approx(
        account["wallSeconds"], abs=GOODPUT_SUM_TOLERANCE
    )
    assert sum(account[k] for k in parts) == pytest.approx(
        account["runningSeconds"], abs=GOODPUT_SUM_TOLERANCE
    )
    # The wall time is the job's life: from its creation to its completion.
    created = shakespeare.job["metadata"]["creationTimestamp"]
    assert (account["since"], account["until"]) == (created, status["completionTime"])
    allowed = account["runningSeconds"] + account["restartingSeconds"]
    assert status["goodput"] == pytest.approx(account["productiveSeconds"] / allowed, abs=1e-4)


def test_the_percentage_went_back_only_with_the_step(shakespeare: ShakespeareRun):
    seen = [p for p in shakespeare.progress_seen if "percent" in p]
    # The run was watched from its first scrape to its end (an empty record
    # would prove nothing), and ended at 100 %.
    assert len(seen) >= 3 and seen[-1]["percent"] == 100, seen
    # Each percentage is its step's share of the run, so it can fall only
    # where the step fell (the gang restart's reset to the checkpoint).
    for point in seen:
        assert point["percent"] == int(100 * point["step"] / TOTAL_STEPS), point
    for before, after in itertools.pairwise(seen):
        assert after["percent"] >= before["percent"] or after["step"] < before["step"], (
            before,
            after,
        )


def test_prometheus_has_the_trainer_and_operator_series(shakespeare: ShakespeareRun, prometheus):
    job = shakespeare.job["metadata"]["name"]
    namespace = shakespeare.namespace
    # The pod role's labelmap turns the pod label torchfleet.dev/job-name into
    # torchfleet_dev_job_name; namespace and pod come from discovery too.
    selector = f'{{namespace="{namespace}",torchfleet_dev_job_name="{job}"}}'
    loss = prometheus.query(f"max_over_time(torchfleet_train_loss{selector}[1h])")
    tokens = prometheus.query(f"max_over_time(torchfleet_train_tokens_per_second{selector}[1h])")
    assert loss and float(loss[0]["value"][1]) > 0, "no loss series scraped from the pods"
    assert tokens and float(tokens[0]["value"][1]) > 0, "no tokens/s series scraped"
    # Discovered through the pod's annotations, as the pod role labels show.
    assert loss[0]["metric"]["pod"].startswith(f"{job}-")

    # This session's operator (a `make demo` left running has its own, scraped too).
    ours = f'service_namespace="{OPERATOR_NAMESPACE}"'
    phases = prometheus.query(
        f'max_over_time(torchfleet_operator_jobs{{phase="Running",{ours}}}[1h])'
    )
    assert len(phases) == 1 and float(phases[0]["value"][1]) >= 1, phases
    assert phases[0]["metric"]["job"] == "torchfleet-operator"
    # This job's own phase series, as the operator exported it while it ran.
    mine = f'job_namespace="{namespace}",job_name="{job}"'
    running = prometheus.query(
        f'max_over_time(torchfleet_operator_job_phase{{{mine},phase="Running"}}[1h])'
    )
    assert running and float(running[0]["value"][1]) == 1, "no Running series for this job"


# ---- the curves in TensorBoard -----------------------------------------------------------

LOSS_TAG = "train/loss"


def http_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def loss_series(base: str) -> list[list[float]]:
    """[wall time, step, value] of every loss point, as TensorBoard serves them; the
    job's tensorboard directory is TensorBoard's logdir, so its run is '.'."""
    query = urllib.parse.urlencode({"run": ".", "tag": LOSS_TAG})
    return list(http_json(f"{base}/data/plugin/scalars/scalars?{query}"))


@pytest.fixture(scope="module")
def tensorboard(
    shakespeare: ShakespeareRun, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """TensorBoard, as `make demo` starts it, on the finished job's default
    directory (<checkpoint volume>/tensorboard); its URL once it has read the
    whole run."""
    import demo  # dev/demo.py

    assert shakespeare.claim_dir is not None
    logdir = shakespeare.claim_dir / "tensorboard"
    port = free_port()
    log_path = tmp_path_factory.mktemp("tensorboard") / "tensorboard.log"
    # Its own TMPDIR: TensorBoard notes itself in <TMPDIR>/.tensorboard-info,
    # which a stopped TensorBoard leaves (a module's fixture has the session's).
    env = {**os.environ, "TMPDIR": str(log_path.parent)}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            demo.tensorboard_argv(logdir, port), stdout=log, stderr=subprocess.STDOUT, env=env
        )
    base = f"http://127.0.0.1:{port}"
    try:

        def served_whole_run() -> bool:
            assert process.poll() is None, log_path.read_text()
            try:
                series = loss_series(base)
            except OSError:
                return False  # not listening yet, or the run not loaded (400)
            return bool(series) and series[-1][1] >= TOTAL_STEPS

        wait_for(
            f"TensorBoard to serve step {TOTAL_STEPS}", served_whole_run, timeout=120, interval=0.5
        )
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_tensorboard_serves_one_loss_curve_across_the_restart(
    shakespeare: ShakespeareRun, tensorboard: str
):
    assert shakespeare.claim_dir is not None
    event_files = list((shakespeare.claim_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert len(event_files) == 2, f"one event file per gang in one directory: {event_files}"
    series = loss_series(tensorboard)
    steps = [int(step) for _, step, _ in series]
    # Every log step once, in order: the restarted gang's steps after its
    # checkpoint replaced what the first gang had logged for them.
    assert steps == list(range(LOG_INTERVAL, TOTAL_STEPS + 1, LOG_INTERVAL))
    resumed_from = events(shakespeare.final_master_log, "resumed")[0]["step"]
    logged_after = {e["step"]: e["loss"] for e in events(shakespeare.final_master_log, "step")}
    for _, step, value in series:
        if step > resumed_from:
            assert value == pytest.approx(logged_after[step], abs=1e-5), step
    # The other curves are there too, and the first gang's config text at step 0.
    tags = http_json(f"{tensorboard}/data/plugin/scalars/tags")["."]
    for tag in ("eval/loss", "train/learning_rate", "train/grad_norm", "checkpoint/save_seconds"):
        assert tag in tags, tags
    query = urllib.parse.urlencode({"run": ".", "tag": "run/config/text_summary"})
    (config,) = http_json(f"{tensorboard}/data/plugin/text/text?{query}")
    assert config["step"] == 0
    assert "world size 4 = pp 1 x dp_replicate 4 x dp_shard 1 x tp 1" in config["text"]


def headless_chromium(url: str, profile: Path, *action: str) -> subprocess.CompletedProcess[str]:
    """One page load in Debian's Chromium, given time for TensorBoard's app to fetch
    and draw; root needs --no-sandbox (the sandbox refuses to run as root)."""
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: `make deps` installs it"
    argv = [chromium, "--headless", "--disable-gpu", "--disable-dev-shm-usage"]
    argv += [f"--user-data-dir={profile}", "--window-size=1400,1000", "--hide-scrollbars"]
    argv += ["--virtual-time-budget=30000"]
    if os.geteuid() == 0:
        argv.append("--no-sandbox")
    return subprocess.run(
        [*argv, *action, url], capture_output=True, text=True, timeout=180, check=True
    )


def loss_chart_points(dom: str) -> int:
    """Points on the loss card's plotted line (0 while none is drawn): the card is
    found by its tag title, the line is the first SVG path of the card's chart
    (forceSVG draws in SVG)."""
    card = dom.find(f'title="{LOSS_TAG}"')
    chart = dom.find("<line-chart ", card) if card >= 0 else -1
    end = dom.find("</line-chart>", chart) if chart >= 0 else -1
    line = re.search(r'<path d="M([^"]+)"', dom[chart:end]) if 0 <= chart < end else None
    return line.group(1).count("L") + 1 if line else 0


def test_chromium_renders_the_loss_chart_and_keeps_a_screenshot(
    shakespeare: ShakespeareRun, tensorboard: str, tmp_path: Path
):
    # The scalars (time series) page, filtered to the loss tag; SVG rather
    # than WebGL so the drawn line is in the DOM (and headless has no GPU).
    query = urllib.parse.urlencode({"tagFilter": LOSS_TAG, "forceSVG": "true"})
    page = f"{tensorboard}/?{query}#timeseries"
    profile = tmp_path / "chromium-profile"
    # The DOM and the screenshot of one and the same load, kept under the
    # test's tmp dir (pytest keeps the last runs') as the artifacts.
    screenshot, dom_file = tmp_path / "tensorboard-loss.png", tmp_path / "tensorboard-loss.html"
    # Another load when the app had not drawn the card, or drawn only part of
    # its line, when the virtual time ran out (no card on about a third of the
    # loads here; one point of 30 once, in a run beside the demo).
    expected = TOTAL_STEPS // LOG_INTERVAL

    def drawn_whole() -> bool:
        dom = headless_chromium(page, profile, "--dump-dom", f"--screenshot={screenshot}").stdout
        dom_file.write_text(dom)
        return loss_chart_points(dom) == expected

    poll(drawn_whole, timeout=180, interval=0)  # each load takes its own time
    assert loss_chart_points(dom_file.read_text()) == expected, f"see {dom_file}"
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- more jobs through the operator ---------------------------------------------------


def byo_job(name: str) -> dict[str, Any]:
    template = {
        "spec": {
            **copy.deepcopy(LOCAL_PLACEMENT),
            "volumes": [{"name": "code", "configMap": {"name": "ddp-check"}}],
            "containers": [
                {"name": "trainer", "volumeMounts": [{"name": "code", "mountPath": "/workspace"}]}
            ],
        }
    }
    return {
        "apiVersion": "torchfleet.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "processesPerNode": 2,
            "command": ["torchrun", "/workspace/ddp_check.py"],
            "master": {"template": template},
            "worker": {"replicas": 1, "template": copy.deepcopy(template)},
        },
    }


def test_bring_your_own_torchrun_script(cluster, e2e_namespace, node_agent, e2e_operator):
    namespace = e2e_namespace
    script = (Path(__file__).parent / "scripts" / "ddp_check.py").read_text()
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "ddp-check"},
        "data": {"ddp_check.py": script},
    }
    apply_objects(cluster, namespace, config, byo_job("byo"))
    try:
        job = wait_job(cluster, namespace, "byo", {"Succeeded", "Failed"}, timeout=540)
        assert job["status"]["phase"] == "Succeeded"
    except AssertionError as error:
        raise AssertionError(
            f"{error}\n{failure_report(cluster, namespace, node_agent, e2e_operator)}"
        ) from None

    reports: dict[str, list[dict[str, Any]]] = {}
    for pod in ("byo-master-0", "byo-worker-0"):
        log = node_agent.logs(namespace, pod, "trainer")[-1]
        reports[pod] = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    ranks = {r["rank"]: r for lines in reports.values() for r in lines}
    assert sorted(ranks) == [0, 1, 2, 3]
    # torchrun gave each process its own RANK/LOCAL_RANK, and the gang its size.
    assert sorted(r["rank"] for r in reports["byo-master-0"]) == [0, 1]
    assert sorted(r["rank"] for r in reports["byo-worker-0"]) == [2, 3]
    for rank, report in ranks.items():
        assert report["env"] == {
            "RANK": str(rank),
            "WORLD_SIZE": "4",
            "LOCAL_RANK": str(rank % 2),
        }
        assert report["world_size"] == 4
        assert report["all_reduce_sum"] == 1 + 2 + 3 + 4
        # DDP averages d(w*x)/dw = x over the ranks: (1 + 2 + 3 + 4) / 4.
        assert report["ddp_grad"] == pytest.approx(2.5)


@pytest.mark.parametrize("example", ["fsdp-cpu.yaml", "3d-cpu.yaml"])
def test_parallel_examples_run_to_success(
    cluster, e2e_namespace, node_agent, e2e_operator, example
):
    namespace = e2e_namespace
    manifest = load_example(example)
    name = manifest["metadata"]["name"]
    apply_objects(cluster, namespace, manifest)
    try:
        job = wait_job(cluster, namespace, name, {"Succeeded", "Failed"}, timeout=540)
        assert job["status"]["phase"] == "Succeeded"
    except AssertionError as error:
        raise AssertionError(
            f"{error}\n{failure_report(cluster, namespace, node_agent, e2e_operator)}"
        ) from None
    total = manifest["spec"]["trainer"]["training"]["steps"]
    log = node_agent.logs(namespace, f"{name}-master-0", "trainer")[-1]
    assert max(e["step"] for e in events(log, "step")) == total
