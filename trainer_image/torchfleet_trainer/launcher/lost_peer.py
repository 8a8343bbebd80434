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

A third patch keeps a membership change from being counted as a failure. When
a node joins (or another's agent restarts its workers), the agents whose
workers are still healthy restart them on purpose, and those workers' peers
elsewhere then exit too: they save and exit 143 with the world-wide stop, or
fail with 202 on the closed connection. An agent that sees that exit before it
sees the node waiting would spend one of ``max_restarts`` on it, and the gang
would report an in-place restart nobody's program caused. In an elastic job
(minNodes < maxNodes) an agent whose workers all ended with one of those codes
while the membership is changing (a node waiting, a participant dropped, or the
rendezvous already at a later round) restarts them as torch does for a node
joining, without counting. A fixed gang is the other way round: only a failure
starts a new round there, so every agent must count it, also one that sees the
node waiting before its own workers see the failure (torch counts that one
not); otherwise the pods' budgets part, and the agent that kept a restart
spends it rejoining a rendezvous the others have left.

Last, an agent that finds the rendezvous store gone (its host's launcher has
exited) while its own workers still look healthy looks for their exit for a
few seconds before it gives up with the store's error: a worker's death
reaches the agent only once the forkserver has reaped it, and on a loaded
machine the others can exit first, so a pod whose worker was killed would
report a lost peer instead (CI, 2026-11-27).

All are class-level patches of torch's private rendezvous handler and agent,
in the launcher process only. If a torch release renames what they use,
``install`` says so on stderr and changes nothing: the collective timeout still
bounds the wait.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterable
from typing import Any

from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.rendezvous.api import RendezvousError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

# Set on a handler whose round lost a participant; read (and cleared) by the
# agent's next stop of its workers.
_LOST = "_torchfleet_peer_lost"
_ROUND_SIZE = "_torchfleet_round_size"
_ROUND = "_torchfleet_round"
# How long an agent that finds the rendezvous store gone looks for its own
# workers' exit before it blames the store: a SIGKILLed worker's exit reaches
# it within a monitor interval or two, even on a loaded machine.
OWN_EXIT_GRACE_SECONDS = 5.0


def _participants(handler: Any) -> int | None:
    """The round's participants as the handler last synced them; None where this
    torch keeps them elsewhere (an instance attribute ``install`` cannot check)."""
    try:
        return len(handler._state_holder.state.participants)
    except (AttributeError, TypeError):
        return None


def _round(handler: Any) -> int | None:
    try:
        return int(handler._state_holder.state.round)
    except (AttributeError, TypeError, ValueError):
        return None


def _is_elastic(handler: Any) -> bool:
    try:
        return int(handler.settings.min_nodes) < int(handler.settings.max_nodes)
    except (AttributeError, TypeError, ValueError):
        return False


def stopped_by_peers(exit_codes: Iterable[int], fallout_codes: frozenset[int]) -> bool:
    """Whether workers that ended with ``exit_codes`` may have been stopped by
    their peers rather than failed: every one ended with a code a peer's stop
    causes (a saved stop, a lost peer). Only a membership change says they were."""
    codes = list(exit_codes)
    return bool(codes) and all(code in fallout_codes for code in codes)


def _membership_changes(handler: Any) -> bool:
    """Whether the membership changes within a heartbeat expiry (plus the state
    cache's second), asked of the patched num_nodes_waiting: a node waiting, a
    participant dropped, or a later round this node must join. The wait is
    needed: a peer's stop reaches these workers at once, while the handler
    reads the shared state at most once a second and drops a silent node only
    once its heartbeats have expired (an e2e run counted a lost node so)."""
    deadline = time.monotonic() + _expiry_seconds(handler) + 1.0
    while handler.num_nodes_waiting() == 0:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
    return True


def _expiry_seconds(handler: Any) -> float:
    try:
        settings = handler.settings
        return float(settings.keep_alive_interval.total_seconds() * settings.keep_alive_max_attempt)
    except (AttributeError, TypeError, ValueError):
        return 6.0  # launch.py's own settings: 3 heartbeats of 2 s


def _count_a_peers_round(agent: Any) -> None:
    """In a fixed gang, spends one of this agent's restarts on a round another
    agent started (a node waiting, a participant dropped): nothing but a
    failure starts one there. torch would restart uncounted, and an agent
    whose worker had not yet seen its peer fail would keep a restart the others
    spent; its next failure then rejoins a rendezvous the others have left and
    reports a lost peer instead of its own exit (CI, 2026-11-27)."""
    left = getattr(agent, "_remaining_restarts", None)
    if not isinstance(left, int) or left <= 0:
        # Spent: no agent rejoins after a failure, so a node waiting now is a
        # silent one dropped, and the round waits for the operator's gang
        # restart, uncounted as torch has it. (Not an int: a torch that keeps
        # the count elsewhere, which counts as it always did.)
        return
    agent._remaining_restarts -= 1
    print(
        "torchfleet-train: a peer's workers failed first: counted as this pod's "
        f"in-place restart ({agent._remaining_restarts} left)",
        file=sys.stderr,
        flush=True,
    )


def _own_failure_first(original: Any, agent: Any, worker_group: Any, error: Exception) -> Any:
    """The rendezvous store is gone while this pod's workers looked healthy: the
    gang is broken. If they had in fact failed first (a worker's exit reaches
    the agent a moment after it happens, once the forkserver has reaped it),
    that failure is this pod's outcome; else the store's ``error`` stands (the
    launcher exits 202, a lost peer)."""
    print(
        f"torchfleet-train: the rendezvous store is gone ({error}): looking for "
        f"this pod's own workers' exit for {OWN_EXIT_GRACE_SECONDS:g}s first",
        file=sys.stderr,
        flush=True,
    )
    deadline = time.monotonic() + OWN_EXIT_GRACE_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.1)
        result = original(agent, worker_group)
        if result.state != WorkerState.HEALTHY:
            return result
    raise error


