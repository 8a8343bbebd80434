"""Resource limits as a kubelet enforces them, on cgroup v1: a container's
``resources.limits.cpu`` as a CFS quota (cpu controller), its
``resources.limits.memory`` as the memory controller's hard limit, whose breach
is a kernel OOM kill, and its CPU time read back from cpuacct.

Every container gets a cgroup of its own in each controller, under a pod
cgroup, under the node, under a subtree of the agent's own cgroup (as a
kubelet's ``kubepods`` slice, but nested where the agent runs, so that its pods
stay inside whatever the machine accounts the agent to)::

    <mount>/<agent's cgroup>/torchfleet-nodeagent-<session>/<node>/pod<uid>/<container>

The container's first process joins these before it executes anything, so its
whole tree (torchrun and every worker it forks) runs inside. The node-level
CPU throttle (the ``torchfleet.dev/cpu-throttle`` Node annotation, see
``THROTTLE_ANNOTATION``) scales every quota on the node.

A controller that is missing or not writable is reported once, clearly, and
left out: the agent still runs pods, without that limit.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .podspec import Limits

log = logging.getLogger("nodeagent.cgroups")

# The Node annotation that slows every pod on that node, standing in for a
# throttled GPU: a factor in (0, 1]. A container with a CPU limit gets that
# fraction of its CFS quota; one without gets that fraction of the machine's
# CPUs (its effective limit when nothing else holds it back). Absent or "1": no
# throttle. The agent applies a change to running pods within a second or so.
THROTTLE_ANNOTATION = "torchfleet.dev/cpu-throttle"

# The kubelet's CFS period and its smallest quota (1 ms per period).
CFS_PERIOD_US = 100_000
MIN_QUOTA_US = 1_000
NO_QUOTA = -1

CPU, CPUACCT, MEMORY = "cpu", "cpuacct", "memory"
CONTROLLERS = (CPU, CPUACCT, MEMORY)

# ---- pure: quotas, the throttle, what /proc says ----------------------------------


def cfs_quota_us(limit_millicpu: int | None, throttle: float, machine_cpus: int) -> int:
    """The CFS quota per CFS_PERIOD_US: the kubelet's (limit x period, at least
    MIN_QUOTA_US; none without a limit), scaled by the node's throttle. An
    unlimited container on a throttled node gets the throttle's share of the
    machine's CPUs."""
    if throttle >= 1.0:
        if limit_millicpu is None:
            return NO_QUOTA
        return max(MIN_QUOTA_US, limit_millicpu * CFS_PERIOD_US // 1000)
    cpus = limit_millicpu / 1000 if limit_millicpu is not None else machine_cpus
    return max(MIN_QUOTA_US, int(cpus * throttle * CFS_PERIOD_US))


def parse_throttle(value: str | None) -> float:
    """The throttle annotation's factor; raises ValueError naming the annotation
    for anything but a number in (0, 1]."""
    if value is None or not value.strip():
        return 1.0
    try:
        factor = float(value)
    except ValueError:
        factor = math.nan
    if not 0.0 < factor <= 1.0:  # also false for NaN
        raise ValueError(
            f"{THROTTLE_ANNOTATION}={value!r}: expected a factor in (0, 1], "
            "e.g. '0.25' for a quarter of the CPU"
        )
    return factor


def find_mounts(mounts: str) -> dict[str, Path]:
    """Each cgroup v1 controller's mount point, from /proc/self/mounts
    (co-mounted controllers, such as cpu,cpuacct, share one)."""
    found: dict[str, Path] = {}
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] != "cgroup":
            continue
        for option in fields[3].split(","):
            if option in CONTROLLERS:
                found.setdefault(option, Path(fields[1]))
    return found


def own_paths(proc_cgroup: str) -> dict[str, str]:
    """Each v1 controller's cgroup of a process, from /proc/<pid>/cgroup."""
    paths: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            if controller in CONTROLLERS:
                paths[controller] = path
    return paths


def process_cgroups(pid: int) -> dict[str, Path]:
    """The cgroup directory a process is in, per controller (for tests and
    tools: where a pod's processes really are)."""
    mounts = find_mounts(Path("/proc/self/mounts").read_text())
    paths = own_paths(Path(f"/proc/{pid}/cgroup").read_text())
    return {c: mounts[c] / paths[c].lstrip("/") for c in paths if c in mounts}


def cpu_usage_seconds(cpuacct_dir: Path) -> float:
    """The CPU time a cgroup's processes used, in seconds (children included)."""
    return int((cpuacct_dir / "cpuacct.usage").read_text()) / 1e9


def oom_kills(memory_dir: Path) -> int:
    """How many processes the kernel's OOM killer ended in this cgroup."""
    for line in (memory_dir / "memory.oom_control").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    # Kernels before 4.13 count no OOM kills: the pod fails with this rather
    # than report an OOM kill as a plain Error.
    raise OSError(errno.ENOTSUP, f"{memory_dir}/memory.oom_control has no oom_kill count")


# ---- the machine ------------------------------------------------------------------


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _remove_tree(directory: Path, wait_seconds: float = 2.0) -> bool:
    """rmdir a cgroup and its children, deepest first; True once it is gone.
    A cgroup whose last processes are still exiting is busy for a moment."""
    if not directory.exists():
        return True
    children = [p for p in directory.iterdir() if p.is_dir()]
    for child in children:
        _remove_tree(child, wait_seconds)
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            directory.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as error:
            if error.errno != errno.EBUSY or time.monotonic() > deadline:
                log.warning("cannot remove cgroup %s: %s", directory, error)
                return False
            time.sleep(0.05)


