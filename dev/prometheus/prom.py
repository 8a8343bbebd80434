"""Starts and stops a real Prometheus for the e2e tests and the demo.

    python dev/prometheus/prom.py start --kubeconfig K --dir D [--port P]
    python dev/prometheus/prom.py stop --dir D

``start`` renders prometheus.yml.in into D, starts Prometheus (the one
ensure.sh finds or builds, with Kubernetes service discovery) on a free
loopback port (or P), waits until it is ready, and prints its URL; the pid and
URL are kept in D for ``stop`` and for other tools. Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "prometheus.yml.in"
ENSURE = HERE / "ensure.sh"


class PrometheusError(RuntimeError):
    pass


def free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def prometheus_binary() -> str:
    """A Prometheus with Kubernetes SD: ensure.sh finds or builds one."""
    out = subprocess.run([str(ENSURE)], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def render_config(kubeconfig: str, scrape_interval: str) -> str:
    text = TEMPLATE.read_text()
    return text.replace("@KUBECONFIG@", kubeconfig).replace("@SCRAPE_INTERVAL@", scrape_interval)


@dataclass
class Prometheus:
    """A running Prometheus: its URL and how to query it."""

    url: str
    pid: int
    directory: Path

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query through the HTTP API; the result vector."""
        params = urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{params}", timeout=10) as response:
            body = json.load(response)
        if body.get("status") != "success":
            raise PrometheusError(f"query {promql!r} failed: {body}")
        return list(body["data"]["result"])

    def targets(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10) as response:
            return list(json.load(response)["data"]["activeTargets"])


def operator_endpoint_manifests(namespace: str, ip: str, port: int) -> list[dict[str, Any]]:
    """A selector-less Service and its EndpointSlice pointing at an operator that
    runs as a process on this machine (at an address pods and Prometheus reach),
    annotated for scraping as the Helm chart's Service is."""
    name = "torchfleet-operator-metrics"
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(port),
                "prometheus.io/path": "/metrics",
            },
        },
        "spec": {"clusterIP": "None", "ports": [{"name": "metrics", "port": port}]},
    }
    endpoints = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{name}-local",
            "namespace": namespace,
            "labels": {
                "kubernetes.io/service-name": name,
                "endpointslice.kubernetes.io/managed-by": "torchfleet-dev-harness",
            },
        },
        "addressType": "IPv4",
        "ports": [{"name": "metrics", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}],
    }
    return [service, endpoints]


def start(
    kubeconfig: str,
    directory: Path,
    port: int | None = None,
    scrape_interval: str = "2s",
    timeout: float = 60,
) -> Prometheus:
    binary = prometheus_binary()
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "prometheus.yml"
    config.write_text(render_config(str(Path(kubeconfig).resolve()), scrape_interval))
    address = f"127.0.0.1:{port or free_loopback_port()}"
    log = open(directory / "prometheus.log", "ab")  # noqa: SIM115 - handed to the child
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address={address}",
            "--web.enable-lifecycle",
            "--storage.tsdb.retention.time=1d",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    prometheus = Prometheus(f"http://{address}", process.pid, directory)
    (directory / "prometheus.json").write_text(
        json.dumps({"url": prometheus.url, "pid": process.pid})
    )
    _wait_ready(prometheus, process, timeout)
    return prometheus


def _wait_ready(prometheus: Prometheus, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log = (prometheus.directory / "prometheus.log").read_text()[-2000:]
            raise PrometheusError(f"prometheus exited with {process.returncode}:\n{log}")
        try:
            with urllib.request.urlopen(f"{prometheus.url}/-/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.3)
    raise PrometheusError(f"prometheus at {prometheus.url} not ready after {timeout}s")


def stop(directory: Path, timeout: float = 20) -> None:
    state = directory / "prometheus.json"
    if not state.exists():
        return
    pid = int(json.loads(state.read_text())["pid"])
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        state.unlink()
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not exited(pid):
        time.sleep(0.2)
    if not exited(pid):
        os.kill(pid, signal.SIGKILL)
    state.unlink()


def exited(pid: int) -> bool:
    """Whether the process is gone; reaps it when it is our own child (a
    child that has exited stays a zombie, alive to kill(0), until reaped)."""
    with contextlib.suppress(ChildProcessError):
        waited, _status = os.waitpid(pid, os.WNOHANG)
        if waited == pid:
            return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    start_cmd = sub.add_parser("start")
    start_cmd.add_argument("--kubeconfig", required=True)
    start_cmd.add_argument("--dir", required=True, type=Path)
    start_cmd.add_argument("--port", type=int)
    start_cmd.add_argument("--scrape-interval", default="2s")
    stop_cmd = sub.add_parser("stop")
    stop_cmd.add_argument("--dir", required=True, type=Path)
    args = parser.parse_args()
    if args.command == "start":
        print(start(args.kubeconfig, args.dir, args.port, args.scrape_interval).url)
    else:
        stop(args.dir)


if __name__ == "__main__":
    main()
