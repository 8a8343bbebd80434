"""The init process of one container: run as PID 1 inside the pod's namespaces.

The node agent starts this file (standard library only, so it runs with no
package on the path) as
``nsenter --net=<pod netns> unshare --mount --uts --pid --fork --mount-proc
--propagation private python podinit.py <launch.json>``. In that private mount
namespace it mounts the pod's volumes over their mount paths and the pod's own
/etc/hosts, /etc/hostname and /etc/nsswitch.conf, sets the hostname, then starts the container's
command. As PID 1 it forwards termination signals to the command (a process
without handlers ignores them as PID 1, as in any container, which is why
runtimes put an init like this in front) and reaps orphans. When it exits, the
kernel kills everything left in the PID namespace, so no process of the pod
can outlive it.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
from typing import Any

MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    result = _libc.mount(
        source.encode(),
        target.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def apply_mount(mount: dict[str, Any]) -> None:
    target = mount["target"]
    if mount["source"] is None:
        options = "mode=1777" + (f",size={mount['tmpfs_size']}" if mount.get("tmpfs_size") else "")
        _mount("tmpfs", target, "tmpfs", 0, options)
    else:
        _mount(mount["source"], target, None, MS_BIND | MS_REC, None)
    if mount.get("read_only"):
        _mount("none", target, None, MS_BIND | MS_REMOUNT | MS_RDONLY, None)


def _open_path(path: str) -> int | None:
    try:
        return os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return None


def held_sources(mounts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``mounts`` with each source opened before anything is mounted, and bound
    from that open file (/proc/self/fd/N, as runc does): a volume over /tmp
    (the trainer's scratch emptyDir) would otherwise hide the sources of every
    mount after it that live under the agent's state dir in /tmp."""
    held = []
    for mount in mounts:
        fd = _open_path(mount["source"]) if mount["source"] is not None else None
        held.append(mount if fd is None else {**mount, "source": f"/proc/self/fd/{fd}"})
    return held


def kept_paths(plan: dict[str, Any]) -> list[str]:
    """Host paths the container's command needs that a volume must not hide:
    what stands in for the image (the agent's image_paths: the Python
    environment, the checkout), the PATH and PYTHONPATH entries, and the
    agent's default working directory. Parents first."""
    env = plan["env"]
    found = [*plan.get("image_paths", ()), plan["working_dir"]]
    for name in ("PATH", "PYTHONPATH"):
        found += [entry for entry in (env.get(name) or "").split(":") if entry]
    return sorted({os.path.abspath(path) for path in found}, key=len)


def keep_visible(held: list[tuple[str, int]]) -> None:
    """After the mounts: each kept path that a volume hid (a volume over /tmp
    when the checkout or the agent's state dir lives there) is bound back at
    its path, over an empty chain of folders made in the volume. A path the
    volume itself holds (a workingDir inside it) stays the volume's."""
    for path, fd in held:
        if os.path.exists(path):
            continue
        os.makedirs(path, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, None)


def run(plan: dict[str, Any]) -> int:
    socket.sethostname(plan["hostname"])
    etc = [
        {"source": plan["etc_files"][name], "target": f"/etc/{name}"}
        for name in ("hosts", "hostname", "nsswitch.conf")
    ]
    # Opened before the mounts, as their sources are (held_sources).
    held = [(path, fd) for path in kept_paths(plan) if (fd := _open_path(path)) is not None]
    for mount in held_sources([*plan["mounts"], *etc]):
        apply_mount(mount)
    keep_visible(held)
    # After the mounts: a workingDir inside a volume is the volume's; the
    # command's children chdir to it by name (multiprocessing's spawn does).
    os.chdir(plan["working_dir"])
    try:
        child = subprocess.Popen(plan["argv"], env=plan["env"])
    except OSError as error:
        print(f"podinit: cannot start {plan['argv'][0]!r}: {error}", file=sys.stderr, flush=True)
        return 127

    def forward(signum: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    return wait_reaping(child.pid)


def wait_reaping(main_pid: int) -> int:
    """Waits for the command, reaping any orphan reparented to us meanwhile."""
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == main_pid:
            # A command killed by a signal reports 128 + signal, as runtimes do.
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code


def main() -> None:
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    sys.exit(run(plan))


if __name__ == "__main__":
    main()
