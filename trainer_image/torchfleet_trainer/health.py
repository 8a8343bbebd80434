"""Node health: each rank's compute time apart from waiting on its peers, the gang's
per-node figures and straggler scores, and the gang's node names.

In a synchronous gang every rank's step takes as long as the slowest rank's: the
others wait for it in the collectives. So the step time says nothing about which
node is slow; the time a rank spends computing does. Measured per rank, gathered
by rank 0 with one small collective per log interval, reduced to one figure per
node (its slowest process) and scored against the median node.

How compute is told apart from waiting:

- On CPU (gloo) a rank waiting on its peers sleeps: gloo's waits are condition
  variables, and the training thread runs the forward, backward and optimizer
  itself. The kernel counts, per thread, the time it ran and the time it was
  runnable but waited for a core (``/proc/thread-self/schedstat``); their sum is
  the wall time minus the sleeps. Read at the ends of each run of steps, never
  inside a step. A core shared with another process (or throttled by a CFS quota)
  shows up as run-queue time: the rank wanted to compute and could not, which is
  what a slow node is. Without schedstat (not Linux), the thread's CPU time
  stands in, which misses that share.
- On CUDA the host runs ahead of the device, so the sections are timed on the
  device: events recorded in the compute stream around the forward-backward and
  the optimizer step, read only after the log step has synchronised anyway (no
  host sync of their own). The explicit collectives between them (the mean loss,
  the gradient norm) are outside both sections; the waits the compute stream
  makes inside backward for FSDP's all-gathers and DDP's last bucket are inside.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from torchfleet_contract import pod as contract

TASKS = Path("/proc/self/task")


def busy_seconds_by_thread() -> dict[str, float]:
    """Seconds each thread of this process has run or waited for a core (Linux
    schedstat: on-CPU plus run-queue time); empty where the kernel has no schedstat."""
    busy = {}
    for task in TASKS.glob("*"):
        try:
            on_cpu_ns, run_queue_ns, _slices = (task / "schedstat").read_text().split()
        except (OSError, ValueError):
            continue  # a thread that just exited
        busy[task.name] = (int(on_cpu_ns) + int(run_queue_ns)) / 1e9
    return busy


class ComputeClock:
    """This rank's compute seconds over the steps of each log interval.

    The loop calls ``steps_begin``/``steps_end`` around each run of steps it takes
    without settling, and ``section_begins``/``section_ends`` around the compute
    sections of a step; ``per_step`` answers after the log step has settled."""

    def __init__(self) -> None:
        self.steps = 0

    def steps_begin(self) -> None:
        """Before the first step of a run of steps."""

    def steps_end(self, steps: int) -> None:
        """After the last of ``steps`` steps, before the settling transfer."""
        self.steps += steps

    def section_begins(self) -> None:
        """Before a compute section of a step."""

    def section_ends(self) -> None:
        """After a compute section of a step."""

    def per_step(self) -> float | None:
        """Mean compute seconds per step since the last call; None without steps."""
        if not self.steps:
            return None
        seconds = self._take() / self.steps
        self.steps = 0
        return seconds

    def _take(self) -> float:
        raise NotImplementedError

    @staticmethod
    def for_device(device: torch.device) -> ComputeClock:
        return DeviceComputeClock() if device.type == "cuda" else HostComputeClock()


class HostComputeClock(ComputeClock):
    """The run and run-queue time of this process's threads over the runs of steps."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = 0.0
        self.began: dict[str, float] = {}
        self.began_cpu = 0.0
        self.schedstat = bool(busy_seconds_by_thread())

    def steps_begin(self) -> None:
        if self.schedstat:
            self.began = busy_seconds_by_thread()
        else:
            self.began_cpu = time.process_time()

    def steps_end(self, steps: int) -> None:
        if self.schedstat:
            # Per thread: one that started meanwhile counts from 0, one that ended
            # meanwhile drops out (not its whole life's time subtracted).
            now = busy_seconds_by_thread()
            self.seconds += sum(busy - self.began.get(tid, 0.0) for tid, busy in now.items())
        else:
            self.seconds += time.process_time() - self.began_cpu
        super().steps_end(steps)

    def _take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


class DeviceComputeClock(ComputeClock):
    """CUDA events around each compute section, in the current stream."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        # Events of earlier intervals, read and reused: no allocation per step.
        self.spare: list[torch.cuda.Event] = []
        self.open: torch.cuda.Event | None = None

    def _event(self) -> torch.cuda.Event:
        event = self.spare.pop() if self.spare else torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def section_begins(self) -> None:
        self.open = self._event()

    def section_ends(self) -> None:
        assert self.open is not None, "section_ends without section_begins"
        self.sections.append((self.open, self._event()))
        self.open = None

    def _take(self) -> float:
        # Complete: the settling transfer waited for the stream past them.
        milliseconds = sum(start.elapsed_time(end) for start, end in self.sections)
        self.spare += [event for pair in self.sections for event in pair]
        self.sections = []
        return milliseconds / 1e3


@dataclass(frozen=True)
class GangNode:
    """Where one process of the gang runs."""

    rank: int  # the node's rank in the gang
    name: str


@dataclass(frozen=True)
class NodeFigure:
    """One node's figure (its slowest process's) and its ratio to the median node's."""

    node: GangNode
    value: float
    median_ratio: float


def node_rank_of(pod: contract.PodContract, rank: int, local_world_size: int) -> int:
    """The pod's node rank; an elastic round numbers nodes itself, so there it is
    the launcher's contiguous block of local ranks this rank falls in."""
    return pod.node_rank if pod.elastic is None else rank // max(local_world_size, 1)


def gather_gang_nodes(me: GangNode, world_size: int) -> list[GangNode]:
    """Every process's node, by global rank (one object collective, once per gang)."""
    if world_size == 1:
        return [me]
    nodes: list[GangNode | None] = [None] * world_size
    dist.all_gather_object(nodes, me)
    return [node for node in nodes if node is not None]


def gather_floats(value: float, world_size: int, device: torch.device) -> list[float]:
    """Every rank's ``value``, by global rank: one small all-gather."""
    if world_size == 1:
        return [value]
    local = torch.tensor([value], dtype=torch.float64, device=device)
    gathered = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(gathered, local)
    return torch.cat(gathered).tolist()


def per_node(
    values: list[float], nodes: list[GangNode], slowest_is_highest: bool
) -> list[NodeFigure]:
    """Per-rank values reduced to one per node (the node's slowest process: the
    highest time, or the lowest throughput), each with its ratio to the median
    node's; ordered by node rank."""
    pick = max if slowest_is_highest else min
    by_node: dict[GangNode, float] = {}
    for node, value in zip(nodes, values, strict=True):
        by_node[node] = pick(value, by_node[node]) if node in by_node else value
    median = statistics.median(by_node.values())
    return [
        NodeFigure(node, value, value / median if median > 0 else 1.0)
        for node, value in sorted(by_node.items(), key=lambda item: item[0].rank)
    ]
