"""Operator scale benchmark: N TrainingJobs of 1 master + 8 workers on KWOK nodes.

Measured in one run against the same apiserver:
* baseline: a bare client creates the same 9*N pods (the manifests the
  operator would build) with the same API concurrency;
* operator: N TrainingJobs are applied and the operator creates the pods.
A third half, "services" (on by default; ``--no-services-baseline`` skips
it), is the bare client again creating each job's headless Service before its
pods: the cluster's own cost of the Services (the endpoint controllers and
the scheduler's default spread match every pod against every Service in its
namespace) apart from the operator's. The per-pod DNS names the Service gives
are a user feature the operator keeps, so the targets compare the operator
with this half (issue 32): pods/s >= 0.9x, apiserver requests per job
<= 1.1x, apply -> all created p99 <= 2x its time for all pods; the one huge
job (1 x 2,048) <= 1.1x its time.
For each: per-job latency from apply to all 9 pods created and to all 9
Running (p50/p99), pods created per second, apiserver requests per job (the
apiserver's own ``apiserver_request_total``); for the operator also its own
API calls per job, peak RSS and CPU seconds. JSON goes to benchmarks/results/.

    python benchmarks/bench_operator.py --jobs 100
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tests.fixtures.cluster import Cluster  # noqa: E402
from tests.fixtures.operator import apply_crd, fake_node, launch  # noqa: E402
from torchfleet_operator.api.v1alpha1 import TrainingJob  # noqa: E402
from torchfleet_operator.desired.pods import build_pod  # noqa: E402
from torchfleet_operator.desired.service import headless_service  # noqa: E402
from torchfleet_operator.kube import RawApi, make_api_client  # noqa: E402

PODS_PER_NODE = 500
# Between halves: idle is leases and node heartbeats, a few requests a second.
QUIET_WINDOW_S = 3.0
QUIET_REQUESTS_PER_S = 15.0
CONCURRENCY = 16
# The bench's halves in the order they run; "services" only with --services-baseline.
HALVES = ("baseline", "services", "operator")
BENCH_TAINT = {"key": "torchfleet.dev/bench", "value": "true", "effect": "NoSchedule"}
TEMPLATE = {
    "spec": {
        "nodeSelector": {"torchfleet.dev/bench-node": "true"},
        "tolerations": [{"key": "torchfleet.dev/bench", "operator": "Exists"}],
    }
}


@dataclass(frozen=True)
class Shape:
    """How many jobs, each of one master and ``workers`` workers."""

    jobs: int
    workers: int = 8

    @property
    def pods_per_job(self) -> int:
        return self.workers + 1

    def job_spec(self, template: dict[str, Any] = TEMPLATE) -> dict[str, Any]:
        return {
            "command": ["python", "train.py"],
            "master": {"template": template},
            "worker": {"replicas": self.workers, "template": template},
        }


def kubeconfig_for_run() -> str:
    explicit = os.environ.get("KUBECONFIG_BENCH") or os.environ.get("TORCHFLEET_TEST_KUBECONFIG")
    if explicit:
        return explicit
    spec = importlib.util.spec_from_file_location(
        "localcluster", REPO / "dev/cluster/localcluster.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["localcluster"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    cluster = module.LocalCluster()
    if not cluster.healthy():
        cluster.up()
    return str(cluster.kubeconfig)


def kubectl_runner(kubeconfig: str) -> Any:
    """The tests' kubectl (raises with its stderr; ``check=False`` returns the result)."""
    binary = REPO / ".cluster/bin/kubectl"
    found = binary if binary.exists() else Path(shutil.which("kubectl") or "kubectl")
    cluster = Cluster(kubeconfig, found.parent)

    def run(*args: str, **options: Any) -> Any:
        # Deleting a namespace of 9,000 pods takes minutes, not the fixtures' 120 s.
        return cluster.kubectl(*args, **{"timeout": 3600, **options})

    return run


