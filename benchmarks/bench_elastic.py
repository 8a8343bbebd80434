"""Elastic training benchmark: how long a lost worker stops training, elastic
against a gang restart against an in-place restart, on this machine's e2e harness.

The harness is the e2e tier's own: the local cluster, the node agent running
pods as real processes, the real operator. The job is the elastic e2e test's
1 + 2 Shakespeare job (one process per pod, global batch 12) logging every
step. It trains at world size 3 to its first checkpoint; then worker-1 fails,
and the seconds are read from the trainer's own JSON log events ("world",
"metrics", "resumed", "step") against the wall clock of the kill; where the
seconds went, from the torch elastic agent's own log lines (LOGLEVEL=INFO) and
the node agent's pod start stamps. Two kills, by what they stand for:

* a lost node (the elastic scenarios): every process of worker-1 but the pod's
  init is SIGKILLed, as a lost node's are (test_elastic.py's kill).
* a crashed rank (gang and in-place): only worker-1's training process is
  SIGKILLed, the same process in both, found as the leaf of the pod's process
  tree once its helpers are left out (nodeagent's ``procs.rank_processes``, as
  test_training.py's kill finds it: by the tree, not by a command line, so a
  worker forked from a forkserver is found too). It is first held (SIGSTOP,
  test_training.py's ``held``: its peers wait in their next all-reduce) until
  the operator's status shows a step of the running gang, for the operator
  cannot date a failure before its first scrape; the kill's clock starts at the
  SIGKILL. Without an in-place budget a gang of one process per pod runs its
  trainer without an agent, so there the training process is the container's
  main process and its death ends the container; with one, it is the agent's
  worker and the pod's launcher stays. (Before the in-place scenario the gang
  scenario used the lost-node kill: its 2026-11-23 figures in RESULTS.md are
  for that kill, which ends the container the same way.)

Scenarios, run in turn ``--repeats`` times each:

* ``elastic``: the replacement worker is held by its init container's gate
  (the e2e test's) until the survivors have stepped at world size 2. Figures:
  loss -> first step at world size 2; gate released (the replacement pod
  already started by the node agent, its init container polling the gate) ->
  first step at world size 3 again.
* ``gang``: the same job without ``spec.elastic``: the operator restarts the
  whole gang. Figure: kill -> first step of the new gang, and the checkpoint
  step it resumed from (the steps trained again).
* ``in-place``: the gang job with ``spec.runPolicy.inPlaceRestarts: 1``: every
  pod's launcher restarts its worker and the gang meets again in a new
  rendezvous round, no pod recreated (checked: the same pod uids). Figure:
  kill -> first step of the next round, and the step it resumed from; the
  ratio to the gang restart's figure (issue 33's target: <= 0.5) is printed
  and written into the JSON.
* ``elastic-free``: elastic, no gate: the replacement comes back at once.
  Figure: loss -> first step at world size 3 again (and at 2, if the survivors
  stepped before the replacement joined).

Each job's namespace is deleted once its figures are seen (and waited for, so
that its processes do not load the next run). JSON goes to benchmarks/results/.

    python benchmarks/bench_elastic.py --repeats 2
    python benchmarks/bench_elastic.py --repeats 3 --scenarios gang,in-place
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.test_elastic import (  # noqa: E402
    NAME,
    PODS,
    VICTIM,
    all_events,
    elastic_shakespeare,
    gate,
    kill_container,
    steps_at_world,
)
from tests.e2e.test_node_health import pod_uids  # noqa: E402
from tests.e2e.test_training import corpus_namespace, get_job, held, pod_uid  # noqa: E402
from tests.fixtures.cluster import Cluster, running_cluster  # noqa: E402
from tests.fixtures.e2e import (  # noqa: E402
    NodeAgent,
    apply_objects,
    e2e_prerequisites,
    running_e2e_operator,
    running_node_agent,
)
from tests.fixtures.operator import JobDriver, apply_crd  # noqa: E402

from nodeagent import procs  # noqa: E402  # isort: skip  (dev/ is put on the path by the fixtures)

MASTER = f"{NAME}-master-0"
FULL, SHRUNK = 3, 2
# Bounds on each wait, not targets: ranks start slowly when the two cores are busy.
FIRST_CHECKPOINT_TIMEOUT = 420.0
RECOVERY_TIMEOUT = 300.0
# How long the crashed rank is held for the operator to show a step of the gang
# (it scrapes every 2 s here), and for it to count the in-place restart after.
SCRAPE_TIMEOUT = 60.0
COUNTED_TIMEOUT = 120.0
# In-place restarts allowed to the in-place scenario's gang: one kill needs one.
IN_PLACE_BUDGET = 1
# issue 33's target: an in-place restart takes at most half a gang restart's seconds.
IN_PLACE_TARGET_RATIO = 0.5
# A line of torch's elastic agent: I1123 21:49:24.178000 2 path.py:1002] message
AGENT_LINE = re.compile(r"^[IWE](?P<day>\d{4}) (?P<time>[\d:.]+) \d+ [^\]]+\] (?P<message>.*)$")
# What an elastic pod's torch agent logs: its workers failed (the lost rank's
# connections broke), it enters a rendezvous round, the round is complete, it
# starts its worker processes. (A fixed gang of one process per pod runs its
# trainer without an agent: the operator gives each pod its rank.)
WORKERS_FAILED = "failed (exitcode"
RENDEZVOUS = "Rendezvous'ing worker group"
ROUND_COMPLETE = "Rendezvous complete for workers"
STARTING = "Starting worker group"
# An agent of a fixed gang with an in-place budget: its worker failed (the
# killed one, or a peer that lost it), and it restarts its workers in a new round.
WILL_RESTART = "will restart worker group"


def bench_job(elastic: bool, in_place_restarts: int = 0) -> dict[str, Any]:
    """The e2e test's job, logging every step (the test logs every second one)
    so that a first step is seen when it is taken; without ``spec.elastic``
    for the gang restart (runPolicy: OnFailure, the example's), with
    ``in_place_restarts`` for the in-place one."""
    job = elastic_shakespeare()
    job["spec"]["trainer"]["training"]["logInterval"] = 1
    for role in ("master", "worker"):
        for container in job["spec"][role]["template"]["spec"]["containers"]:
            # torch's elastic agent then logs its rendezvous rounds (read below).
            container.setdefault("env", []).append({"name": "LOGLEVEL", "value": "INFO"})
    if not elastic:
        del job["spec"]["elastic"]
        # Explicit also for the gang scenario: unset, a fixed gang restarts in place.
        job["spec"]["runPolicy"]["inPlaceRestarts"] = in_place_restarts
    return job


class Run:
    """One job in its namespace: its trainer events, read from the node agent's logs."""

    def __init__(self, cluster: Cluster, agent: NodeAgent, namespace: str, wait_for: Any) -> None:
        self.cluster, self.agent, self.namespace = cluster, agent, namespace
        self.wait_for: Callable[..., Any] = wait_for

    def logged(self, kind: str, after: float = 0.0) -> list[dict[str, Any]]:
        return [e for e in all_events(self.agent, self.namespace, kind) if e["time"] > after]

    def steps_at(self, size: int, after: float) -> list[dict[str, Any]]:
        """Steps of the runs that started at world ``size`` after ``after``."""
        return steps_at_world(size, self.logged("world", after) + self.logged("step", after))

    def first(self, kind: str, after: float, **fields: Any) -> dict[str, Any] | None:
        return next(
            (e for e in self.logged(kind, after) if fields.items() <= e.items()),
            None,
        )

    def wait_first_checkpoint_at_full_size(self) -> dict[str, Any]:
        """The first checkpoint saved by a run at world size 3 (the latest world)."""

        def saved() -> dict[str, Any] | None:
            worlds = self.logged("world")
            if not worlds or worlds[-1]["world_size"] != FULL:
                return None
            return self.first("checkpoint", worlds[-1]["time"])

        return dict(self.wait_for("a checkpoint at world size 3", saved, FIRST_CHECKPOINT_TIMEOUT))

    def lose_the_worker(self) -> tuple[float, int]:
        """SIGKILLs worker-1's processes; the kill's wall clock and the last step logged."""
        uid = pod_uid(self.cluster, self.namespace, VICTIM)
        last_step = max(e["step"] for e in self.logged("step"))
        lost_at = time.time()
        kill_container(uid)
        return lost_at, int(last_step)

    def crash_the_rank(self) -> tuple[float, int]:
        """SIGKILLs worker-1's training process alone (a crashed rank: the pod
        and, under an in-place budget, its launcher stay), held first until
        the operator has seen a step of this gang; the kill's wall clock and
        the last step logged."""
        uid = pod_uid(self.cluster, self.namespace, VICTIM)
        ranks = procs.rank_processes(uid)
        assert len(ranks) == 1, f"expected 1 training process in {VICTIM}: {ranks}"
        with held(ranks):
            self.wait_for(
                "a step of the running gang in status",
                lambda: (self.status().get("progress") or {}).get("step"),
                SCRAPE_TIMEOUT,
            )
            last_step = max(e["step"] for e in self.logged("step"))
            crashed_at = time.time()
            procs.kill(ranks[0], signal.SIGKILL)
        return crashed_at, int(last_step)

    def agent_started(self, pod: str, after: float) -> float | None:
        """When the node agent started the pod's first run after ``after`` (its
        own ns stamp). By time, not by index: a worker may have been replaced
        before the loss too (one that failed to reach the store at start)."""
        runs = self.agent.pod_dirs(self.namespace, pod)
        starts = (int((run / "started").read_text()) / 1e9 for run in runs)
        return next((start for start in starts if start > after), None)

    def gang_started(self, after: float) -> float | None:
        """When the node agent had started a run after ``after`` of every pod."""
        started = [self.agent_started(pod, after) for pod in PODS]
        return None if None in started else max(s for s in started if s is not None)

    def resumed_and_world(self, size: int, after: float) -> dict[str, Any]:
        """The run at world ``size`` after ``after``: when it logged its world,
        which checkpoint it resumed and how long the load took."""
        world = self.first("world", after, world_size=size)
        assert world is not None, f"no world event at size {size}"
        resumed = self.first("resumed", world["time"] - 1e-3)
        return {
            "world_event_s": world["time"],
            "resumed_step": resumed["step"] if resumed else None,
            "checkpoint_load_s": resumed["load_seconds"] if resumed else None,
            "resumed_event_s": resumed["time"] if resumed else None,
        }

    def agent_logged(self, pod: str, text: str, after: float) -> float | None:
        """When the pod's torch elastic agent first logged a line containing
        ``text`` after ``after`` (its lines carry local time, to the microsecond)."""
        year = time.localtime(after).tm_year
        for log in self.agent.logs(self.namespace, pod, "trainer"):
            for line in log.splitlines():
                found = AGENT_LINE.match(line)
                if not found or text not in found["message"]:
                    continue
                stamp = f"{year}{found['day']} {found['time']}"
                moment = datetime.strptime(stamp, "%Y%m%d %H:%M:%S.%f").timestamp()
                if moment > after:
                    return moment
        return None

    def agent_stages(self, pod: str, origin: float, **markers: str) -> dict[str, float | None]:
        """Seconds from ``origin`` to the first line of each marker in the pod's
        agent log after ``origin`` (None: not logged)."""
        return {
            f"{name}_s": since(self.agent_logged(pod, text, origin), origin)
            for name, text in markers.items()
        }

    def status(self) -> dict[str, Any]:
        return dict(get_job(self.cluster, self.namespace, NAME).get("status") or {})


def since(moment: float | None, origin: float) -> float | None:
    """Seconds from ``origin`` to ``moment`` (None: not seen)."""
    return None if moment is None else moment - origin


def lose_after_first_checkpoint(run: Run, hold_replacement: bool) -> tuple[float, dict[str, Any]]:
    """Trains to the first checkpoint at full size, then loses worker-1 (its
    replacement held at the gate if asked); the kill's time and first figures."""
    checkpoint = run.wait_first_checkpoint_at_full_size()
    if hold_replacement:
        gate(run.agent, run.namespace).unlink()
    lost_at, last_step = run.lose_the_worker()
    return lost_at, first_figures(checkpoint, last_step)


def crash_after_first_checkpoint(run: Run) -> tuple[float, dict[str, Any], dict[str, str]]:
    """Trains to the first checkpoint at full size, then crashes worker-1's
    rank (gang and in-place: the same kill); the kill's time, first figures
    and the pods' uids at the kill."""
    checkpoint = run.wait_first_checkpoint_at_full_size()
    uids = pod_uids(run.cluster, run.namespace)
    crashed_at, last_step = run.crash_the_rank()
    return crashed_at, first_figures(checkpoint, last_step), uids


def pods_recreated(run: Run, uids: dict[str, str]) -> int:
    """How many of the pods of ``uids`` are gone or another pod now."""
    now = pod_uids(run.cluster, run.namespace)
    return sum(now.get(name) != uid for name, uid in uids.items())


def first_figures(checkpoint: dict[str, Any], last_step: int) -> dict[str, Any]:
    return {
        "checkpoint_step": checkpoint["step"],
        "last_step_before_loss": last_step,
        "load_at_loss": os.getloadavg()[0],
    }


def steps_between(last_step: int, resumed_step: int | None) -> int | None:
    """Steps trained again: those after the checkpoint resumed, up to the loss."""
    return None if resumed_step is None else last_step - resumed_step


def elastic_gated_run(run: Run) -> dict[str, Any]:
    lost_at, figures = lose_after_first_checkpoint(run, hold_replacement=True)
    shrunk = run.wait_for(
        "steps at world size 2", lambda: run.steps_at(SHRUNK, lost_at), RECOVERY_TIMEOUT
    )
    # Released only once the agent runs the replacement (its init container
    # polling the gate): from there on, the time is the rejoin's alone.
    replacement_started = run.wait_for(
        "the replacement pod started by the agent",
        lambda: run.agent_started(VICTIM, lost_at),
        RECOVERY_TIMEOUT,
    )
    released_at = time.time()
    gate(run.agent, run.namespace).touch()
    regrown = run.wait_for(
        "steps at world size 3 again",
        lambda: run.steps_at(FULL, shrunk[0]["time"]),
        RECOVERY_TIMEOUT,
    )
    at_two = run.resumed_and_world(SHRUNK, lost_at)
    at_three = run.resumed_and_world(FULL, shrunk[0]["time"])
    figures.update(
        loss_to_step_at_2_s=shrunk[0]["time"] - lost_at,
        loss_to_world_2_s=at_two["world_event_s"] - lost_at,
        resumed_step_at_2=at_two["resumed_step"],
        steps_redone_at_2=steps_between(figures["last_step_before_loss"], at_two["resumed_step"]),
        checkpoint_load_at_2_s=at_two["checkpoint_load_s"],
        replacement_started_after_loss_s=replacement_started - lost_at,
        release_to_step_at_3_s=regrown[0]["time"] - released_at,
        release_to_world_3_s=at_three["world_event_s"] - released_at,
        resumed_step_at_3=at_three["resumed_step"],
        checkpoint_load_at_3_s=at_three["checkpoint_load_s"],
        steps_at_2_before_regrown=regrown[0]["step"] - shrunk[0]["step"],
        # The survivors' agents stop their workers for the new round; what they
        # had trained since their last save is trained again at 3.
        steps_redone_at_3=steps_between(
            max(e["step"] for e in run.steps_at(SHRUNK, lost_at)), at_three["resumed_step"]
        ),
    )
    # Where the seconds went, from the master's agent (a survivor) after the
    # loss and after the release, and from the replacement's agent joining
    # (its process up) after the release.
    shrinking = run.agent_stages(
        MASTER,
        lost_at,
        survivors_failed=WORKERS_FAILED,
        round_at_2=ROUND_COMPLETE,
        workers_start_at_2=STARTING,
    )
    regrowing = run.agent_stages(
        MASTER,
        released_at,
        survivors_rendezvous=RENDEZVOUS,
        round_at_3=ROUND_COMPLETE,
        workers_start_at_3=STARTING,
    )
    replacement = run.agent_stages(VICTIM, released_at, replacement_rendezvous=RENDEZVOUS)
    figures.update({f"loss_to_{k}": v for k, v in shrinking.items()})
    figures.update({f"release_to_{k}": v for k, v in {**regrowing, **replacement}.items()})
    return {**figures, **elastic_status(run)}


def elastic_free_run(run: Run) -> dict[str, Any]:
    lost_at, figures = lose_after_first_checkpoint(run, hold_replacement=False)
    regrown = run.wait_for(
        "steps at world size 3 again", lambda: run.steps_at(FULL, lost_at), RECOVERY_TIMEOUT
    )
    shrunk = run.steps_at(SHRUNK, lost_at)
    at_three = run.resumed_and_world(FULL, lost_at)
    figures.update(
        loss_to_step_at_3_s=regrown[0]["time"] - lost_at,
        loss_to_step_at_2_s=(shrunk[0]["time"] - lost_at) if shrunk else None,
        loss_to_world_3_s=at_three["world_event_s"] - lost_at,
        resumed_step_at_3=at_three["resumed_step"],
        checkpoint_load_at_3_s=at_three["checkpoint_load_s"],
        replacement_started_after_loss_s=since(run.agent_started(VICTIM, lost_at), lost_at),
    )
    stages = run.agent_stages(
        MASTER, lost_at, survivors_failed=WORKERS_FAILED, first_round=ROUND_COMPLETE
    )
    figures.update({f"loss_to_{k}": v for k, v in stages.items()})
    return {**figures, **elastic_status(run)}


def elastic_status(run: Run) -> dict[str, Any]:
    """The job's restarts and replacements as its status shows them now."""
    status = run.status()
    return {
        "restart_count": status.get("restartCount"),
        "replacements": (status.get("elastic") or {}).get("replacements"),
    }


def back_at_full_size(run: Run, lost_at: float, last_step: int) -> dict[str, Any]:
    """The first step at world size 3 after the kill (the restarted gang's, or
    the next in-place round's) and the milestones of the run that took it."""
    restarted = run.wait_for(
        "steps at world 3 after the kill", lambda: run.steps_at(FULL, lost_at), RECOVERY_TIMEOUT
    )
    again = run.resumed_and_world(FULL, lost_at)
    # Logged by rank 0 once it serves /metrics, right after the resume.
    served = run.first("metrics", lost_at)
    return {
        "loss_to_step_s": restarted[0]["time"] - lost_at,
        "loss_to_metrics_s": since(served["time"] if served else None, lost_at),
        "loss_to_world_s": again["world_event_s"] - lost_at,
        "loss_to_resumed_s": since(again["resumed_event_s"], lost_at),
        "resumed_step": again["resumed_step"],
        "checkpoint_load_s": again["checkpoint_load_s"],
        "steps_redone": steps_between(last_step, again["resumed_step"]),
    }


def gang_run(run: Run) -> dict[str, Any]:
    lost_at, figures, uids = crash_after_first_checkpoint(run)
    figures.update(back_at_full_size(run, lost_at, figures["last_step_before_loss"]))
    return {
        **figures,
        "loss_to_new_master_started_s": since(run.agent_started(MASTER, lost_at), lost_at),
        "loss_to_new_gang_started_s": since(run.gang_started(lost_at), lost_at),
        "pods_recreated": pods_recreated(run, uids),
        "restart_count": run.status().get("restartCount"),
    }


def in_place_run(run: Run) -> dict[str, Any]:
    lost_at, figures, uids = crash_after_first_checkpoint(run)
    figures.update(back_at_full_size(run, lost_at, figures["last_step_before_loss"]))
    # An in-place restart or nothing: the same pods, none new.
    recreated = pods_recreated(run, uids)
    assert recreated == 0, f"{recreated} pod(s) recreated: not an in-place restart"
    # Logged by rank 0 once every rank of the round has joined the process
    # group and agreed on the restart count (an all-reduce): the ranks met.
    met = run.first("in_place_restart", lost_at)
    figures["loss_to_process_group_s"] = since(met["time"] if met else None, lost_at)
    # Where the seconds went: the killed rank's agent, and the master's (a
    # peer: its worker fails when the killed one's connections reset).
    victim = run.agent_stages(VICTIM, lost_at, victim_agent_restarts=WILL_RESTART)
    peer = run.agent_stages(
        MASTER,
        lost_at,
        peer_agent_restarts=WILL_RESTART,
        round_complete=ROUND_COMPLETE,
        workers_start=STARTING,
    )
    figures.update({f"loss_to_{k}": v for k, v in {**victim, **peer}.items()})
    # The operator's count, from the master's /metrics (bounded: a figure,
    # not a condition of the run's timing).
    counted = poll(
        lambda: (run.status().get("inPlaceRestarts") or {}).get("total"), COUNTED_TIMEOUT
    )
    status = run.status()
    return {
        **figures,
        "pods_recreated": recreated,
        "in_place_counted_s": since(counted, lost_at),
        "in_place_restarts": (status.get("inPlaceRestarts") or {}).get("total"),
        "restart_count": status.get("restartCount"),
    }


def poll(check: Callable[[], Any], timeout: float, interval: float = 0.5) -> float | None:
    """When ``check`` first returned something truthy (None: not within ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return time.time()
        time.sleep(interval)
    return None


SCENARIO_RUNS: dict[str, Callable[[Run], dict[str, Any]]] = {
    "elastic": elastic_gated_run,
    "gang": gang_run,
    "in-place": in_place_run,
    "elastic-free": elastic_free_run,
}
SCENARIO_JOBS: dict[str, Callable[[], dict[str, Any]]] = {
    "elastic": lambda: bench_job(elastic=True),
    "gang": lambda: bench_job(elastic=False),
    "in-place": lambda: bench_job(elastic=False, in_place_restarts=IN_PLACE_BUDGET),
    "elastic-free": lambda: bench_job(elastic=True),
}
SCENARIOS = tuple(SCENARIO_RUNS)


def one_run(
    scenario: str, cluster: Cluster, agent: NodeAgent, operator: Any, driver: JobDriver
) -> dict[str, Any]:
    load_start = os.getloadavg()
    started = time.monotonic()
    with corpus_namespace(cluster, agent, operator, "e2e-bench-elastic") as namespace:
        run = Run(cluster, agent, namespace, driver.wait_for)
        gate(agent, namespace).touch()
        apply_objects(cluster, namespace, SCENARIO_JOBS[scenario]())
        figures = SCENARIO_RUNS[scenario](run)
        figures["load_average_end"] = list(os.getloadavg())
    # The next run starts once this one's processes are gone.
    cluster.kubectl("wait", "--for=delete", f"namespace/{namespace}", "--timeout=300s", check=False)
    figures["load_average_start"] = list(load_start)
    figures["run_seconds"] = time.monotonic() - started
    return {
        key: round(value, 3) if isinstance(value, float) else value
        for key, value in figures.items()
    }


# The figures each scenario is reported by (label, key), the first the headline.
HEADLINES: dict[str, list[tuple[str, str]]] = {
    "elastic": [
        ("loss -> first step at world 2 (s)", "loss_to_step_at_2_s"),
        ("  loss -> survivors' workers failed (s)", "loss_to_survivors_failed_s"),
        ("  loss -> rendezvous round at 2 complete (s)", "loss_to_round_at_2_s"),
        ("  loss -> survivors start workers (s)", "loss_to_workers_start_at_2_s"),
        ("  loss -> world-2 event (s)", "loss_to_world_2_s"),
        ("  checkpoint load at world 2 (s)", "checkpoint_load_at_2_s"),
        ("  loss -> replacement pod started (s)", "replacement_started_after_loss_s"),
        ("gate released -> first step at world 3 (s)", "release_to_step_at_3_s"),
        ("  released -> replacement's agent rendezvous (s)", "release_to_replacement_rendezvous_s"),
        ("  released -> survivors rendezvous (s)", "release_to_survivors_rendezvous_s"),
        ("  released -> rendezvous round at 3 complete (s)", "release_to_round_at_3_s"),
        ("  released -> workers start (s)", "release_to_workers_start_at_3_s"),
        ("  released -> world-3 event (s)", "release_to_world_3_s"),
        ("  checkpoint load at world 3 (s)", "checkpoint_load_at_3_s"),
        ("steps trained again at 2", "steps_redone_at_2"),
        ("steps trained again at 3", "steps_redone_at_3"),
    ],
    "gang": [
        ("kill -> first step of the new gang (s)", "loss_to_step_s"),
        ("  kill -> new master pod started (s)", "loss_to_new_master_started_s"),
        ("  kill -> all new pods started (s)", "loss_to_new_gang_started_s"),
        ("  kill -> new gang's world event (s)", "loss_to_world_s"),
        ("  kill -> checkpoint resumed (s)", "loss_to_resumed_s"),
        ("  checkpoint load (s)", "checkpoint_load_s"),
        ("  kill -> /metrics served (s)", "loss_to_metrics_s"),
        ("steps trained again", "steps_redone"),
        ("pods recreated", "pods_recreated"),
    ],
    "in-place": [
        ("kill -> first step of the next round (s)", "loss_to_step_s"),
        ("  kill -> killed rank's agent restarts (s)", "loss_to_victim_agent_restarts_s"),
        ("  kill -> master's agent restarts (s)", "loss_to_peer_agent_restarts_s"),
        ("  kill -> rendezvous round complete (s)", "loss_to_round_complete_s"),
        ("  kill -> master's workers started (s)", "loss_to_workers_start_s"),
        ("  kill -> process group up, ranks met (s)", "loss_to_process_group_s"),
        ("  kill -> next round's world event (s)", "loss_to_world_s"),
        ("  kill -> checkpoint resumed (s)", "loss_to_resumed_s"),
        ("  checkpoint load (s)", "checkpoint_load_s"),
        ("  kill -> /metrics served (s)", "loss_to_metrics_s"),
        ("  kill -> counted in status.inPlaceRestarts (s)", "in_place_counted_s"),
        ("steps trained again", "steps_redone"),
        ("pods recreated", "pods_recreated"),
    ],
    "elastic-free": [
        ("loss -> first step at world 3 (s)", "loss_to_step_at_3_s"),
        ("  loss -> first step at world 2 (s)", "loss_to_step_at_2_s"),
        ("  loss -> survivors' workers failed (s)", "loss_to_survivors_failed_s"),
        ("  loss -> replacement pod started (s)", "replacement_started_after_loss_s"),
        ("  loss -> first rendezvous round complete (s)", "loss_to_first_round_s"),
        ("  loss -> world-3 event (s)", "loss_to_world_3_s"),
    ],
}


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    keys = {k for run in runs for k, v in run.items() if isinstance(v, int | float)}
    found = {k: [run[k] for run in runs if isinstance(run.get(k), int | float)] for k in keys}
    return {k: round(statistics.median(v), 3) for k, v in sorted(found.items()) if v}


def machine() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = next(
        (ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if "model name" in ln), ""
    )
    meminfo = Path("/proc/meminfo").read_text().split()
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(int(meminfo[meminfo.index("MemTotal:") + 1]) / 2**20, 1),
        "gpu": "none (gloo on CPU)",
        "python": platform.python_version(),
        "torch": metadata.version("torch"),
        "kernel": platform.release(),
        "commit": commit,
    }


def print_table(results: dict[str, Any]) -> None:
    for scenario, runs in results["runs"].items():
        print(f"\n{scenario}: {len(runs)} run(s)")
        header = "".join(f"{'run ' + str(i + 1):>10}" for i in range(len(runs)))
        print(f"{'':50}{header}{'median':>10}")
        for label, key in HEADLINES[scenario]:
            values = [run.get(key) for run in runs]
            cells = "".join(f"{v:10.2f}" if v is not None else f"{'-':>10}" for v in values)
            median = results["medians"][scenario].get(key)
            print(
                f"{label:50}{cells}" + (f"{median:10.2f}" if median is not None else f"{'-':>10}")
            )
        loads = ", ".join(
            f"{run['load_average_start'][0]:.1f}/{run['load_at_loss']:.1f}/"
            f"{run['load_average_end'][0]:.1f}"
            for run in runs
        )
        print(f"{'load average 1m (start/loss/end)':50}{loads}")
        keys = ("resumed_step", "resumed_step_at_2", "resumed_step_at_3")
        resumed = ", ".join(str(next((run[k] for k in keys if k in run), "-")) for run in runs)
        print(f"{'resumed from checkpoint step':50}{resumed}")


# What the gang restart and the in-place round share, compared side by side.
SIDE_BY_SIDE = [
    ("kill -> first step (s)", "loss_to_step_s"),
    ("kill -> world event (s)", "loss_to_world_s"),
    ("kill -> checkpoint resumed (s)", "loss_to_resumed_s"),
    ("checkpoint load (s)", "checkpoint_load_s"),
    ("kill -> /metrics served (s)", "loss_to_metrics_s"),
    ("steps trained again", "steps_redone"),
    ("pods recreated", "pods_recreated"),
]


def in_place_against_gang(results: dict[str, Any]) -> dict[str, Any] | None:
    """in-place / gang seconds from the kill to the first step: of the medians,
    and of each repeat's pair (run one after the other, under about one load)."""
    gang, in_place = results["runs"].get("gang"), results["runs"].get("in-place")
    if not gang or not in_place:
        return None
    key = "loss_to_step_s"
    ratio = results["medians"]["in-place"][key] / results["medians"]["gang"][key]
    return {
        "in_place_over_gang": round(ratio, 3),
        "per_repeat": [round(i[key] / g[key], 3) for g, i in zip(gang, in_place, strict=False)],
        "target": IN_PLACE_TARGET_RATIO,
        "target_met": ratio <= IN_PLACE_TARGET_RATIO,
    }


def print_side_by_side(results: dict[str, Any]) -> None:
    compared = results.get("in_place_against_gang")
    if not compared:
        return
    gang, in_place = results["medians"]["gang"], results["medians"]["in-place"]
    print(f"\nin-place against gang (medians){'':19}{'gang':>10}{'in-place':>10}{'ratio':>10}")
    for label, key in SIDE_BY_SIDE:
        g, i = gang.get(key), in_place.get(key)
        cells = "".join(f"{v:10.2f}" if v is not None else f"{'-':>10}" for v in (g, i))
        ratio = f"{i / g:10.2f}" if g and i is not None else f"{'-':>10}"
        print(f"{label:50}{cells}{ratio}")
    per_repeat = ", ".join(f"{r:.2f}" for r in compared["per_repeat"])
    verdict = "met" if compared["target_met"] else "NOT met"
    print(
        f"in-place / gang, kill -> first step: {compared['in_place_over_gang']:.2f} "
        f"(each repeat: {per_repeat}); target <= {compared['target']}: {verdict}"
    )


def write_results(out: Path, results: dict[str, Any]) -> None:
    results["medians"] = {s: medians(runs) for s, runs in results["runs"].items()}
    results["in_place_against_gang"] = in_place_against_gang(results)
    out.write_text(json.dumps(results, indent=2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="runs of each scenario")
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {SCENARIOS}"
    )
    args = parser.parse_args()
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown or not scenarios or args.repeats < 1:
        parser.error(f"scenarios must be among {SCENARIOS} and --repeats >= 1")
    why_not = e2e_prerequisites()
    if why_not:
        print(f"bench-elastic cannot run here: {why_not}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench-elastic-"))
    results: dict[str, Any] = {
        "machine": machine(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load_average_at_start": list(os.getloadavg()),
        "agent_state_dir": str(work / "nodeagent"),
        "runs": {s: [] for s in scenarios},
    }
    out_dir = REPO / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"elastic-{time.strftime('%Y%m%dT%H%M%S')}.json"
    with running_cluster() as cluster:
        apply_crd(cluster.kubectl)
        with (
            running_node_agent(cluster, work / "nodeagent") as agent,
            running_e2e_operator(cluster, agent, work) as operator,
        ):
            driver = JobDriver(cluster.api_client())
            # Interleaved, so that a change in the machine's load falls on each scenario.
            for repeat in range(args.repeats):
                for scenario in scenarios:
                    figures = one_run(scenario, cluster, agent, operator, driver)
                    print(f"{scenario} run {repeat + 1}: {json.dumps(figures)}", flush=True)
                    results["runs"][scenario].append(figures)
                    # Written after every run: a later run's failure loses none.
                    write_results(out, results)
    results["load_average_at_end"] = list(os.getloadavg())
    write_results(out, results)
    print_table(results)
    print_side_by_side(results)
    print(f"\nwritten: {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