def _monitor_workers(original: Any, fallout_codes: frozenset[int]) -> Any:
    def monitor_workers(self: Any, worker_group: Any) -> Any:
        result = original(self, worker_group)
        handler = worker_group.spec.rdzv_handler
        if result.state == WorkerState.HEALTHY:
            # torch asks this next, for a node waiting; asked here first (its
            # answer is cached for torch's own question) to judge the answer.
            try:
                waiting = handler.num_nodes_waiting()
            except RendezvousError as error:
                return _own_failure_first(original, self, worker_group, error)
            if waiting and not _is_elastic(handler):
                _count_a_peers_round(self)  # torch restarts from HEALTHY uncounted
            return result
        if result.state != WorkerState.FAILED or not _is_elastic(handler):
            return result
        codes = [failure.exitcode for failure in result.failures.values()]
        if not stopped_by_peers(codes, fallout_codes) or not _membership_changes(handler):
            return result
        print(
            f"torchfleet-train: workers stopped by a membership change (exit codes "
            f"{sorted(set(codes))}): a new rendezvous round, not counted as a restart",
            file=sys.stderr,
            flush=True,
        )
        # Healthy is the state torch restarts from without counting, once it sees
        # the node waiting (the next num_nodes_waiting says so again).
        return RunResult(state=WorkerState.HEALTHY)

    return monitor_workers


def _next_rendezvous(original: Any) -> Any:
    def next_rendezvous(self: Any) -> Any:
        info = original(self)
        setattr(self, _ROUND_SIZE, _participants(self))
        setattr(self, _ROUND, _round(self))
        setattr(self, _LOST, False)
        return info

    return next_rendezvous


def _num_nodes_waiting(original: Any) -> Any:
    def num_nodes_waiting(self: Any) -> int:
        waiting = int(original(self))  # syncs the state: drops nodes past their heartbeat
        joined = getattr(self, _ROUND, None)
        if joined is not None and _round(self) != joined:
            # Every participant of this node's round left it (this one dropped
            # for a missed heartbeat): the others train in a later round.
            return max(waiting, 1)
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


def install(fallout_codes: Iterable[int]) -> bool:
    """Patches torch's c10d rendezvous handler and local agent (once); False when
    this torch lacks what the patches use. ``fallout_codes``: the exit codes of a
    worker stopped because a peer stopped (stopped_by_peers)."""
    global _installed
    if _installed:
        return True
    needed = (
        (DynamicRendezvousHandler, "next_rendezvous"),
        (DynamicRendezvousHandler, "num_nodes_waiting"),
        (LocalElasticAgent, "_stop_workers"),
        (LocalElasticAgent, "_shutdown"),
        (LocalElasticAgent, "_monitor_workers"),
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
    agent._monitor_workers = _monitor_workers(agent._monitor_workers, frozenset(fallout_codes))
    _installed = True
    return True
