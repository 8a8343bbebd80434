"""One pod's lifecycle on this node: sandbox, init containers, containers, status."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import network, podspec, runtime
from .cgroups import NodeCgroups

log = logging.getLogger("nodeagent.pod")

RESTART_BACKOFF_SECONDS = 1.0
# How often a pod waiting for a missing ConfigMap or Secret looks again (the
# kubelet retries its volume mounts on a back-off starting near this).
MISSING_SOURCE_RETRY_SECONDS = 1.0
# The API server's default terminationMessagePath.
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
# A pod directory's start time (ns since the epoch), written whole when it starts.
STARTED = "started"


@dataclass(frozen=True)
class NodeContext:
    """What the node gives every pod it runs."""

    node_name: str
    host_ip: str
    state_dir: Path
    bridge: network.Bridge
    addresses: network.AddressPool
    base_env: Mapping[str, str]
    read_config: podspec.DataLookup
    read_secret: podspec.DataLookup
    # Where this node's pods' cgroups go (only the usable controllers).
    cgroups: NodeCgroups

    def claim_dir(self, namespace: str, claim: str) -> Path:
        path = self.state_dir / "volumes" / namespace / claim
        path.mkdir(parents=True, exist_ok=True)
        return path

    def lookup_config(self, namespace: str, name: str, key: str) -> str | None:
        return (self.read_config(namespace, name) or {}).get(key)

    def lookup_secret(self, namespace: str, name: str, key: str) -> str | None:
        return (self.read_secret(namespace, name) or {}).get(key)


def pod_dir_name(pod: Mapping[str, Any]) -> str:
    meta = pod["metadata"]
    return f"{meta['namespace']}_{meta['name']}_{meta['uid']}"


def pod_runs(state_dir: Path, namespace: str, name: str) -> list[Path]:
    """The directory of every run of a pod by that name (a gang restart makes a new
    pod with the same name), oldest first; one not started yet is not a run."""
    found = (state_dir / "pods").glob(f"{namespace}_{name}_*")
    started = [run for run in found if (run / STARTED).exists()]
    return sorted(started, key=lambda run: int((run / STARTED).read_text()))


def phase_of(restart_policy: str, exit_codes: list[int | None], initialized: bool) -> str:
    """The pod phase from its containers' exit codes (None: still running)."""
    if not initialized:
        return "Pending"
    if any(code is None for code in exit_codes):
        return "Running"
    if all(code == 0 for code in exit_codes):
        return "Succeeded" if restart_policy != "Always" else "Running"
    return "Failed" if restart_policy == "Never" else "Running"


