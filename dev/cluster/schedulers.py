"""Gang schedulers beside the local control plane: scheduler-plugins and Volcano.

Started only for what needs them (the gang tests' fixture, or
``localcluster.py up --with coscheduling,volcano``), as local processes of
the running :class:`localcluster.LocalCluster`: logs in its ``logs/``, pid
files in its ``run/`` (so ``localcluster.py down`` stops them too), ports
shifted like the cluster's (localcluster.port),
readiness from each one's health endpoint, never a sleep.

- ``coscheduling``: scheduler-plugins' kube-scheduler as a second scheduler
  named ``scheduler-plugins-scheduler`` whose profile runs the Coscheduling
  plugin, and the scheduler-plugins controller, which writes the
  ``scheduling.x-k8s.io`` PodGroup's status (phase, counts).
- ``volcano``: vc-scheduler (scheduler name ``volcano``) with its built-in
  default configuration (enqueue, allocate, backfill; gang, proportion, ...).
  It writes the ``scheduling.volcano.sh`` PodGroup's phase and conditions
  itself and creates the ``default`` Queue, so no Volcano controller is needed
  (its Numatopology CRD is installed too: the scheduler waits for that
  informer to sync before it schedules anything).

Binaries and CRDs come from ``schedulers/build.sh`` (Go modules, cached).
Ports come from environment variables, like the control plane's.
Standard library only.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
COSCHEDULING = "coscheduling"
VOLCANO = "volcano"
SCHEDULERS = (COSCHEDULING, VOLCANO)
# The scheduler name pods ask for (scheduler-plugins' own second-scheduler
# install uses this name; Volcano's default --scheduler-name).
COSCHEDULING_SCHEDULER_NAME = "scheduler-plugins-scheduler"
VOLCANO_SCHEDULER_NAME = "volcano"
# Processes per scheduler, in start order.
PROCESSES = {
    COSCHEDULING: ("scheduler-plugins-controller", "scheduler-plugins"),
    VOLCANO: ("vc-scheduler",),
}


def _port(variable: str, default: int) -> int:
    from localcluster import port  # beside this file, loaded first

    return int(port(variable, default))


@dataclass(frozen=True)
class SchedulerPorts:
    coscheduling: int = field(default_factory=lambda: _port("TORCHFLEET_COSCHEDULING_PORT", 10371))
    coscheduling_probe: int = field(
        default_factory=lambda: _port("TORCHFLEET_COSCHEDULING_CONTROLLER_PORT", 10372)
    )
    volcano_healthz: int = field(default_factory=lambda: _port("TORCHFLEET_VOLCANO_PORT", 10373))
    volcano_metrics: int = field(
        default_factory=lambda: _port("TORCHFLEET_VOLCANO_METRICS_PORT", 10374)
    )


def parse_names(text: str) -> list[str]:
    """``"coscheduling,volcano"`` -> the names, checked."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = sorted(set(names) - set(SCHEDULERS))
    if unknown:
        raise ValueError(
            f"unknown scheduler(s) {', '.join(unknown)}; known: {', '.join(SCHEDULERS)}"
        )
    return names


