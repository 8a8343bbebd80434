"""The node agent enforces resource limits as a kubelet does, with cgroups:
a memory limit breached is a real kernel OOM kill reported as OOMKilled, a CPU
limit is a CFS quota the pod's whole process tree runs under, the node's
cpu-throttle annotation slows running pods, and a pod's cgroups go with it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_nodeagent import python_pod, terminated, wait_phase
from tests.fixtures.e2e import E2E_NODES, LOCAL_NODE_LABEL, throttled_node
from tests.fixtures.e2e import apply_objects as apply
from tests.fixtures.poll import wait_for

from nodeagent import cgroups, podspec, procs  # isort: skip

# ---- the pure parts ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("millicpu", "throttle", "expected"),
    [
        (None, 1.0, cgroups.NO_QUOTA),  # no limit, no quota: the kubelet's default
        (200, 1.0, 20_000),  # 200m = 20 ms per 100 ms period
        (1500, 1.0, 150_000),
        (5, 1.0, cgroups.MIN_QUOTA_US),  # the kubelet's 1 ms floor
        (200, 0.25, 5_000),
        (1000, 0.1, 10_000),
        (None, 0.25, 50_000),  # unlimited on 2 CPUs: a quarter of the machine
        (10, 0.01, cgroups.MIN_QUOTA_US),
    ],
)
def test_cfs_quota_from_limit_and_throttle(millicpu, throttle, expected):
    assert cgroups.cfs_quota_us(millicpu, throttle, machine_cpus=2) == expected


@pytest.mark.parametrize(
    ("value", "factor"), [(None, 1.0), ("", 1.0), ("1", 1.0), ("0.25", 0.25), (" .5 ", 0.5)]
)
def test_throttle_annotation_values(value, factor):
    assert cgroups.parse_throttle(value) == factor


@pytest.mark.parametrize("value", ["0", "-0.5", "1.5", "fast", "nan", "25%"])
def test_a_bad_throttle_annotation_is_refused_naming_it(value):
    with pytest.raises(ValueError, match=r"torchfleet.dev/cpu-throttle=.*factor in \(0, 1\]"):
        cgroups.parse_throttle(value)


def test_container_limits_from_quantities():
    container = {"name": "c", "resources": {"limits": {"cpu": "200m", "memory": "64Mi"}}}
    assert podspec.container_limits(container) == podspec.Limits(200, 64 * 2**20)
    whole = {"name": "c", "resources": {"limits": {"cpu": 2, "memory": "1G"}}}
    assert podspec.container_limits(whole) == podspec.Limits(2000, 10**9)
    assert podspec.container_limits({"name": "c", "resources": {"limits": {"cpu": "0.5"}}}) == (
        podspec.Limits(500, None)
    )
    assert podspec.container_limits({"name": "c"}) == podspec.Limits()
    with pytest.raises(podspec.PodSpecError, match=r"containers\[c\].resources.limits.cpu"):
        podspec.container_limits({"name": "c", "resources": {"limits": {"cpu": "lots"}}})


def test_controller_mounts_and_own_cgroups_are_read_from_proc():
    mounts = (
        "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0\n"
        "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
        "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n"
    )
    assert cgroups.find_mounts(mounts) == {
        "cpu": Path("/sys/fs/cgroup/cpu,cpuacct"),
        "cpuacct": Path("/sys/fs/cgroup/cpu,cpuacct"),
        "memory": Path("/sys/fs/cgroup/memory"),
    }
    own = "4:memory:/jobs/a\n2:cpu,cpuacct:/\n0::/\n"
    assert cgroups.own_paths(own) == {"memory": "/jobs/a", "cpu": "/", "cpuacct": "/"}


# ---- memory -------------------------------------------------------------------------

ALLOCATE = """
    import sys
    blocks = [bytearray(b"x" * 2**20) for _ in range(int(sys.argv[1]))]  # touched pages
    print("allocated", len(blocks), "MiB", flush=True)