@dataclass
class PodWatch:
    """Times when each job's pods were first seen and first seen Running (one watch)."""

    pods_per_job: int

    created: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    running: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    stop: threading.Event = field(default_factory=threading.Event)
    # The watch thread records while the main thread counts: one lock for both.
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, raw: RawApi, namespace: str) -> None:
        """Watches until stopped; a stream the apiserver closes (slow consumer,
        timeout) is resumed from the last resourceVersion, or relisted."""
        resource_version: str | None = None
        while not self.stop.is_set():
            try:
                resource_version = self._stream(raw, namespace, resource_version)
            except Exception:  # connection reset under load: resume
                time.sleep(0.2)

    def _stream(self, raw: RawApi, namespace: str, resource_version: str | None) -> str | None:
        query = [("watch", "true"), ("labelSelector", "bench-job"), ("timeoutSeconds", "600")]
        if resource_version:
            query.append(("resourceVersion", resource_version))
        _, url, headers, _, _ = raw.api.param_serialize(
            "GET",
            f"/api/v1/namespaces/{namespace}/pods",
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = raw.api.rest_client.pool_manager.request(
            "GET", url, headers=headers, preload_content=False, timeout=None
        )
        buffer = b""
        try:
            for chunk in response.stream(64 * 1024):
                if self.stop.is_set():
                    break
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                now = time.monotonic()
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event["type"] == "ERROR":  # e.g. 410 Gone: relist from scratch
                        return None
                    self._record(event["object"], now)
                    resource_version = event["object"]["metadata"]["resourceVersion"]
        finally:
            response.release_conn()
        return resource_version

    def _record(self, pod: dict[str, Any], now: float) -> None:
        meta = pod.get("metadata") or {}
        job = (meta.get("labels") or {}).get("bench-job")
        if not job:
            return
        with self.lock:
            self.created[job].setdefault(meta["name"], now)
            if (pod.get("status") or {}).get("phase") == "Running":
                self.running[job].setdefault(meta["name"], now)

    def complete(self, jobs: int, which: dict[str, dict[str, float]]) -> bool:
        with self.lock:
            done = sum(1 for pods in which.values() if len(pods) >= self.pods_per_job)
            return done >= jobs


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def latencies(
    started: dict[str, float], seen: dict[str, dict[str, float]], pods_per_job: int
) -> list[float]:
    return [
        max(seen[job].values()) - t0
        for job, t0 in started.items()
        if len(seen.get(job, {})) >= pods_per_job
    ]


@dataclass
class ApiserverFigures:
    """The apiserver's own counters: requests (watches aside), and for each kind of
    call (verb, resource, subresource) the seconds it spent handling them and how many."""

    requests: float = 0.0
    calls: dict[str, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0.0]))

    def minus(self, before: ApiserverFigures) -> ApiserverFigures:
        delta = ApiserverFigures(self.requests - before.requests)
        for call, (seconds, count) in self.calls.items():
            old = before.calls.get(call, [0.0, 0.0])
            if count - old[1] > 0:
                delta.calls[call] = [seconds - old[0], count - old[1]]
        return delta

    def busiest(self, jobs: int, top: int = 8) -> list[dict[str, Any]]:
        """Where the apiserver's time went, most first: per job, and mean latency."""
        ranked = sorted(self.calls.items(), key=lambda item: -item[1][0])[:top]
        return [
            {
                "call": call,
                "seconds": seconds,
                "per_job": count / jobs,
                "mean_ms": 1000 * seconds / count,
            }
            for call, (seconds, count) in ranked
        ]


def apiserver_figures(raw: RawApi) -> ApiserverFigures:
    response = raw.api.call_api(
        *raw.api.param_serialize(
            "GET", "/metrics", header_params={"Accept": "text/plain"}, auth_settings=["BearerToken"]
        )[:4]
    )
    response.read()
    figures = ApiserverFigures()
    for family in text_string_to_metric_families(response.data.decode()):
        for sample in family.samples:
            labels = sample.labels
            if labels.get("verb") == "WATCH":
                continue
            if sample.name == "apiserver_request_total":
                figures.requests += sample.value
            elif sample.name in (
                "apiserver_request_duration_seconds_sum",
                "apiserver_request_duration_seconds_count",
            ):
                parts = ("verb", "resource", "subresource")
                call = " ".join(filter(None, (labels.get(part) for part in parts)))
                column = 0 if sample.name.endswith("_sum") else 1
                figures.calls[call][column] += sample.value
    return figures


def ensure_bench_nodes(raw: RawApi, count: int) -> None:
    for index in range(count):
        name = f"bench-node-{index}"
        node = fake_node(
            name, BENCH_TAINT, {"torchfleet.dev/bench-node": "true"}, pods=PODS_PER_NODE
        )
        try:
            raw.request("POST", "/api/v1/nodes", node)
        except Exception as exc:  # already there from an earlier run
            if getattr(exc, "status", None) != 409:
                raise


