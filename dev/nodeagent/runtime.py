"""Runs one pod's containers as local processes and describes their state.

A pod here is: a network namespace (network.py), a directory under the
agent's state dir holding its /etc/hosts, emptyDir volumes, a default working
directory and its log files, and one process tree per container started by
podinit.py in private mount/UTS/PID namespaces.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .cgroups import ContainerCgroup
from .podspec import ContainerLaunch, Mount

log = logging.getLogger("nodeagent.runtime")

PODINIT = Path(__file__).with_name("podinit.py")
# This machine's files that stand in for a container image's: the Python
# environment and the checkout (its packages, dev/ and tests/). A volume over
# /tmp must not hide them when the checkout lives there (podinit.py).
IMAGE_PATHS = sorted({sys.prefix, str(Path(__file__).resolve().parents[2])})
PR_SET_PDEATHSIG = 1
MESSAGE_LIMIT = 4096  # the kubelet's cap on a termination message, in bytes


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _die_with_parent() -> None:
    # If the agent is killed outright, its pods' processes go with it (the
    # signal reaches unshare, whose --kill-child passes it on to the PID
    # namespace's init, and the kernel then ends the whole namespace).
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _before_exec(run: ContainerRun) -> Callable[[], None]:
    """What the container's first process does before it executes nsenter: join
    the container's cgroups (so every process it forks is inside them, limits
    included) and die with the agent."""
    join = run.cgroup.joiner() if run.cgroup is not None else None

    def prepare() -> None:
        if join is not None:
            join()
        _die_with_parent()

    return prepare


@dataclass
class ContainerRun:
    """One container's current (or last) process."""

    launch: ContainerLaunch
    log_path: Path
    plan_path: Path
    process: subprocess.Popen[bytes] | None = None
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None
    restart_count: int = 0
    next_start: float = 0.0
    # The container's termination message file (terminationMessagePath).
    message_path: Path | None = None
    # Where its limits are enforced; None on a node without usable cgroups.
    cgroup: ContainerCgroup | None = None
    # The kernel OOM-killed a process of this run (read from its memory cgroup).
    oom_killed: bool = False

    @property
    def running(self) -> bool:
        return self.process is not None and self.exit_code is None

    def state(self) -> dict[str, Any]:
        if self.exit_code is not None:
            reason = "Completed" if self.exit_code == 0 else "Error"
            if self.oom_killed:
                # As containerd reports it: an OOM kill in the container's cgroup
                # names the reason whatever the exit code (a torchrun whose
                # worker was killed exits 1, its pod still reads OOMKilled).
                reason = "OOMKilled"
            terminated = {
                "exitCode": self.exit_code,
                "reason": reason,
                "startedAt": self.started_at,
                "finishedAt": self.finished_at,
            }
            message = self.termination_message()
            if message:
                terminated["message"] = message
            return {"terminated": terminated}
        if self.process is not None:
            return {"running": {"startedAt": self.started_at}}
        return {"waiting": {"reason": "ContainerCreating"}}

    def termination_message(self) -> str:
        """What the container wrote to its termination message file, capped as
        the kubelet caps it (4 KiB). Not reproduced: FallbackToLogsOnError's
        log tail for a failed container that wrote nothing."""
        if self.message_path is None:
            return ""
        try:
            with open(self.message_path, "rb") as message:
                return message.read(MESSAGE_LIMIT).decode(errors="replace")
        except OSError:
            return ""


@dataclass
class PodSandbox:
    """Where a pod lives on this machine."""

    pod_dir: Path
    netns_path: str
    hostname: str
    ip: str
    created_mountpoints: list[str] = field(default_factory=list)

    @property
    def hosts_file(self) -> Path:
        return self.pod_dir / "hosts"

    def write_hosts(self, content: str) -> None:
        """Rewrites the file in place: a bind mount pins the inode, so a
        rename would leave the pod reading the old file."""
        with open(self.hosts_file, "a+") as f:
            f.seek(0)
            if f.read() == content:
                return
            f.seek(0)
            f.truncate()
            f.write(content)


def files_only_nsswitch(host_config: str) -> str:
    """The machine's nsswitch.conf with host names looked up in files only.

    The pod's /etc/hosts plays cluster DNS. The machine's DNS server is not
    reachable from the pod network, so a name missing from the file (such as
    the reverse lookups torch.distributed makes of every peer) would wait out
    the resolver's timeouts, ten seconds each, instead of failing at once.
    """
    lines = [
        "hosts:          files" if line.startswith("hosts:") else line
        for line in host_config.splitlines()
    ]
    if not any(line.startswith("hosts:") for line in lines):
        lines.append("hosts:          files")
    return "\n".join(lines) + "\n"


