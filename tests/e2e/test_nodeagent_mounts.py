"""The node agent's mount points on the machine: one that a pod of another
agent still has a volume mounted on is found, so the agent leaves it in place
when it stops (removing it would detach that pod's volume). Real mount
namespaces; root, as the agent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.fixtures import e2e  # puts dev/ on the path
from tests.fixtures.poll import wait_for

from nodeagent import runtime  # isort: skip


def test_a_mount_point_in_use_in_another_mount_namespace_is_found(tmp_path: Path):
    source, target, unused = tmp_path / "claim", tmp_path / "data dir", tmp_path / "unused"
    for path in (source, target, unused):
        path.mkdir()
    (source / "input.txt").write_text("corpus")
    # A pod's namespace: private, a volume bound over the mount point.
    pod = subprocess.Popen(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f"mount --bind '{source}' '{target}' && echo mounted && sleep 60",
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert pod.stdout is not None and pod.stdout.readline() == "mounted\n"
        paths = {str(target), str(unused)}
        # Not mounted here, so this namespace alone would let it be removed.
        assert not (target / "input.txt").exists()
        assert runtime.mount_points_in_use(paths) == {str(target)}
    finally:
        os.killpg(pod.pid, signal.SIGKILL)  # sh and its sleep: the namespace goes
        pod.wait()
    # Its last process gone, so is the mount: free to remove.
    wait_for("the pod's namespace gone", lambda: not runtime.mount_points_in_use(paths), 10)


UNSHARE = ["unshare", "--mount", "--uts", "--propagation", "private"]


def test_a_volume_over_tmp_hides_no_source_of_the_pods_other_mounts(tmp_path: Path):
    """The trainer's scratch emptyDir is mounted over /tmp, while the agent's
    state dir (every other volume's source, the pod's /etc files, its default
    working directory) lives under /tmp too: podinit opens them all first."""
    scratch, etc, work = tmp_path / "scratch", tmp_path / "etc", tmp_path / "work"
    for path in (scratch, etc, work):
        path.mkdir()
    (scratch / "mark").write_text("scratch")
    for name in ("hosts", "hostname", "nsswitch.conf"):
        (etc / name).write_text(f"pod {name}\n")
    # A child that changes to its parent's directory by name, as multiprocessing's
    # spawn does, finds it.
    probe = (
        "import os; os.chdir(os.getcwd()); print(open('/etc/hostname').read().strip(), "
        "'mark' in os.listdir('/tmp'), sorted(os.listdir('.')))"
    )
    (work / "here").touch()
    plan = {
        "hostname": "pod-0",
        "mounts": [{"target": "/tmp", "source": str(scratch), "read_only": False}],
        "etc_files": {name: str(etc / name) for name in ("hosts", "hostname", "nsswitch.conf")},
        "working_dir": str(work),
        "argv": [sys.executable, "-c", probe],
        "env": {"PATH": os.environ["PATH"]},
        # What the agent passes (runtime.start_container): the checkout and its
        # Python environment, which a clone under /tmp would otherwise lose.
        "image_paths": runtime.IMAGE_PATHS,
    }
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    podinit = Path(e2e.REPO) / "dev/nodeagent/podinit.py"
    out = subprocess.run(
        [*UNSHARE, sys.executable, str(podinit), str(plan_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "pod hostname True ['here']"