def wait_until(what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached in {timeout:.0f}s")
        time.sleep(0.1)


def baseline_run(
    raw: RawApi, namespace: str, shape: Shape, timeout: float, services: bool = False
) -> dict[str, Any]:
    """A bare client creating exactly the pods the operator would create, CONCURRENCY
    requests in flight, job after job (so one huge job's pods go in parallel too).
    With ``services``, each job's headless Service is sent just before its master,
    by the same thread. A job's clock starts when its first object is sent."""
    watch = PodWatch(shape.pods_per_job)
    threading.Thread(target=watch.run, args=(raw, namespace), daemon=True).start()
    time.sleep(0.5)
    spec = TrainingJob.model_validate({"metadata": {"name": "x"}, "spec": shape.job_spec()}).spec
    before = apiserver_figures(raw)
    cpu_before = component_cpu()
    started: dict[str, float] = {}
    uids: dict[str, str] = {}

    def create_pod(job_rank: tuple[int, int]) -> None:
        job = f"job-{job_rank[0]:05d}"
        started.setdefault(job, time.monotonic())
        uid = uids.setdefault(job, str(uuid.uuid4()))
        if services and job_rank[1] == 0:
            service = headless_service(job, namespace, uid)
            service["metadata"].pop("ownerReferences")
            raw.request("POST", f"/api/v1/namespaces/{namespace}/services", service)
        pod = build_pod(job, namespace, uid, spec, job_rank[1], 0, "bench/trainer:1")
        pod["metadata"].pop("ownerReferences")  # no TrainingJob owns these
        pod["metadata"]["labels"]["bench-job"] = job
        raw.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)

    t0 = time.monotonic()
    pods = [(job, rank) for job in range(shape.jobs) for rank in range(shape.pods_per_job)]
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(create_pod, pods))
    created = lambda: watch.complete(shape.jobs, watch.created)  # noqa: E731
    wait_until("baseline pods created", created, timeout)
    created_at = time.monotonic()
    wait_until("baseline pods running", lambda: watch.complete(shape.jobs, watch.running), timeout)
    after = apiserver_figures(raw)
    watch.stop.set()
    result = summary(shape, started, watch, t0, created_at, after.minus(before))
    result["component_cpu_seconds"] = cpu_spent(cpu_before)
    return result


def operator_run(
    raw: RawApi, kubeconfig: str, namespace: str, shape: Shape, timeout: float
) -> dict[str, Any]:
    log = Path(tempfile.mkdtemp(prefix="bench-operator-")) / "operator.log"
    operator = launch(
        kubeconfig,
        log,
        env={
            "TORCHFLEET_OPERATOR_LOG_LEVEL": "WARNING",
            "TORCHFLEET_OPERATOR_API_CONCURRENCY": str(CONCURRENCY),
            # Production defaults, not the tests' short ones (KWOK pods have no
            # /metrics: the progress poller's failed attempts are part of the cost).
            "TORCHFLEET_OPERATOR_PROGRESS_INTERVAL_SECONDS": "15",
        },
        namespaces=[namespace],
    )
    try:
        operator.wait_ready()
        watch = PodWatch(shape.pods_per_job)
        jobs = shape.jobs
        threading.Thread(target=watch.run, args=(raw, namespace), daemon=True).start()
        time.sleep(0.5)
        before_api = apiserver_figures(raw)
        cpu_before = component_cpu()
        before_own = operator.metric("torchfleet_operator_api_requests_total")
        before_patches = operator.metric("torchfleet_operator_api_requests_total", verb="PATCH")
        started: dict[str, float] = {}
        admission: dict[str, float] = {}
        path = f"/apis/torchfleet.dev/v1alpha1/namespaces/{namespace}/trainingjobs"

        def apply(index: int) -> None:
            job = f"job-{index:05d}"
            template = {"metadata": {"labels": {"bench-job": job}}, **TEMPLATE}
            spec = shape.job_spec(template)
            submitted = time.monotonic()
            raw.request(
                "POST",
                path,
                {
                    "apiVersion": "torchfleet.dev/v1alpha1",
                    "kind": "TrainingJob",
                    "metadata": {"name": job},
                    "spec": spec,
                },
            )
            # The clock starts when the apiserver has accepted the job: what it
            # spends admitting the object (CEL validation) is not the operator's.
            started[job] = time.monotonic()
            admission[job] = started[job] - submitted

        t0 = time.monotonic()
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            list(pool.map(apply, range(jobs)))
        wait_until("operator pods created", lambda: watch.complete(jobs, watch.created), timeout)
        created_at = time.monotonic()
        wait_until("operator pods running", lambda: watch.complete(jobs, watch.running), timeout)
        # Let the jobs' status settle (Running), then count calls.
        wait_until(
            "jobs Running",
            lambda: operator.metric("torchfleet_operator_jobs", phase="Running") >= jobs,
            timeout,
        )
        after_api = apiserver_figures(raw)
        own = operator.metric("torchfleet_operator_api_requests_total") - before_own
        patches = (
            operator.metric("torchfleet_operator_api_requests_total", verb="PATCH") - before_patches
        )
        result = summary(shape, started, watch, t0, created_at, after_api.minus(before_api))
        result["operator_api_calls_per_job"] = own / jobs
        result["operator_status_writes_per_job"] = patches / jobs  # its only PATCHes
        result["job_create_p50_s"] = statistics.median(admission.values())
        result["component_cpu_seconds"] = cpu_spent(cpu_before)
        result.update(process_usage(operator.process.pid))
        watch.stop.set()
        return result
    finally:
        operator.stop()