class PodRunner:
    def __init__(self, pod: Mapping[str, Any], node: NodeContext) -> None:
        self.pod = pod
        self.node = node
        self.uid: str = pod["metadata"]["uid"]
        self.key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        self.restart_policy: str = pod["spec"].get("restartPolicy") or "Always"
        self.pod_dir = node.state_dir / "pods" / pod_dir_name(pod)
        self.sandbox: runtime.PodSandbox | None = None
        self.net: network.PodNetwork | None = None
        self.init_runs: list[runtime.ContainerRun] = []
        self.runs: list[runtime.ContainerRun] = []
        self.started_at = runtime.now_rfc3339()
        self.failure: str | None = None
        # A ConfigMap or Secret the pod needs and the API server does not have
        # yet (podspec.SourceMissing): the pod waits, looked at again from tick().
        self.missing: podspec.SourceMissing | None = None
        self._next_look = 0.0
        self.stopped = False
        # The node's CPU throttle (1.0: none), applied to each container's quota.
        self.cpu_throttle = 1.0

    # ---- start ----------------------------------------------------------------

    def start(self, hosts_content: Callable[[str], str]) -> None:
        """Builds the sandbox and starts the first container; a pod this node
        cannot run is marked failed with a message naming the field."""
        self.pod_dir.mkdir(parents=True, exist_ok=True)
        # The pod as it was started, and when: tools order a pod's runs by it
        # (a gang restart reuses pod names).
        (self.pod_dir / "pod.json").write_text(json.dumps(self.pod, indent=1))
        # Written whole or not at all: a reader never sees an empty "started".
        partial = self.pod_dir / f"{STARTED}.partial"
        partial.write_text(f"{time.time_ns()}\n")
        partial.replace(self.pod_dir / STARTED)
        (self.pod_dir / "logs").mkdir(exist_ok=True)
        workdir = self.pod_dir / "workdir"
        workdir.mkdir(exist_ok=True)
        ip = self.node.addresses.allocate()
        self.net = network.create_pod_network(self.uid, ip, self.node.bridge)
        spec = self.pod["spec"]
        hostname = spec.get("hostname") or self.pod["metadata"]["name"]
        self.sandbox = runtime.PodSandbox(self.pod_dir, self.net.netns_path, hostname, ip)
        (self.pod_dir / "hostname").write_text(hostname + "\n")
        host_nss = Path("/etc/nsswitch.conf")
        nss = host_nss.read_text() if host_nss.exists() else ""
        (self.pod_dir / "nsswitch.conf").write_text(runtime.files_only_nsswitch(nss))
        self.sandbox.write_hosts(hosts_content(ip))
        if self._prepare():
            self.tick()

    def _prepare(self) -> bool:
        """The pod's containers, made from its spec; False while a source it
        needs is missing (it waits) or when it cannot run here (it fails, with a
        message naming the field)."""
        workdir = str(self.pod_dir / "workdir")
        spec = self.pod["spec"]
        try:
            self.init_runs = self._runs(spec.get("initContainers") or [], workdir)
            self.runs = self._runs(spec.get("containers") or [], workdir)
        except podspec.SourceMissing as error:
            if str(self.missing) != str(error):
                log.info("pod %s waits: %s", self.key, error)
            self.missing = error
            self._next_look = time.monotonic() + MISSING_SOURCE_RETRY_SECONDS
            return False
        except (podspec.PodSpecError, OSError) as error:
            self.missing = None
            self.failure = str(error)
            log.warning("pod %s cannot run here: %s", self.key, error)
            return False
        self.missing = None
        return True

    def _with_ip(self) -> dict[str, Any]:
        assert self.net is not None
        status = {**(self.pod.get("status") or {}), "podIP": self.net.ip}
        status.update(podIPs=[{"ip": self.net.ip}], hostIP=self.node.host_ip)
        return {**self.pod, "status": status}

    def _runs(
        self, containers: list[Mapping[str, Any]], workdir: str
    ) -> list[runtime.ContainerRun]:
        pod = self._with_ip()
        sources = podspec.volume_sources(
            pod, self.pod_dir, self.node.claim_dir, self.node.read_config, self.node.read_secret
        )
        for source in sources.values():
            if source.kind == "files":
                assert source.path is not None
                runtime.write_files(Path(source.path), source.files)
            elif source.kind == "dir":
                assert source.path is not None
                Path(source.path).mkdir(parents=True, exist_ok=True)
        # A container's own /tmp, as an image's writable layer gives it: what a
        # killed process leaves there (torchelastic's folders) goes with the pod.
        tmp = self.pod_dir / "volumes" / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        base_env = {
            **self.node.base_env,
            "HOSTNAME": self.sandbox.hostname if self.sandbox else "",
            "TMPDIR": str(tmp),
        }
        runs = []
        for container in containers:
            env = podspec.container_env(
                pod,
                container,
                base_env,
                self.node.lookup_config,
                self.node.lookup_secret,
                self.node.read_config,
                self.node.read_secret,
            )
            launch = podspec.container_launch(pod, container, env, sources, workdir)
            # The kubelet's terminationMessagePath: a file of the container's own,
            # bound over the path, read back into its terminated state.
            message = self.pod_dir / "termination" / f"{launch.name}.log"
            message.parent.mkdir(parents=True, exist_ok=True)
            message.write_bytes(b"")
            target = container.get("terminationMessagePath") or TERMINATION_MESSAGE_PATH
            launch.mounts.append(podspec.Mount(target, str(message)))
            for mount in launch.mounts:
                if runtime.prepare_mountpoint(mount) and self.sandbox:
                    self.sandbox.created_mountpoints.append(mount.target)
            name = launch.name
            unenforced = self.node.cgroups.unenforced(launch.limits)
            if unenforced:
                log.error(
                    "%s/%s: %s not enforced (cgroup controller unusable, see the agent's start)",
                    self.key,
                    name,
                    " and ".join(unenforced),
                )
            runs.append(
                runtime.ContainerRun(
                    launch,
                    log_path=self.pod_dir / "logs" / f"{name}.log",
                    plan_path=self.pod_dir / f"launch-{name}.json",
                    message_path=message,
                    cgroup=self.node.cgroups.container(self.uid, name, launch.limits),
                )
            )
        return runs

    # ---- progress ---------------------------------------------------------------

    @property
    def initialized(self) -> bool:
        return all(run.exit_code == 0 for run in self.init_runs)

    @property
    def phase(self) -> str:
        if self.failure is not None:
            return "Failed"
        if self.missing is not None:
            return "Pending"
        init_failed = (
            any(run.exit_code not in (None, 0) for run in self.init_runs)
            and self.restart_policy == "Never"
        )
        if init_failed:
            return "Failed"
        codes = [run.exit_code if run.process else None for run in self.runs]
        return phase_of(self.restart_policy, codes, self.initialized)

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    def tick(self) -> bool:
        """Polls processes and starts what is due; True if the status changed."""
        if self.failure is not None or self.stopped or self.sandbox is None:
            return False
        if self.missing is not None:
            if time.monotonic() < self._next_look:
                return False
            waited = str(self.missing)
            if not self._prepare():
                return str(self.missing) != waited  # failed, or waits for another source
            log.info("pod %s: what it waited for exists (%s)", self.key, waited)
        changed = False
        for run in self.init_runs + self.runs:
            if runtime.poll_container(run):
                log.info("%s/%s exited %s", self.key, run.launch.name, run.exit_code)
                changed = True
        if self.terminal:
            return changed
        for run in self._due_runs():
            if run.exit_code is not None:
                run.restart_count += 1
            try:
                runtime.start_container(self.sandbox, run, self.cpu_throttle)
            except (OSError, subprocess.SubprocessError) as error:
                # Its cgroups could not be set up or joined (the latter raises
                # from the child's preexec_fn): fail the pod once, not every pass.
                self.failure = f"container {run.launch.name} could not start: {error}"
                log.error("pod %s: %s", self.key, self.failure)
                return True
            log.info(
                "%s/%s started (pid %s)", self.key, run.launch.name, run.process and run.process.pid
            )
            changed = True
        return changed

    def _due_runs(self) -> list[runtime.ContainerRun]:
        """Init containers one at a time, in order; then every container at once;
        a finished one again when the restart policy says so, after a backoff."""
        now = time.monotonic()
        for run in self.init_runs:
            if run.exit_code == 0:
                continue
            if run.process is None or (run.exit_code is not None and self._restarts(run, now)):
                return [run]
            return []
        due = []
        for run in self.runs:
            if run.process is None or (run.exit_code is not None and self._restarts(run, now)):
                due.append(run)
        return due

    def _restarts(self, run: runtime.ContainerRun, now: float) -> bool:
        policy = self.restart_policy
        wanted = policy == "Always" or (policy == "OnFailure" and run.exit_code != 0)
        if not wanted:
            return False
        if run.next_start == 0.0:
            run.next_start = now + RESTART_BACKOFF_SECONDS
        if now < run.next_start:
            return False
        run.next_start = 0.0
        return True

    def set_cpu_throttle(self, factor: float) -> None:
        """The node's CPU throttle changed (or not): rescale the running
        containers' CFS quotas; the next to start gets it too."""
        self.cpu_throttle = factor
        if self.stopped:
            return
        for run in self.init_runs + self.runs:
            if run.running and run.cgroup is not None:
                try:
                    run.cgroup.apply_throttle(factor)
                except OSError as error:  # it is just exiting, its cgroup going
                    log.warning("%s/%s: cannot throttle: %s", self.key, run.launch.name, error)

    # ---- status ---------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The pod status as the kubelet would report it."""
        phase = self.phase
        status: dict[str, Any] = {
            "phase": phase,
            "hostIP": self.node.host_ip,
            "hostIPs": [{"ip": self.node.host_ip}],
            "startTime": self.started_at,
            "conditions": self._conditions(phase),
        }
        if self.net is not None:
            status.update(podIP=self.net.ip, podIPs=[{"ip": self.net.ip}])
        if self.failure is not None:
            status.update(reason="CreateContainerConfigError", message=self.failure)
        status["containerStatuses"] = [self._container_status(r) for r in self.runs]
        if self.init_runs:
            status["initContainerStatuses"] = [self._container_status(r) for r in self.init_runs]
        waiting = self._waiting()
        if waiting is not None and not self.runs:
            status["containerStatuses"] = [
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {"waiting": waiting},
                }
                for c in self.pod["spec"].get("containers") or []
            ]
        return status

    def _waiting(self) -> dict[str, str] | None:
        """Why the containers were never made, as the kubelet says it: a volume's
        source missing keeps them ContainerCreating, an env source's is a
        CreateContainerConfigError (both retried); a spec this node cannot run
        is a CreateContainerConfigError for good (the pod failed)."""
        if self.failure is not None:
            return {"reason": "CreateContainerConfigError", "message": self.failure}
        if self.missing is None:
            return None
        return {"reason": self.missing.reason, "message": str(self.missing)}

    def _container_status(self, run: runtime.ContainerRun) -> dict[str, Any]:
        image = next(
            (
                c.get("image", "")
                for c in (self.pod["spec"].get("containers") or [])
                + (self.pod["spec"].get("initContainers") or [])
                if c["name"] == run.launch.name
            ),
            "",
        )
        return {
            "name": run.launch.name,
            "image": image,
            "imageID": "",
            "containerID": f"nodeagent://{self.uid}/{run.launch.name}",
            "ready": run.running,
            "started": run.running,
            "restartCount": run.restart_count,
            "state": run.state(),
        }

    def _conditions(self, phase: str) -> list[dict[str, Any]]:
        now = runtime.now_rfc3339()
        ready = phase == "Running" and all(run.running for run in self.runs)
        terminal = phase in ("Succeeded", "Failed")

        def condition(kind: str, value: bool, reason: str | None = None) -> dict[str, Any]:
            entry = {"type": kind, "status": "True" if value else "False"}
            entry["lastTransitionTime"] = now
            if reason and not value:
                entry["reason"] = reason
            return entry

        not_ready_reason = "PodCompleted" if terminal else "ContainersNotReady"
        return [
            condition("PodReadyToStartContainers", self.net is not None and not terminal),
            condition("Initialized", self.initialized, "ContainersNotInitialized"),
            condition("ContainersReady", ready, not_ready_reason),
            condition("Ready", ready, not_ready_reason),
        ]

    # ---- stop -------------------------------------------------------------------

    def stop(self, grace_seconds: float) -> None:
        """Stops every container (SIGTERM, then SIGKILL after the grace period)."""
        self.stopped = True
        for run in self.init_runs + self.runs:
            runtime.stop_container(run, grace_seconds)
            runtime.poll_container(run)  # its exit, for the last status report

    def die_silently(self) -> None:
        """As when the pod's machine dies: its network goes first (see
        ``network.unplug_pod``), then every process of the pod is SIGKILLed,
        so no peer sees a reset or a FIN. Nothing is reported: the agent no
        longer ticks or reports this pod (its node is silent)."""
        self.stopped = True
        if self.net is None:
            return
        pids = network.netns_pids(self.net.netns)
        network.unplug_pod(self.net.netns)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def teardown(self) -> None:
        """Frees the network, the pod's cgroups and volumes; logs stay for reading."""
        self.node.cgroups.remove_pod(self.uid)
        if self.net is not None:
            network.delete_pod_network(self.net.netns)
            self.node.addresses.release(self.net.ip)
            self.net = None
        runtime.remove_pod_volumes(self.pod_dir)

    def update_pod(self, pod: Mapping[str, Any]) -> None:
        self.pod = pod
