"""Looking into a running pod from the machine: its processes, for tests and the
demo that kill one rank to show a gang restart."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .network import find_netns


@dataclass(frozen=True)
class PodProcess:
    pid: int
    ppid: int
    cmdline: str


def pod_processes(pod_uid: str) -> list[PodProcess]:
    """Every process in the pod's network namespace, as this machine sees them."""
    netns = find_netns(pod_uid)
    if netns is None:
        return []
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    found = []
    for pid in (int(p) for p in out.stdout.split()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # it exited meanwhile
        found.append(PodProcess(pid, ppid, cmdline.strip()))
    return found


def rank_processes(pod_uid: str) -> list[PodProcess]:
    """The training processes themselves: the leaves of the pod's process tree,
    leaving out the pod's init and Python's helper processes."""
    processes = pod_processes(pod_uid)
    parents = {p.ppid for p in processes}
    return [
        p
        for p in processes
        if p.pid not in parents
        and "podinit.py" not in p.cmdline
        and "resource_tracker" not in p.cmdline
    ]


def kill(process: PodProcess, signal_number: int) -> None:
    os.kill(process.pid, signal_number)
