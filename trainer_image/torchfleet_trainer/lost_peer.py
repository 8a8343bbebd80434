"""A new rendezvous round as soon as a peer's heartbeat stops, not a timeout later.

torch's c10d rendezvous already knows when a node is gone: every agent
heartbeats into the store each ``keep_alive_interval``, and the next agent that
syncs drops one that missed ``keep_alive_max_attempt`` of them from the
round's participants (6 s with launch.py's settings). But torch's agent
restarts its workers only when a node *waits to join* (``num_nodes_waiting``),
never when one is dropped, so after a silent node loss (no heartbeat, no
connection reset) the survivors' workers sit in a collective with the dead
peer until the collective timeout (timeouts.py: at least 120 s), the wait the
issue measured at 122 s.

``install`` makes a dropped participant count like a node waiting: the agent's
monitor loop, which polls ``num_nodes_waiting`` every monitor interval while its
workers are healthy, restarts them into a new round without the dead node (an
elastic job trains on at the smaller size; a fixed gang's round cannot fill,
and the operator restarts the gang once it sees the node lost). That restart
stops the workers with SIGKILL, not SIGTERM: they are stuck inside gloo's or
NCCL's wait, where Python never runs a SIGTERM handler, and a checkpoint save
with a dead peer cannot complete anyway; torch would wait 30 s before killing
them itself.

Both are class-level patches of torch's private rendezvous handler and agent,
in the launcher process only. If a torch release renames what they use,
``install`` says so on stderr and changes nothing: the collective timeout still
bounds the wait.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

# Set on a handler whose round lost a participant; read (and cleared) by the
# agent's next stop of its workers.
_LOST = "_torchfleet_peer_lost"
_ROUND_SIZE = "_torchfleet_round_size"


def _participants(handler: Any) -> int | None:
    """The round's participants as the handler last synced them; None where this
    torch keeps them elsewhere (an instance attribute ``install`` cannot check)."""
    try:
        return len(handler._state_holder.state.participants)
    except (AttributeError, TypeError):
        return None


def _next_rendezvous(original: Any) -> Any:
    def next_rendezvous(self: Any) -> Any:
        info = original(self)
        setattr(self, _ROUND_SIZE, _participants(self))
        setattr(self, _LOST, False)
        return info

    return next_rendezvous


def _num_nodes_waiting(original: Any) -> Any:
    def num_nodes_waiting(self: Any) -> int:
        waiting = int(original(self))  # syncs the state: drops nodes past their heartbeat
        size = getattr(self, _ROUND_SIZE, None)
        left = _participants(self)
        if size is None or left is None or left >= size:
            return waiting
        if not getattr(self, _LOST, False):
            print(
                f"torchfleet-train: a peer's heartbeat stopped ({left} of the "
                f"round's {size} nodes left): starting a new rendezvous round",
                file=sys.stderr,
                flush=True,
            )
            setattr(self, _LOST, True)
        return max(waiting, 1)

    return num_nodes_waiting


def _stop_workers(original: Any) -> Any:
    def stop_workers(self: Any, worker_group: Any, *args: Any, **kwargs: Any) -> None:
        handler = worker_group.spec.rdzv_handler
        if getattr(handler, _LOST, False):
            setattr(handler, _LOST, False)
            self._shutdown(signal.SIGKILL)
            return
        original(self, worker_group, *args, **kwargs)

    return stop_workers


_installed = False


def install() -> bool:
    """Patches torch's c10d rendezvous handler and local agent (once); False when
    this torch lacks what the patches use."""
    global _installed
    if _installed:
        return True
    needed = (
        (DynamicRendezvousHandler, "next_rendezvous"),
        (DynamicRendezvousHandler, "num_nodes_waiting"),
        (LocalElasticAgent, "_stop_workers"),
        (LocalElasticAgent, "_shutdown"),
    )
    missing = [f"{cls.__name__}.{name}" for cls, name in needed if not hasattr(cls, name)]
    if missing:
        print(
            f"torchfleet-train: this torch has no {', '.join(missing)}: a lost peer is "
            "noticed only by the collective timeout",
            file=sys.stderr,
        )
        return False
    handler: Any = DynamicRendezvousHandler
    agent: Any = LocalElasticAgent
    handler.next_rendezvous = _next_rendezvous(handler.next_rendezvous)
    handler.num_nodes_waiting = _num_nodes_waiting(handler.num_nodes_waiting)
    agent._stop_workers = _stop_workers(agent._stop_workers)
    _installed = True
    return True
