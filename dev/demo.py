"""`make demo`: the README's main job, trained for real through the operator.

    python dev/demo.py          # run the demo (expects `make venv cluster-up` done)
    python dev/demo.py down     # stop what the demo left running

Starts the node agent (pods run as processes here), the operator, a real
Prometheus and TensorBoard (on the job's <checkpoint dir>/tensorboard, port
$TORCHFLEET_DEMO_TENSORBOARD_PORT, default 6006); applies
examples/shakespeare-ddp.yaml; shows `kubectl get tj` live; kills one worker
rank midway; shows the restart (in place: the gang's processes, not its pods,
runPolicy.inPlaceRestarts) and the resume from the last checkpoint;
ends when the job has Succeeded, printing where the checkpoints, Prometheus and
TensorBoard are. The agent, operator, Prometheus and TensorBoard keep running
afterwards so they can be looked at; `down` stops them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

DEV = Path(__file__).resolve().parent
REPO = DEV.parent
sys.path.insert(0, str(DEV))

from corpus import write_corpus  # noqa: E402
from nodeagent import node as agent_node  # noqa: E402
from nodeagent import pod as agent_pod  # noqa: E402
from nodeagent import procs  # noqa: E402
from prometheus import prom  # noqa: E402

from torchfleet_trainer.launcher import procname  # noqa: E402

STATE = Path(os.environ.get("TORCHFLEET_DEMO_DIR", "/tmp/torchfleet-demo"))
# The cluster `make cluster-up` started (localcluster.py's state directory).
CLUSTER_DIR = REPO / os.environ.get("TORCHFLEET_CLUSTER_DIR", ".cluster")
KUBECONFIG = CLUSTER_DIR / "kubeconfig"
KUBECTL = CLUSTER_DIR / "bin" / "kubectl"
NAMESPACE = "torchfleet-demo"
JOB = "shakespeare-ddp"
EXAMPLE = REPO / "examples" / "shakespeare-ddp.yaml"
NODES = ("tf-local-0", "tf-local-1")
# The demo's agent keeps the default session, the local-node label value the
# examples select; a test session on the same cluster has a value of its own.
LOCAL_NODES = f"{agent_node.LOCAL_NODE_LABEL}={agent_node.DEFAULT_SESSION}"
BRIDGE, CIDR, GATEWAY = "tfdemo0", "10.253.0.0/16", "10.253.0.1"
KILL_AFTER_CHECKPOINT_STEP = 100
TENSORBOARD_PORT = int(os.environ.get("TORCHFLEET_DEMO_TENSORBOARD_PORT", "6006"))
# What the demo starts and `down` stops, by pid file; the agent last (it stops the pods).
STOPPED_IN_ORDER = ("tensorboard", "operator", "agent")


def say(message: str) -> None:
    print(f"\033[1m==> {message}\033[0m", flush=True)


def kubectl(*args: str, input: str | None = None, check: bool = True) -> str:
    out = subprocess.run(
        [str(KUBECTL), f"--kubeconfig={KUBECONFIG}", *args],
        input=input,
        capture_output=True,
        text=True,
    )
    if check and out.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout


# ---- the corpus -------------------------------------------------------------------


# ---- the parts ---------------------------------------------------------------------


def start_agent() -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "nodeagent", "--kubeconfig", str(KUBECONFIG)]
    argv += ["--state-dir", str(STATE / "agent"), "--bridge", BRIDGE, "--cidr", CIDR]
    argv += ["--session", agent_node.DEFAULT_SESSION]
    for node in NODES:
        argv += ["--node", node]
    return _spawn("agent", argv, {"PYTHONPATH": str(DEV)})


def start_operator(metrics_port: int, health_port: int) -> subprocess.Popen[bytes]:
    command = [str(Path(sys.executable).parent / "torchfleet-operator")]
    command += ["--kubeconfig", str(KUBECONFIG), "--health-address", "0.0.0.0"]
    # Only the demo's namespace: test runs on the same cluster keep their own.
    command += ["--namespace", NAMESPACE]
    command += ["--health-port", str(health_port), "--metrics-port", str(metrics_port)]
    # Quick restarts and progress so the demo moves in seconds, not minutes.
    env = {
        "KUBECONFIG": str(KUBECONFIG),
        "TORCHFLEET_OPERATOR_RESTART_BACKOFF_SECONDS": "2",
        "TORCHFLEET_OPERATOR_PROGRESS_INTERVAL_SECONDS": "3",
    }
    return _spawn("operator", command, env)


def tensorboard_argv(logdir: Path, port: int) -> list[str]:
    """TensorBoard (this interpreter's, from the trainer extra) on the loopback,
    re-reading the event files every few seconds while the job writes them."""
    argv = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir)]
    return [*argv, "--host", "127.0.0.1", "--port", str(port), "--reload_interval", "2"]


def checkpoint_claim_dir() -> Path:
    """The job's checkpoint volume, as the agent keeps it on this machine."""
    return STATE / "agent" / "volumes" / NAMESPACE / f"{JOB}-checkpoint"


def start_tensorboard() -> str:
    """TensorBoard on the job's curves (the trainer's default directory); its URL."""
    logdir = checkpoint_claim_dir() / "tensorboard"
    process = _spawn("tensorboard", tensorboard_argv(logdir, TENSORBOARD_PORT), {})
    url = f"http://127.0.0.1:{TENSORBOARD_PORT}"
    wait_for("TensorBoard", lambda: http_ok(f"{url}/data/environment"), 60, process)
    return url


def _spawn(name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / f"{name}.log", "ab") as log:
        process = subprocess.Popen(
            argv,
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=REPO,
        )
    (STATE / f"{name}.pid").write_text(str(process.pid))
    return process


def wait_for(what: str, check: Any, timeout: float, process: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if process is not None and process.poll() is not None:
            raise SystemExit(f"{what}: the process exited; see {STATE}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not ready after {timeout:.0f}s; see logs in {STATE}")
        time.sleep(0.5)


def nodes_ready() -> bool:
    out = kubectl("get", "nodes", "-l", LOCAL_NODES, "-o", "json")
    ready = {
        n["metadata"]["name"]
        for n in json.loads(out)["items"]
        for c in n["status"].get("conditions") or []
        if c["type"] == "Ready" and c["status"] == "True"
    }
    return set(NODES) <= ready


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---- the job ------------------------------------------------------------------------


def job_status() -> dict[str, Any]:
    out = kubectl("get", "trainingjob", JOB, "-n", NAMESPACE, "-o", "json")
    return dict(json.loads(out).get("status") or {})


def show_row(last: list[str]) -> None:
    row = kubectl("get", "tj", JOB, "-n", NAMESPACE, "--no-headers")
    status = job_status()
    progress = status.get("progress") or {}
    extra = ""
    if progress:
        # A gang just restarted shows only the step it resumes from: no loss,
        # rate or ETA until its master is scraped (never "None").
        shown = [f"step {progress.get('step')}/{progress.get('totalSteps')}"]
        for key, form in (
            ("loss", "loss {}"),
            ("validationLoss", "val loss {}"),
            ("tokensPerSecond", "{} tok/s"),
            ("etaSeconds", "eta {}s"),
        ):
            if progress.get(key) is not None:
                shown.append(form.format(progress[key]))
        shown.append(f"checkpoint {(status.get('lastCheckpoint') or {}).get('step')}")
        extra = "  " + "  ".join(shown)
    # A new line only when something but the AGE column (the last) changed.
    key = " ".join(row.split()[:-1]) + extra
    if not last or key != last[-1]:
        print(f"    {row.strip()}{extra}", flush=True)
        last.append(key)


def kill_a_worker_rank() -> None:
    pod = json.loads(kubectl("get", "pod", f"{JOB}-worker-0", "-n", NAMESPACE, "-o", "json"))
    ranks = procs.rank_processes(pod["metadata"]["uid"])
    if not ranks:
        raise SystemExit("found no rank process in the worker pod to kill")
    victim = ranks[0]
    say(f"killing worker rank {procname.rank_of(victim.pid)}'s process {victim.pid} (SIGKILL)")
    procs.kill(victim, signal.SIGKILL)


def trainer_events(pod: str, kind: str) -> list[list[dict[str, Any]]]:
    """The trainer's JSON events of one kind, per run of the pod, oldest first."""
    runs = agent_pod.pod_runs(STATE / "agent", NAMESPACE, pod)
    found = []
    for run in runs:
        log = run / "logs" / "trainer.log"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        found.append([json.loads(x) for x in lines if x.startswith("{") and f'"{kind}"' in x])
    return found


def run_job() -> None:
    kubectl("create", "namespace", NAMESPACE)
    corpus_dir = STATE / "agent" / "volumes" / NAMESPACE / "shakespeare-corpus"
    corpus_dir.mkdir(parents=True, exist_ok=True)
    source = write_corpus(corpus_dir / "input.txt")
    say(f"corpus: {source}")
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "shakespeare-corpus", "namespace": NAMESPACE},
        "spec": {"accessModes": ["ReadOnlyMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    kubectl("apply", "-f", "-", input=json.dumps(claim))
    say(f"kubectl apply -f examples/{EXAMPLE.name} -n {NAMESPACE}")
    print(kubectl("apply", "-f", str(EXAMPLE), "-n", NAMESPACE), end="")
    say("kubectl get tj (live): NAME PHASE NODES RESTARTS PROGRESS% AGE")

    rows: list[str] = []
    killed_at: float | None = None
    while True:
        show_row(rows)
        status = job_status()
        if status.get("phase") in ("Succeeded", "Failed"):
            break
        # The trainer's own log (of the current master) says at once when a
        # checkpoint is saved.
        current = trainer_events(f"{JOB}-master-0", "checkpoint")[-1:]
        saved = max((e["step"] for e in current[0]), default=0) if current else 0
        if killed_at is None and saved >= KILL_AFTER_CHECKPOINT_STEP:
            say(f"midway: checkpoint saved at step {saved}")
            kill_a_worker_rank()
            killed_at = time.time()
            say(
                "every pod's launcher restarts its processes in place and the gang meets "
                "again (no new pods; the operator counts it in status.inPlaceRestarts):"
            )
        time.sleep(0.5)
    report(status, killed_at)


def report(status: dict[str, Any], killed_at: float | None) -> None:
    def flat(kind: str) -> list[dict[str, Any]]:
        return [e for run in trainer_events(f"{JOB}-master-0", kind) for e in run]

    evals = flat("eval")
    if killed_at is not None:
        before = max((e["step"] for e in flat("checkpoint") if e["time"] < killed_at), default=None)
        after = [e["step"] for e in flat("resumed") if e["time"] > killed_at]
        counted = (status.get("inPlaceRestarts") or {}).get("total", 0)
        logged = [e["restarts"] for e in flat("in_place_restart") if e["time"] > killed_at]
        say(
            f"restarts in place: {counted} (status.inPlaceRestarts; the trainer logged "
            f"{logged[-1] if logged else 0}), of the gang: {status.get('restartCount')}; "
            f"last checkpoint before the kill: step {before}; training resumed at step "
            f"{after[0] if after else '?'}"
        )
    final_eval = evals[-1] if evals else {}
    say(
        f"job {status.get('phase')}: final validation loss {final_eval.get('val_loss')} "
        f"at step {final_eval.get('step')} (the trainer's log)"
    )
    progress = status.get("progress") or {}
    saved = sorted(p.name for p in checkpoint_claim_dir().glob("step-*"))
    say(
        f"status (from {progress.get('source')}): step {progress.get('step')}/"
        f"{progress.get('totalSteps')}, loss {progress.get('loss')}, validation loss "
        f"{progress.get('validationLoss')}, last checkpoint step "
        f"{(status.get('lastCheckpoint') or {}).get('step')} (on the volume: {', '.join(saved)})"
    )


# ---- up and down ---------------------------------------------------------------------


def down() -> None:
    """Stops what an earlier demo left running (agent last: it stops the pods)."""
    prom.stop(STATE / "prometheus")
    for name in STOPPED_IN_ORDER:
        pid_file = STATE / f"{name}.pid"
        if not pid_file.exists():
            continue
        stop_process(int(pid_file.read_text()))
        pid_file.unlink()


def stop_process(pid: int, grace_seconds: float = 60) -> None:
    """SIGTERM, then SIGKILL after the grace period."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline:
        if prom.exited(pid):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("command", nargs="?", choices=["run", "down"], default="run")
    parser.add_argument("--down-after", action="store_true", help="stop everything at the end")
    args = parser.parse_args()
    if args.command == "down":
        down()
        return
    if os.geteuid() != 0:
        raise SystemExit("the demo's node agent needs root (network and mount namespaces)")
    if not KUBECONFIG.exists():
        raise SystemExit("no cluster: run `make cluster-up` first")
    down()
    # A fresh start: the previous demo's pod logs and volumes would read as this run's.
    shutil.rmtree(STATE, ignore_errors=True)
    say("Prometheus with Kubernetes service discovery (built once, then cached)")
    binary = prom.prometheus_binary()
    print(f"    {binary}")

    say(f"node agent: nodes {', '.join(NODES)} run their pods as processes on this machine")
    agent = start_agent()
    wait_for("node agent", nodes_ready, 60, agent)
    print(kubectl("get", "nodes", "-l", LOCAL_NODES), end="")

    # An earlier demo's job goes before the operator starts, so it never sees it.
    kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true")
    say("operator (torchfleet-operator) with the CRD applied")
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    metrics_port, health_port = free_port(), free_port()
    operator = start_operator(metrics_port, health_port)
    wait_for("operator", lambda: http_ok(f"http://127.0.0.1:{health_port}/healthz"), 60, operator)
    manifests = prom.operator_endpoint_manifests("torchfleet-system", GATEWAY, metrics_port)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "torchfleet-system"}}
    items = {"apiVersion": "v1", "kind": "List", "items": [namespace, *manifests]}
    kubectl("apply", "-f", "-", input=json.dumps(items))

    say("Prometheus, discovering pods and the operator through the API server")
    running = prom.start(str(KUBECONFIG), STATE / "prometheus")
    print(f"    {running.url}")
    say("TensorBoard, on the job's curves as its rank 0 writes them")
    tensorboard_url = start_tensorboard()
    print(f"    {tensorboard_url}")

    started = time.monotonic()
    try:
        run_job()
        minutes = (time.monotonic() - started) / 60
        summary(running.url, tensorboard_url, minutes, args.down_after)
    finally:
        if args.down_after:
            down()


def summary(prometheus_url: str, tensorboard_url: str, minutes: float, going_down: bool) -> None:
    claim = checkpoint_claim_dir()
    say(f"done: the job ran in {minutes:.1f} min")
    print(f"    checkpoints:  {claim}")
    for path in sorted(claim.glob("*"))[:10]:
        print(f"                  {path.name}")
    print(f"    Prometheus:   {prometheus_url}  (HTTP API: /api/v1/query?query=...)")
    for query in (
        f'torchfleet_train_loss{{torchfleet_dev_job_name="{JOB}"}}',
        f'torchfleet_train_tokens_per_second{{torchfleet_dev_job_name="{JOB}"}}',
        f'torchfleet_operator_job_phase{{job_name="{JOB}"}}',
        "torchfleet_operator_jobs",
    ):
        print(f"                  {query}")
    print(f"    TensorBoard:  {tensorboard_url}  (loss, eval loss, lr, tokens/s, ...; event files")
    print(f"                  in {claim / 'tensorboard'})")
    print(f"    logs:         {STATE}/agent/pods/<namespace>_<pod>_<uid>/logs/")
    if not going_down:
        print(
            "    still running: node agent, operator, Prometheus, TensorBoard; "
            "stop them with `make demo-down` (python dev/demo.py down)"
        )


if __name__ == "__main__":
    main()