def prepare_mountpoint(mount: Mount) -> bool:
    """Makes sure the mount target exists on the machine; True if it was
    created here (the agent removes such empty directories when it stops)."""
    target = Path(mount.target)
    if target.exists():
        return False
    if mount.source is not None and Path(mount.source).is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
    else:
        target.mkdir(parents=True)
    return True


def mount_points_in_use(paths: set[str]) -> set[str]:
    """Those of ``paths`` that something is mounted on in some mount namespace
    of this machine (every process's, read from /proc). Removing such a path
    here would detach that mount in the other namespace (the kernel does, since
    3.18): a pod of another agent on this machine, which made the same mount
    point, would see its volume vanish mid-run."""
    namespaces: set[str] = set()
    found: set[str] = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            namespace = os.readlink(proc / "ns" / "mnt")
            if namespace in namespaces:
                continue
            mountinfo = (proc / "mountinfo").read_text()
        except OSError:
            continue  # gone meanwhile, or a kernel thread
        namespaces.add(namespace)
        for line in mountinfo.splitlines():
            fields = line.split()
            target = _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[4])
            if target in paths:
                found.add(target)
    return found


# mountinfo writes a space, tab, newline or backslash in a path as \ooo.
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def start_container(sandbox: PodSandbox, run: ContainerRun, cpu_throttle: float = 1.0) -> None:
    """Starts the container's init (podinit.py) in the pod's namespaces, in its
    cgroups (limits set, the node's CPU throttle applied)."""
    if run.cgroup is not None:
        run.cgroup.prepare(cpu_throttle)
    plan = asdict(run.launch)
    plan.update(
        image_paths=IMAGE_PATHS,
        hostname=sandbox.hostname,
        etc_files={
            "hosts": str(sandbox.hosts_file),
            "hostname": str(sandbox.pod_dir / "hostname"),
            "nsswitch.conf": str(sandbox.pod_dir / "nsswitch.conf"),
        },
    )
    run.plan_path.write_text(json.dumps(plan))
    if run.message_path is not None:  # each run starts with no message (as a new container)
        run.message_path.write_bytes(b"")
    argv = [
        "nsenter",
        f"--net={sandbox.netns_path}",
        "unshare",
        "--mount",
        "--uts",
        "--pid",
        "--fork",
        "--mount-proc",
        "--kill-child",
        "--propagation",
        "private",
        sys.executable,
        str(PODINIT),
        str(run.plan_path),
    ]
    with open(run.log_path, "ab") as log_file:
        if run.restart_count:
            log_file.write(f"--- restart {run.restart_count} at {now_rfc3339()}\n".encode())
            log_file.flush()
        run.process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_before_exec(run),
        )
    run.started_at = now_rfc3339()
    run.finished_at = None
    run.exit_code = None
    run.oom_killed = False


def poll_container(run: ContainerRun) -> bool:
    """Records the exit of a finished container; True if it just finished."""
    if not run.running:
        return False
    assert run.process is not None
    code = run.process.poll()
    if code is None:
        return False
    run.exit_code = 128 - code if code < 0 else code
    run.finished_at = now_rfc3339()
    run.oom_killed = run.cgroup is not None and run.cgroup.oom_killed()
    return True


def _namespace_init_pid(launcher_pid: int) -> int | None:
    """podinit's PID as seen from here: the one child of ``unshare --fork``."""
    try:
        children = Path(f"/proc/{launcher_pid}/task/{launcher_pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def stop_container(run: ContainerRun, grace_seconds: float) -> None:
    """SIGTERM to the container's command, SIGKILL to its whole PID namespace
    once the grace period is over."""
    if not run.running:
        return
    assert run.process is not None
    init_pid = _namespace_init_pid(run.process.pid)
    _signal(init_pid, signal.SIGTERM)
    deadline = time.monotonic() + max(grace_seconds, 0)
    while run.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if run.process.poll() is None:
        log.info("container %s outlived its grace period: killing", run.launch.name)
        _signal(init_pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.process.pid, signal.SIGKILL)
        run.process.wait()
    poll_container(run)


def _signal(pid: int | None, signum: int) -> None:
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def remove_pod_volumes(pod_dir: Path) -> None:
    """emptyDir and ConfigMap copies go with the pod; logs stay for reading."""
    shutil.rmtree(pod_dir / "volumes", ignore_errors=True)


def write_files(root: Path, files: Mapping[str, str]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
