"""Elastic training benchmark: how long a lost worker stops training, elastic
against a gang restart, on this machine's e2e harness.

The harness is the e2e tier's own: the local cluster, the node agent running
pods as real processes, the real operator. The job is the elastic e2e test's
1 + 2 Shakespeare job (one process per pod, global batch 12) logging every
step. It trains at world size 3 to its first checkpoint; then every process of
worker-1 is SIGKILLed, as a lost node's are, and the seconds are read from the
trainer's own JSON log events ("world", "resumed", "step") against the wall
clock of the kill; where the seconds went, from the torch elastic agent's own
log lines (LOGLEVEL=INFO) and the node agent's pod start stamps. Scenarios,
run in turn ``--repeats`` times each:

* ``elastic``: the replacement worker is held by its init container's gate
  (the e2e test's) until the survivors have stepped at world size 2. Figures:
  loss -> first step at world size 2; gate released (the replacement pod
  already started by the node agent, its init container polling the gate) ->
  first step at world size 3 again.
* ``gang``: the same job without ``spec.elastic``: the operator restarts the
  whole gang. Figure: loss -> first step of the new gang, and the checkpoint
  step it resumed from (the steps trained again).
* ``elastic-free``: elastic, no gate: the replacement comes back at once.
  Figure: loss -> first step at world size 3 again (and at 2, if the survivors
  stepped before the replacement joined).

Each job's namespace is deleted once its figures are seen (and waited for, so
that its processes do not load the next run). JSON goes to benchmarks/results/.

    python benchmarks/bench_elastic.py --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
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
from tests.e2e.test_training import corpus_namespace, get_job, pod_uid  # noqa: E402
from tests.fixtures.cluster import Cluster, running_cluster  # noqa: E402
from tests.fixtures.e2e import (  # noqa: E402
    NodeAgent,
    apply_objects,
    e2e_prerequisites,
    running_e2e_operator,
    running_node_agent,
)
from tests.fixtures.operator import JobDriver, apply_crd  # noqa: E402

MASTER = f"{NAME}-master-0"
FULL, SHRUNK = 3, 2
# Bounds on each wait, not targets: ranks start slowly when the two cores are busy.
FIRST_CHECKPOINT_TIMEOUT = 420.0
RECOVERY_TIMEOUT = 300.0
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


def bench_job(elastic: bool) -> dict[str, Any]:
    """The e2e test's job, logging every step (the test logs every second one)
    so that a first step is seen when it is taken; without ``spec.elastic``
    for the gang restart (runPolicy: OnFailure, the example's)."""
    job = elastic_shakespeare()
    job["spec"]["trainer"]["training"]["logInterval"] = 1
    for role in ("master", "worker"):
        for container in job["spec"][role]["template"]["spec"]["containers"]:
            # torch's elastic agent then logs its rendezvous rounds (read below).
            container.setdefault("env", []).append({"name": "LOGLEVEL", "value": "INFO"})
    if not elastic:
        del job["spec"]["elastic"]
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
    return lost_at, {
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


def gang_run(run: Run) -> dict[str, Any]:
    lost_at, figures = lose_after_first_checkpoint(run, hold_replacement=False)
    restarted = run.wait_for(
        "steps of the restarted gang", lambda: run.steps_at(FULL, lost_at), RECOVERY_TIMEOUT
    )
    again = run.resumed_and_world(FULL, lost_at)
    # Logged by rank 0 right after its process group is up: every rank started
    # and met at the new master's store.
    group_up = run.first("metrics", lost_at)
    return {
        **figures,
        "loss_to_step_s": restarted[0]["time"] - lost_at,
        "loss_to_new_master_started_s": since(run.agent_started(MASTER, lost_at), lost_at),
        "loss_to_new_gang_started_s": since(run.gang_started(lost_at), lost_at),
        "loss_to_process_group_s": since(group_up["time"] if group_up else None, lost_at),
        "loss_to_world_s": again["world_event_s"] - lost_at,
        "loss_to_resumed_s": since(again["resumed_event_s"], lost_at),
        "resumed_step": again["resumed_step"],
        "checkpoint_load_s": again["checkpoint_load_s"],
        "steps_redone": steps_between(figures["last_step_before_loss"], again["resumed_step"]),
        "restart_count": run.status().get("restartCount"),
    }


SCENARIO_RUNS: dict[str, Callable[[Run], dict[str, Any]]] = {
    "elastic": elastic_gated_run,
    "gang": gang_run,
    "elastic-free": elastic_free_run,
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
        apply_objects(cluster, namespace, bench_job(elastic=scenario != "gang"))
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
        ("loss -> first step of the new gang (s)", "loss_to_step_s"),
        ("  loss -> new master pod started (s)", "loss_to_new_master_started_s"),
        ("  loss -> all new pods started (s)", "loss_to_new_gang_started_s"),
        ("  loss -> process group up (s)", "loss_to_process_group_s"),
        ("  loss -> new gang's world event (s)", "loss_to_world_s"),
        ("  checkpoint load (s)", "checkpoint_load_s"),
        ("steps trained again", "steps_redone"),
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


def write_results(out: Path, results: dict[str, Any]) -> None:
    results["medians"] = {s: medians(runs) for s, runs in results["runs"].items()}
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
    print(f"\nwritten: {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
