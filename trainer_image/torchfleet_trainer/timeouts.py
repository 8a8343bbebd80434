"""Collective timeouts: a silent peer fails its gang within seconds, not gloo's 30 minutes.

A rank waits in a collective for its slowest peer. A peer whose machine went
silent (no connection reset: the network went first) never arrives, and with
torch's default process-group timeout (30 minutes for gloo; NCCL's watchdog
uses the same value) the whole gang sits there. Here every process group gets
a timeout in two stages, as TorchTitan does (comm.init_timeout_seconds, then
comm.train_timeout_seconds after the first step):

* generous (``TORCHFLEET_COLLECTIVE_INIT_TIMEOUT_SECONDS``, 600 s) while ranks
  may legitimately wait long on each other: process-group set-up, the
  checkpoint load, preflight, the first steps (compilation, warm-up) and every
  checkpoint save (rank 0's write can keep its peers waiting at the next
  collective);
* tight once the steps are steady: 20 x the slowest rank's step time, at least
  ``TORCHFLEET_COLLECTIVE_TRAIN_TIMEOUT_SECONDS`` (120 s).

Ranks agree before tightening (an all-reduce of their step times, which is
also a barrier: a fast rank must not wait under the short timeout on a slow
one still finishing work allowed under the long one), and again after a save
before going back to the tight value.

gloo raises the timeout in the waiting rank as a RuntimeError ("Timed out
waiting ...ms"); launcher/in_process.py turns that into exit code 202. NCCL enforces the
same per-group value in its watchdog thread, and with
``TORCH_NCCL_ASYNC_ERROR_HANDLING`` at 1 (what torch's elastic agent gives its
workers unless set) or torch's default 3, the watchdog takes the process down
(SIGABRT: the pod sees 134, also >= 128 and retryable);
``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`` (torch's default 480 s) bounds a watchdog
that is itself stuck.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from torchfleet_contract.pod import RecoverySettings

# The tight timeout's multiple of a steady step: a step of the slowest rank
# that took this many times its usual time is a hang, not a slow step.
STEP_TIME_FACTOR = 20.0

# What gloo and NCCL (blocking wait) say when a collective timed out or its
# peer went away; a rank that sees one has lost its gang, not failed itself.
_PEER_FAILURE_MARKERS = (
    "timed out",
    "timeout",
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
)


def is_peer_failure(err: BaseException) -> bool:
    """Whether ``err`` is a collective that timed out or lost its peer."""
    if isinstance(err, dist.DistError):
        return True
    return isinstance(err, RuntimeError) and any(
        marker in str(err).lower() for marker in _PEER_FAILURE_MARKERS
    )


def tight_timeout(floor_seconds: float, step_seconds: float) -> float:
    """The timeout once steps are steady: the floor, or longer for slow steps."""
    return max(floor_seconds, STEP_TIME_FACTOR * step_seconds)


# torch 2.15 named it; older versions (pyproject allows 2.9) have only the private one.
_set_timeout = getattr(dist, "set_timeout", None) or distributed_c10d._set_pg_timeout


def _set(seconds: float, groups: list[Any]) -> None:
    for group in groups:
        _set_timeout(timedelta(seconds=seconds), group)


class CollectiveTimeouts:
    """The process groups' timeout of one training process, generous or tight."""

    def __init__(self, settings: RecoverySettings, device: torch.device) -> None:
        self.settings = settings
        self.device = device
        self.tight: float | None = None  # None until the steps are steady
        self.excluded: list[Any] = []

    @property
    def current(self) -> float:
        return self.tight if self.tight is not None else self.settings.collective_init_timeout

    def _groups(self) -> list[Any]:
        # Every group there is: the world, the mesh's dimensions and the views
        # it flattens. Groups made with new_group do not inherit the world's
        # timeout (they get torch's 30 minutes), so all of them are set.
        return [g for g in distributed_c10d._world.pg_map if g not in self.excluded]

    def exclude(self, group: Any) -> None:
        """Keeps ``group`` at the generous timeout: an async checkpoint's group
        waits on rank 0's writes in the background, a save at a time."""
        _set(self.settings.collective_init_timeout, [group])
        self.excluded.append(group)

    def start_generous(self) -> None:
        """Every group at the generous timeout (set-up, first steps)."""
        _set(self.settings.collective_init_timeout, self._groups())

    def tighten(self, step_seconds: float) -> float:
        """After the first steps: agree on the slowest rank's step time (a barrier
        too) and set the tight timeout; the seconds set."""
        slowest = torch.tensor([step_seconds], dtype=torch.float64, device=self.device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        self.tight = tight_timeout(self.settings.collective_train_timeout, float(slowest.item()))
        _set(self.tight, self._groups())
        return self.tight

    @contextmanager
    def generous(self) -> Iterator[None]:
        """The generous timeout for the block (a checkpoint save); tight again
        after, once every rank is past it."""
        if self.tight is None:
            yield
            return
        groups = self._groups()
        _set(self.settings.collective_init_timeout, groups)
        yield
        dist.barrier()
        _set(self.tight, groups)