# The control plane's processes by /proc comm (15 characters at most).
COMPONENTS = ("kube-apiserver", "etcd", "kube-controller", "kube-scheduler", "kwok")


def _cpu_seconds(pid: str) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def component_cpu() -> dict[str, float]:
    """CPU seconds so far of each control-plane process on this machine: on two
    cores, what the operator's half costs the apiserver, etcd, the scheduler and
    KWOK is part of why its pods come later."""
    found: dict[str, float] = defaultdict(float)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            comm = (proc / "comm").read_text().strip()
            if comm in COMPONENTS:
                found[comm] += _cpu_seconds(proc.name)
        except OSError:  # ended meanwhile
            continue
    return dict(found)


def cpu_spent(before: dict[str, float]) -> dict[str, float]:
    now = component_cpu()
    return {name: now.get(name, 0.0) - before.get(name, 0.0) for name in COMPONENTS}


def process_usage(pid: int) -> dict[str, float]:
    """Peak RSS (VmHWM) and CPU seconds of the operator process, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    peak_kib = next(
        int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")
    )
    return {
        "operator_peak_rss_mib": peak_kib / 1024,
        "operator_cpu_seconds": _cpu_seconds(str(pid)),
    }


def summary(
    shape: Shape,
    started: dict[str, float],
    watch: PodWatch,
    t0: float,
    created_at: float,
    apiserver: ApiserverFigures,
) -> dict[str, Any]:
    with watch.lock:
        created = latencies(started, watch.created, shape.pods_per_job)
        running = latencies(started, watch.running, shape.pods_per_job)
    pods = shape.jobs * shape.pods_per_job
    return {
        "jobs": shape.jobs,
        "pods": pods,
        "created_p50_s": statistics.median(created),
        "created_p99_s": percentile(created, 0.99),
        "running_p50_s": statistics.median(running),
        "running_p99_s": percentile(running, 0.99),
        "pods_created_per_s": pods / (created_at - t0),
        "all_created_s": created_at - t0,
        "apiserver_requests_per_job": apiserver.requests / shape.jobs,
        "apiserver_busiest_calls": apiserver.busiest(shape.jobs),
    }


def delete_namespace(raw: RawApi, kubectl: Any, namespace: str, timeout: float) -> None:
    """Waits until it is gone: its pods' deletion must not load the next run.

    The pods go first in one force delete (grace period 0): left to the
    namespace controller, each of 9,000 KWOK pods takes a graceful delete and a
    second, KWOK-issued one, which took ~8 minutes on the 2-core box."""
    try:
        pods = f"/api/v1/namespaces/{namespace}/pods"
        raw.request("DELETE", pods, query={"gracePeriodSeconds": 0})
    except Exception as exc:  # a client timeout mid-collection: the namespace delete finishes it
        print(f"force delete of {namespace}'s pods went on past the client timeout: {exc}")
    try:
        kubectl("delete", "namespace", namespace, f"--timeout={int(timeout)}s")
    except Exception as exc:  # the figures are taken: a slow clean-up must not lose them
        print(f"namespace {namespace} still being deleted: {exc}")


def wait_quiet(raw: RawApi, timeout: float) -> None:
    """Waits until the apiserver is back to its idle request rate: after a
    namespace is gone, the controllers are still deleting what the Services left
    (kcm's DELETE endpoints, the garbage collector's slices), which would
    otherwise land in the next half's figures."""
    start = time.monotonic()
    last = apiserver_figures(raw).requests
    while time.monotonic() < start + timeout:
        time.sleep(QUIET_WINDOW_S)
        now = apiserver_figures(raw).requests
        if now - last <= QUIET_REQUESTS_PER_S * QUIET_WINDOW_S:
            print(f"apiserver quiet {time.monotonic() - start:.0f}s after the clean-up")
            return
        last = now
    print(f"the apiserver was still busy {timeout:.0f}s after the clean-up; going on")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument(
        "--workers", type=int, default=8, help="workers per job (the huge case: 2047)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        help="seconds allowed for each wait (default: 900, or 3 s per job above 300 jobs)",
    )
    parser.add_argument(
        "--services-baseline",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a third half: the bare client creating each job's headless Service, then its "
        "pods (the targets' yardstick; without it they fall back to the pods-only baseline)",
    )
    args = parser.parse_args()
    args.timeout = args.timeout or max(900.0, 3.0 * args.jobs)
    kubeconfig = kubeconfig_for_run()
    kubectl = kubectl_runner(kubeconfig)
    apply_crd(kubectl)
    raw = RawApi(make_api_client(kubeconfig, pool_size=64))
    shape = Shape(args.jobs, args.workers)
    ensure_bench_nodes(raw, math.ceil(args.jobs * shape.pods_per_job / PODS_PER_NODE) + 1)
    run_id = uuid.uuid4().hex[:6]
    results: dict[str, Any] = {"jobs": args.jobs, "pods_per_job": shape.pods_per_job}
    for name in HALVES:
        if name == "services" and not args.services_baseline:
            continue
        namespace = f"bench-{name}-{run_id}"
        kubectl("create", "namespace", namespace)
        try:
            if name != "operator":
                services = name == "services"
                results[name] = baseline_run(raw, namespace, shape, args.timeout, services)
            else:
                results[name] = operator_run(raw, kubeconfig, namespace, shape, args.timeout)
        finally:
            delete_namespace(raw, kubectl, namespace, args.timeout)
            wait_quiet(raw, args.timeout)
    # The fake nodes go too (KWOK keeps heart-beating them otherwise).
    kubectl("delete", "nodes", "-l", "torchfleet.dev/bench-node=true", "--wait=false")
    base, op = results["baseline"], results["operator"]
    results["ratio_operator_vs_baseline"] = {
        "pods_created_per_s": op["pods_created_per_s"] / base["pods_created_per_s"],
        "created_p50": op["created_p50_s"] / base["created_p50_s"],
        "running_p50": op["running_p50_s"] / base["running_p50_s"],
        "apiserver_requests_per_job": op["apiserver_requests_per_job"]
        / base["apiserver_requests_per_job"],
        # Issue 17's yardstick: the slowest job against the bare client's time for all pods.
        "created_p99_vs_baseline_all_created": op["created_p99_s"] / base["all_created_s"],
    }
    if "services" in results:  # the operator against a bare client paying for the same Services
        svc = results["services"]
        results["ratio_operator_vs_services"] = {
            "pods_created_per_s": op["pods_created_per_s"] / svc["pods_created_per_s"],
            "running_p50": op["running_p50_s"] / svc["running_p50_s"],
            "apiserver_requests_per_job": op["apiserver_requests_per_job"]
            / svc["apiserver_requests_per_job"],
            "created_p99_vs_baseline_all_created": op["created_p99_s"] / svc["all_created_s"],
        }
    results["targets"] = targets(results)
    out_dir = REPO / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    out = out_dir / f"operator-{args.jobs}x{shape.pods_per_job}-{stamp}.json"
    results["load_average_1m_at_end"] = os.getloadavg()[0]
    results["cpus"] = os.cpu_count()
    out.write_text(json.dumps(results, indent=2))
    print_table(results)
    print(f"\nwritten: {out.relative_to(REPO)}")
    return 0


