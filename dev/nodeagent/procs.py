"""Looking into a running pod from the machine: its processes, for tests and the
demo that kill one rank to show a gang restart."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .network import find_netns, netns_pids


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
    found = []
    for pid in netns_pids(netns):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # it exited meanwhile
        found.append(PodProcess(pid, ppid, cmdline.strip()))
    return found


# Processes that serve a training process rather than train: the pod's init,
# Python's multiprocessing resource tracker, torchfleet-train's log copier.
HELPERS = ("podinit.py", "resource_tracker", "torchfleet_trainer.launcher.logtee")


def rank_processes(pod_uid: str) -> list[PodProcess]:
    """The training processes themselves: the leaves of the pod's process tree
    once the helpers are left out (a rank whose only child is its log copier is
    still a leaf)."""
    processes = [p for p in pod_processes(pod_uid) if not any(h in p.cmdline for h in HELPERS)]
    parents = {p.ppid for p in processes}
    return [p for p in processes if p.pid not in parents]


def kill(process: PodProcess, signal_number: int) -> None:
    os.kill(process.pid, signal_number)