"""


def memory_pod(name: str, limit: str, allocate_mib: int) -> dict[str, Any]:
    container = {"args": [str(allocate_mib)], "resources": {"limits": {"memory": limit}}}
    return python_pod(name, ALLOCATE, container=container)


# As torchrun with a worker the kernel killed: the main process survives and
# exits 1.
CHILD_ALLOCATES = """
    import subprocess, sys
    allocate = "blocks = [bytearray(b'x' * 2**20) for _ in range(%s)]" % sys.argv[1]
    worker = subprocess.run([sys.executable, "-c", allocate])
    print("worker exited", worker.returncode, flush=True)
    sys.exit(1)
"""


@pytest.mark.e2e
@pytest.mark.cluster
def test_a_pod_past_its_memory_limit_is_oom_killed(cluster, namespace, node_agent):
    limit = {"resources": {"limits": {"memory": "64Mi"}}}
    suicide = python_pod(
        "sigkilled", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", container=limit
    )
    launcher = python_pod("launcher", CHILD_ALLOCATES, container={**limit, "args": ["256"]})
    apply(
        cluster,
        namespace,
        memory_pod("hog", "64Mi", allocate_mib=256),
        memory_pod("fits", "128Mi", allocate_mib=16),
        suicide,
        launcher,
    )
    hog = wait_phase(cluster, namespace, "hog", {"Succeeded", "Failed"})
    fits = wait_phase(cluster, namespace, "fits", {"Succeeded", "Failed"})
    sigkilled = wait_phase(cluster, namespace, "sigkilled", {"Succeeded", "Failed"})
    launched = wait_phase(cluster, namespace, "launcher", {"Succeeded", "Failed"})

    assert hog["status"]["phase"] == "Failed"
    assert terminated(hog)["exitCode"] == 137
    assert terminated(hog)["reason"] == "OOMKilled"
    assert "allocated" not in node_agent.logs(namespace, "hog", "main")[0]
    assert fits["status"]["phase"] == "Succeeded", node_agent.logs(namespace, "fits", "main")
    assert terminated(fits)["reason"] == "Completed"
    # A SIGKILL that was no OOM kill is an Error with the same exit code: the
    # reason comes from the cgroup's OOM count, not from the 137.
    assert terminated(sigkilled)["exitCode"] == 137
    assert terminated(sigkilled)["reason"] == "Error"
    # An OOM kill of a process the main one started names the reason too, as
    # containerd reports it; the exit code stays the main process's own.
    assert node_agent.logs(namespace, "launcher", "main") == ["worker exited -9\n"]
    assert terminated(launched)["exitCode"] == 1
    assert terminated(launched)["reason"] == "OOMKilled"


# ---- CPU ------------------------------------------------------------------------------

# The main process forks busy children, as torchrun forks its workers: the
# quota holds for the whole tree.
SPIN = """
    import os, sys
    children = int(sys.argv[1])
    for _ in range(children):
        if os.fork() == 0:
            while True:
                pass
    print("spinning", children, flush=True)
    os.wait()
"""
WINDOW_SECONDS = 2.0
THROTTLE = 0.1


def spinning_pod(name: str, node: str, children: int, cpu_limit: str | None) -> dict[str, Any]:
    container: dict[str, Any] = {"args": [str(children)]}
    if cpu_limit:
        container["resources"] = {"limits": {"cpu": cpu_limit}}
    pod = python_pod(name, SPIN, container=container, terminationGracePeriodSeconds=1)
    pod["spec"]["nodeSelector"] = {**pod["spec"]["nodeSelector"], "kubernetes.io/hostname": node}
    return pod


def container_cgroups(cluster: Any, namespace: str, name: str, children: int) -> dict[str, Path]:
    """The cgroups the pod's busy processes are in, once all of them run; the
    children must share their parent's."""
    uid = wait_phase(cluster, namespace, name, {"Running"})["metadata"]["uid"]

    def spinners() -> list[procs.PodProcess]:
        spin = [p for p in procs.pod_processes(uid) if "os.fork" in p.cmdline]
        return spin if len(spin) == children + 1 else []

    processes = wait_for(f"{name}'s {children + 1} processes", spinners, timeout=30)
    found = {frozenset(cgroups.process_cgroups(p.pid).items()) for p in processes}
    assert len(found) == 1, f"{name}'s processes are in different cgroups: {found}"
    return dict(next(iter(found)))


