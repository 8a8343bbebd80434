"""The node agent's mount points on the machine: one that a pod of another
agent still has a volume mounted on is found, so the agent leaves it in place
when it stops (removing it would detach that pod's volume). Real mount
namespaces; root, as the agent."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.fixtures import e2e  # noqa: F401  (puts dev/ on the path)
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