class CgroupRoot:
    """The agent's subtree in each usable controller."""

    def __init__(self, bases: Mapping[str, Path], unusable: Mapping[str, str]) -> None:
        self.bases = dict(bases)
        self.unusable = dict(unusable)

    @classmethod
    def discover(cls, session: str) -> CgroupRoot:
        """Probes each controller by creating the agent's subtree in it; one that
        cannot be used is logged as an error, with what it costs."""
        mounts = find_mounts(Path("/proc/self/mounts").read_text())
        own = own_paths(Path("/proc/self/cgroup").read_text())
        bases: dict[str, Path] = {}
        unusable: dict[str, str] = {}
        for controller in CONTROLLERS:
            if controller not in mounts or controller not in own:
                unusable[controller] = "no cgroup v1 hierarchy mounted for it"
                continue
            base = mounts[controller] / own[controller].lstrip("/")
            base = base / f"torchfleet-nodeagent-{session}"
            try:
                base.mkdir(parents=True, exist_ok=True)
                # Writable, not just present: a read-only cgroupfs lets mkdir fail
                # or the first write; try the one every container needs.
                (base / "cgroup.procs").read_text()
                _write(base / "notify_on_release", "0")
            except OSError as error:
                unusable[controller] = f"{base} is not writable: {error}"
                continue
            bases[controller] = base
        for controller, why in unusable.items():
            cost = {
                CPU: "resources.limits.cpu and the cpu-throttle annotation are NOT enforced",
                CPUACCT: "pods' CPU usage cannot be read",
                MEMORY: "resources.limits.memory is NOT enforced (no OOMKilled)",
            }[controller]
            log.error("cgroup v1 %s controller unusable (%s): %s", controller, why, cost)
        return cls(bases, unusable)

    def node(self, node_name: str) -> NodeCgroups:
        return NodeCgroups({c: base / node_name for c, base in self.bases.items()})

    def remove_all(self) -> None:
        for base in self.bases.values():
            _remove_tree(base)


@dataclass(frozen=True)
class NodeCgroups:
    """One node's part of the agent's subtree."""

    dirs: Mapping[str, Path]

    def container(self, pod_uid: str, container: str, limits: Limits) -> ContainerCgroup:
        paths = {c: d / f"pod{pod_uid}" / container for c, d in self.dirs.items()}
        return ContainerCgroup(paths, limits)

    def remove_pod(self, pod_uid: str) -> None:
        for directory in self.dirs.values():
            _remove_tree(directory / f"pod{pod_uid}")

    def remove_stale(self) -> None:
        """Pod cgroups an earlier agent left (its processes died with it)."""
        for directory in self.dirs.values():
            _remove_tree(directory)

    def unenforced(self, limits: Limits) -> list[str]:
        """The limits a container asks for that this node cannot enforce."""
        missing = []
        if limits.millicpu is not None and CPU not in self.dirs:
            missing.append("limits.cpu")
        if limits.memory_bytes is not None and MEMORY not in self.dirs:
            missing.append("limits.memory")
        return missing


class ContainerCgroup:
    """One container's cgroups: created with its limits before the container
    starts, joined by its first process, read back when it exits."""

    def __init__(self, paths: Mapping[str, Path], limits: Limits) -> None:
        self.paths = dict(paths)
        self.limits = limits
        self.quota_us: int | None = None  # what cpu.cfs_quota_us holds now
        self.oom_kills_before = 0

    def prepare(self, throttle: float) -> None:
        """Creates the cgroups (again, for a restart) with the limits, and notes
        the OOM kill count so that this run's own kills can be told apart."""
        for path in self.paths.values():
            path.mkdir(parents=True, exist_ok=True)
        self.quota_us = None
        self.apply_throttle(throttle)
        memory = self.paths.get(MEMORY)
        if memory is not None:
            limit = self.limits.memory_bytes
            if limit is not None:
                _write(memory / "memory.limit_in_bytes", str(limit))
                # No swapping past it either: a breach is an OOM kill, as on a
                # kubelet (which runs without swap). memsw exists only with swap
                # accounting, and must not be below the limit.
                memsw = memory / "memory.memsw.limit_in_bytes"
                if memsw.exists():
                    _write(memsw, str(limit))
            self.oom_kills_before = oom_kills(memory)

    def apply_throttle(self, throttle: float) -> None:
        """Sets the CFS quota for the node's current throttle (a write only when
        it changes)."""
        cpu = self.paths.get(CPU)
        if cpu is None:
            return
        quota = cfs_quota_us(self.limits.millicpu, throttle, machine_cpus())
        if quota == self.quota_us:
            return
        _write(cpu / "cpu.cfs_period_us", str(CFS_PERIOD_US))
        _write(cpu / "cpu.cfs_quota_us", str(quota))
        self.quota_us = quota

    def joiner(self) -> Callable[[], None]:
        """What the container's first process runs before it executes anything
        (a preexec_fn: raw os calls only, nothing that takes a lock)."""
        procs = [str(path / "cgroup.procs") for path in dict.fromkeys(self.paths.values())]

        def join() -> None:
            pid = str(os.getpid()).encode()
            for name in procs:
                fd = os.open(name, os.O_WRONLY)
                try:
                    os.write(fd, pid)
                finally:
                    os.close(fd)

        return join

    def oom_killed(self) -> bool:
        """Whether the kernel OOM-killed a process of this container since it
        was last started (as containerd's OOM event: any process of the tree)."""
        memory = self.paths.get(MEMORY)
        if memory is None:
            return False
        with contextlib.suppress(OSError):
            return oom_kills(memory) > self.oom_kills_before
        return False


def machine_cpus() -> int:
    """The CPUs this agent may run on: an unlimited pod's effective limit."""
    return len(os.sched_getaffinity(0))