def cpu_rates(cpuacct_dirs: dict[str, Path]) -> dict[str, float]:
    """CPUs used by each cgroup over one measuring window."""
    before = {name: cgroups.cpu_usage_seconds(d) for name, d in cpuacct_dirs.items()}
    started = time.monotonic()
    time.sleep(WINDOW_SECONDS)  # the measuring window itself, not a wait for an event
    elapsed = time.monotonic() - started
    return {
        name: (cgroups.cpu_usage_seconds(d) - before[name]) / elapsed
        for name, d in cpuacct_dirs.items()
    }


def quota(cgroup: dict[str, Path]) -> int:
    return int((cgroup["cpu"] / "cpu.cfs_quota_us").read_text())


@pytest.mark.e2e
@pytest.mark.cluster
def test_cpu_limits_and_the_node_throttle_hold_a_pods_whole_tree(cluster, namespace, node_agent):
    node = E2E_NODES[0]
    labels = cluster.get_json("node", node)["metadata"]["labels"]
    assert labels[LOCAL_NODE_LABEL]  # the session's agent node
    apply(
        cluster,
        namespace,
        spinning_pod("limited", node, children=2, cpu_limit="200m"),
        spinning_pod("free", node, children=1, cpu_limit=None),
    )
    limited = container_cgroups(cluster, namespace, "limited", children=2)
    free = container_cgroups(cluster, namespace, "free", children=1)
    assert limited["cpu"] != free["cpu"]

    rates = cpu_rates({"limited": limited["cpuacct"], "free": free["cpuacct"]})
    # Two busy processes would take both CPUs; 200m holds them to 0.2 CPU: the
    # upper bound catches no quota (the quota file's 20_000 below, a unit slip).
    # CFS quota is a ceiling, not a share: beside make test's other sessions
    # the pair got 0.085, so the floor only catches a quota ten times too low.
    assert 0.04 < rates["limited"] < 0.25, rates
    # Unlimited: no quota, and its busy process ran. (Not "more than the limited
    # pair": beside make test's other sessions both pods' equal shares held
    # each below the pair's 0.2 ceiling, 0.126 against 0.134.)
    assert quota(free) == cgroups.NO_QUOTA
    assert rates["free"] > 0.04, rates
    free_cap = THROTTLE * cgroups.machine_cpus()

    with throttled_node(cluster, node, THROTTLE):
        wait_for(
            "the agent to apply the throttle",
            lambda: quota(limited) == 2_000 and quota(free) == int(free_cap * 100_000),
            timeout=5,
        )
        throttled = cpu_rates({"limited": limited["cpuacct"], "free": free["cpuacct"]})
    wait_for("the throttle lifted", lambda: quota(limited) == 20_000, timeout=5)

    # The limited pod runs at a tenth of its limit; the unlimited one at a
    # tenth of the machine's CPUs.
    assert 0.005 < throttled["limited"] < 0.025, (rates, throttled)
    assert throttled["free"] < free_cap * 1.1, (rates, throttled)
    assert quota(free) == cgroups.NO_QUOTA

    containers = [*limited.values(), *free.values()]
    cluster.kubectl("delete", "pod", "limited", "free", "-n", namespace, "--wait=true")
    # The agent removes a pod's cgroups before it removes the pod object.
    left = [str(d) for d in {*containers, *(d.parent for d in containers)} if d.exists()]
    assert not left, f"cgroups left after the pods were deleted: {left}"