def build(names: Iterable[str]) -> dict[str, Path]:
    """Folder of each scheduler's binaries and CRDs (built once, cached)."""
    names = list(names)
    out = subprocess.run(
        [str(HERE / "schedulers" / "build.sh"), *names],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    folders = out.stdout.strip().splitlines()[-len(names) :]
    return dict(zip(names, map(Path, folders), strict=True))


def running(cluster: Any, name: str) -> bool:
    return all(cluster._pid(process) is not None for process in PROCESSES[name])


def start(cluster: Any, names: Iterable[str], ports: SchedulerPorts | None = None) -> None:
    """Starts each named scheduler (its CRDs first) unless it runs already."""
    from localcluster import log, wait_for

    ports = ports or SchedulerPorts()
    wanted = [n for n in names if not running(cluster, n)]
    if not wanted:
        return
    for name, folder in build(wanted).items():
        _install_crds(cluster, folder)
        for process in PROCESSES[name]:
            link = cluster.bin / process
            link.unlink(missing_ok=True)
            link.symlink_to(folder / process)
        if name == COSCHEDULING:
            _start_coscheduling(cluster, ports, wait_for)
        else:
            _start_volcano(cluster, ports, wait_for)
        log(f"{name} ready (logs in {cluster.logs})")


def stop(cluster: Any, names: Iterable[str]) -> None:
    from localcluster import stop_process

    for name in names:
        for process in reversed(PROCESSES[name]):
            pid = cluster._pid(process)
            if pid is not None:
                stop_process(pid)
            (cluster.run / f"{process}.pid").unlink(missing_ok=True)


def _install_crds(cluster: Any, folder: Path) -> None:
    crds = sorted((folder / "crds").glob("*.yaml"))
    # Server-side apply: the Volcano CRDs are too large for the annotation
    # that client-side apply keeps; --force-conflicts takes over a CRD that a
    # test applied by hand (a minimal stand-in).
    for crd in crds:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
    from localcluster import wait_for

    for crd in crds:
        name = _crd_name(crd)
        # Not `kubectl wait`: it fails at once while a new CRD has no conditions yet.
        wait_for(lambda name=name: _established(cluster, name), f"CRD {name} Established", 60)


def _established(cluster: Any, name: str) -> bool:
    query = '{.status.conditions[?(@.type=="Established")].status}'
    try:
        return bool(
            cluster.kubectl("get", "crd", name, "-o", f"jsonpath={query}").strip() == "True"
        )
    except Exception:  # not there yet
        return False


def _crd_name(path: Path) -> str:
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("name:") and "." in stripped:
            return stripped.split(":", 1)[1].strip()
    raise ValueError(f"{path}: no CRD name")


def _start_coscheduling(cluster: Any, ports: SchedulerPorts, wait_for: Any) -> None:
    config = cluster.root / "coscheduling-config.json"
    config.write_text(json.dumps(_coscheduling_config(str(cluster.kubeconfig)), indent=2))
    cluster._start(
        "scheduler-plugins-controller",
        [
            f"--kubeconfig={cluster.kubeconfig}",
            f"--probeAddr=127.0.0.1:{ports.coscheduling_probe}",
            "--metricsAddr=0",  # off: its default :8080 would collide
            "--workers=4",
        ],
    )
    cluster._start(
        "scheduler-plugins",
        [
            f"--config={config}",
            f"--authentication-kubeconfig={cluster.kubeconfig}",
            f"--authorization-kubeconfig={cluster.kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.coscheduling}",
            "--v=2",
        ],
    )
    wait_for(
        lambda: cluster._http_ok(f"http://127.0.0.1:{ports.coscheduling_probe}/healthz"),
        "scheduler-plugins controller /healthz",
    )
    wait_for(
        lambda: cluster._https_ok(ports.coscheduling, "/healthz"), "scheduler-plugins /healthz"
    )


def _coscheduling_config(kubeconfig: str) -> dict[str, Any]:
    """A second scheduler whose one profile is Coscheduling (scheduler-plugins'
    manifests/coscheduling/scheduler-config.yaml, under the second-scheduler
    name its Helm chart uses)."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "clientConnection": {"kubeconfig": kubeconfig},
        "profiles": [
            {
                "schedulerName": COSCHEDULING_SCHEDULER_NAME,
                "plugins": {
                    "multiPoint": {"enabled": [{"name": "Coscheduling"}]},
                    "queueSort": {
                        "enabled": [{"name": "Coscheduling"}],
                        "disabled": [{"name": "*"}],
                    },
                },
                "pluginConfig": [
                    # The PodGroup's scheduleTimeoutSeconds overrides it.
                    {"name": "Coscheduling", "args": {"permitWaitingTimeSeconds": 60}}
                ],
            }
        ],
    }


def _start_volcano(cluster: Any, ports: SchedulerPorts, wait_for: Any) -> None:
    cluster._start(
        "vc-scheduler",
        [
            f"--kubeconfig={cluster.kubeconfig}",
            f"--scheduler-name={VOLCANO_SCHEDULER_NAME}",
            "--leader-elect=false",
            "--enable-healthz=true",
            f"--healthz-address=127.0.0.1:{ports.volcano_healthz}",
            f"--listen-address=127.0.0.1:{ports.volcano_metrics}",
            # Its cache dumper would write into /tmp on SIGUSR2; not needed.
            "--cache-dumper=false",
            "--v=3",
        ],
    )
    wait_for(
        lambda: cluster._http_ok(f"http://127.0.0.1:{ports.volcano_healthz}/healthz"),
        "vc-scheduler /healthz",
    )
    # It creates the default Queue at start; jobs without a queue go there.
    wait_for(lambda: _has_default_queue(cluster), "Volcano's default Queue")


def _has_default_queue(cluster: Any) -> bool:
    try:
        cluster.kubectl("get", "queues.scheduling.volcano.sh", "default")
        return True
    except Exception:  # ClusterError of the loading module
        return False