def targets(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The targets for this shape: (figure, limit, met), against the bare client
    that pays for the same Services (issue 32), or the pods-only one when that
    half did not run. The many-jobs case and the one huge job (1 master + 2,047
    workers) have their own; the operator's own CPU and memory are absolute."""
    op = results["operator"]
    ratio = results.get("ratio_operator_vs_services") or results["ratio_operator_vs_baseline"]
    if results["jobs"] == 1:
        wanted = {"created_p99_vs_baseline_all_created": ("<=", 1.1)}
    else:
        per_1000 = op["operator_cpu_seconds"] * 1000 / results["jobs"]
        ratio = {**ratio, "operator_cpu_seconds_per_1000_jobs": per_1000}
        ratio["operator_peak_rss_mib"] = op["operator_peak_rss_mib"]
        wanted = {
            "pods_created_per_s": (">=", 0.9),
            "created_p99_vs_baseline_all_created": ("<=", 2.0),
            "apiserver_requests_per_job": ("<=", 1.1),
            "operator_cpu_seconds_per_1000_jobs": ("<=", 40.0),
            # The issue sets it at 1,000 jobs; smaller runs report it all the same.
            "operator_peak_rss_mib": ("<=", 150.0),
        }
    return {
        name: {
            "value": ratio[name],
            "limit": f"{op_} {limit}",
            "met": ratio[name] >= limit if op_ == ">=" else ratio[name] <= limit,
        }
        for name, (op_, limit) in wanted.items()
    }


def print_table(results: dict[str, Any]) -> None:
    halves = [name for name in HALVES if name in results]
    op = results["operator"]
    rows = [
        ("apply -> all pods created p50 (s)", "created_p50_s"),
        ("apply -> all pods created p99 (s)", "created_p99_s"),
        ("apply -> all pods Running p50 (s)", "running_p50_s"),
        ("apply -> all pods Running p99 (s)", "running_p99_s"),
        ("pods created per second", "pods_created_per_s"),
        ("all pods created (s)", "all_created_s"),
        ("apiserver requests per job", "apiserver_requests_per_job"),
    ]
    pad = " " * 12 * (len(halves) - 1)  # the operator's own rows: its column only
    print(f"\n{results['jobs']} jobs x {results['pods_per_job']} pods")
    print(f"{'':38}" + "".join(f"{name:>12}" for name in halves))
    for label, key in rows:
        print(f"{label:38}" + "".join(f"{results[name][key]:12.2f}" for name in halves))
    print(f"{'TrainingJob POST (admission) p50 (s)':38}{pad}{op['job_create_p50_s']:12.2f}")
    print(f"{'operator API calls per job (own)':38}{pad}{op['operator_api_calls_per_job']:12.2f}")
    print(f"{'  of which status writes':38}{pad}{op['operator_status_writes_per_job']:12.2f}")
    print(f"{'operator peak RSS (MiB)':38}{pad}{op['operator_peak_rss_mib']:12.1f}")
    print(f"{'operator CPU seconds':38}{pad}{op['operator_cpu_seconds']:12.1f}")
    ratio = results["ratio_operator_vs_baseline"]
    print(
        f"operator/baseline: pods/s {ratio['pods_created_per_s']:.2f}, "
        f"created p50 {ratio['created_p50']:.2f}, running p50 {ratio['running_p50']:.2f}"
    )
    if "ratio_operator_vs_services" in results:
        ratio = results["ratio_operator_vs_services"]
        print(
            f"operator/services: pods/s {ratio['pods_created_per_s']:.2f}, "
            f"running p50 {ratio['running_p50']:.2f}, "
            f"requests per job {ratio['apiserver_requests_per_job']:.2f}"
        )
    print(f"load average (1 min) at the end: {results['load_average_1m_at_end']:.1f}")
    for name in halves:
        print(f"apiserver time by call, {name} run (seconds, per job, mean ms):")
        for call in results[name]["apiserver_busiest_calls"]:
            print(
                f"  {call['call']:44}{call['seconds']:9.1f}{call['per_job']:9.2f}"
                f"{call['mean_ms']:9.1f}"
            )
    heading = "CPU seconds by control-plane process (to all Running):"
    print(f"{heading:54}" + "".join(f"{name:>10}" for name in halves))
    for component in COMPONENTS:
        spent = [results[name]["component_cpu_seconds"][component] for name in halves]
        print(f"  {component:52}" + "".join(f"{value:10.1f}" for value in spent))
    cpu_pad = " " * 10 * (len(halves) - 1)
    print(f"  {'the operator itself':52}{cpu_pad}{op['operator_cpu_seconds']:10.1f}")
    against = "services" if "ratio_operator_vs_services" in results else "baseline"
    for name, target in results["targets"].items():
        verdict = "met" if target["met"] else "NOT met"
        print(f"target {name} (vs {against}): {target['value']:.2f} ({target['limit']}): {verdict}")


if __name__ == "__main__":
    sys.exit(main())
