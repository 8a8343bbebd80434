"""From the pod contract to training processes.

* Started by torchrun, or one process per pod (``RANK``/``WORLD_SIZE`` set):
  this process trains.
* N processes per pod: PyTorch's elastic launcher (the API behind torchrun)
  starts them with a static rendezvous at the master pod, forwards SIGTERM to
  them and reports failures.
* A fixed gang with an in-place budget (``TORCHFLEET_IN_PLACE_RESTARTS`` > 0,
  even with one process per pod): the same elastic agent at min = max = the
  gang's nodes, its c10d rendezvous hosted by node rank 0's launcher. A failed
  worker makes every launcher restart its workers in a new round (a peer's
  workers fail with 202 when theirs dies; an agent whose workers still run sees
  the others waiting), resuming from the last checkpoint, until the budget is
  spent; then the launcher exits with its workers' failure code, and one whose
  peers closed the rendezvous exits 202.
* An elastic job (``PET_RDZV_BACKEND=c10d``, even with one process per pod):
  the elastic agent joins the c10d rendezvous between minNodes and maxNodes.
  When a node is lost or one joins, every agent restarts its workers in a new
  round; they resume from the last complete checkpoint at the new world size
  (DCP reshards, the data position counts global batches, gradient
  accumulation keeps the global batch). A failure uses up one of
  ``PET_MAX_RESTARTS``; a node joining does not.

Whenever the agent runs, its workers are forked from a forkserver the launcher
starts first, with torch and the trainer already imported (forkserver.py,
worker.py): a new round's workers start in milliseconds, not the seconds of
imports every one of them would pay at once in a fresh interpreter.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping
from multiprocessing import forkserver
from pathlib import Path
from typing import Any, NoReturn

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous import RendezvousError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from torchfleet_trainer import contract, termination
from torchfleet_trainer.config import (
    ConfigError,
    TrainConfig,
    largest_world,
    pod_contract,
    recovery_settings,
    resolve_checkpoint_dir,
)
from torchfleet_trainer.contract import (
    ContractError,
    ElasticRendezvous,
    ExitCodePolicy,
    PodContract,
    in_place_restarts_left,
    rendezvous_configs,
)
from torchfleet_trainer.launcher import logtee, lost_peer
from torchfleet_trainer.launcher.logtee import keep_logs

EXIT_CONFIG = 2
# 128 + SIGTERM, as a shell reports a terminated process: the gang was
# preempted and a checkpoint of the step it stopped at was saved (not success).
EXIT_PREEMPTED = 143
# Stopped on SIGTERM without saving: no checkpoint directory, checkpoints
# disabled or saveOnSigterm off, or a worker that died before it could save.
# Above every 128 + signal code (Linux has 64 signals) so it is never read as
# one, and >= 128 so the operator's ExitCode policy retries it as the
# disruption it is; the new gang starts from the last checkpoint, if any.
EXIT_PREEMPTED_UNSAVED = 200
# Each worker's exit code, in the launcher's temporary directory (worker.py).
# Named by the agent's round (torchelastic's restart count) and local rank:
# round-<R>.rank-<local>.exit. The next round's workers read the failed round's
# to say why it failed; a stopped launcher reads the newest round's.
OUTCOME_GLOB = "round-*.rank-*.exit"
# Too many consecutive non-finite steps (training.maxNonFiniteSteps): a
# permanent failure under the operator's ExitCode policy.
EXIT_DIVERGED = 3
# A collective of the preflight check failed or timed out (preflight.enabled):
# the pod contract's, since the operator names it in the Preflight condition.
EXIT_PREFLIGHT_FAILED = contract.EXIT_PREFLIGHT_FAILED
# A collective timed out waiting on a peer, or lost one (its connection reset):
# the gang, not this rank, is broken (timeouts.py sets the timeout). >= 128 so
# the operator's ExitCode policy retries it; the next gang or in-place round
# resumes from the last checkpoint. Each rank that sees it logs one line naming
# itself, the timeout and torch's message.
EXIT_COLLECTIVE_FAILED = contract.EXIT_COLLECTIVE_FAILED

# How the agent starts a worker (worker.run): forked from a server that has
# imported torch and the trainer (forkserver.py), not a new interpreter.
START_METHOD = "forkserver"
FORKSERVER_PRELOAD = "torchfleet_trainer.launcher.forkserver"

# The c10d rendezvous's timeouts (seconds) unless PET_RDZV_CONF sets them.
# A lost node is declared dead after keep_alive_interval x keep_alive_max_attempt
# without a heartbeat: the survivors cannot start the next round before that.
# last_call is how long a round that has minNodes waits for more: survivors
# re-join within a second or two of each other (they see the same failed
# collective), while a replacement pod takes far longer to be scheduled and
# start, and joins the round after through the agents' wait list anyway, so
# torch's 30 s would only delay every resume.
ELASTIC_RDZV_DEFAULTS = {
    "join_timeout": "600",
    "last_call_timeout": "5",
    "keep_alive_interval": "2",
    "keep_alive_max_attempt": "3",
}


def launch(
    config: TrainConfig,
    processes_per_node: int | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    try:
        pod = pod_contract(env)
        recovery_settings(env)  # refused here, before any process group starts
        ExitCodePolicy.from_env(env)
        if pod.process is not None:
            largest = largest_world(pod, pod.process.local_world_size)
            config.check_world(pod.process.world_size, largest)
            return train_alone(config, pod)
        processes = processes_per_node or pod.processes_per_node
        if pod.elastic is not None:
            config.check_elastic(pod.elastic.node_counts, processes)
        else:
            config.check_world(pod.nodes * processes)
    except (ConfigError, ContractError) as err:
        print(f"torchfleet-train: {err}", file=sys.stderr)
        return EXIT_CONFIG
    if pod.elastic is None and pod.nodes * processes == 1 and pod.in_place_restarts == 0:
        return train_alone(config, pod)
    if pod.elastic is not None:
        launch_config = elastic_launch_config(pod, processes)
    elif pod.in_place_restarts > 0:
        # The elastic path at a fixed size: a failure starts a new round.
        launch_config = rendezvous_launch_config(ElasticRendezvous.fixed_gang(pod), processes)
    else:
        launch_config = static_launch_config(pod, processes)
    if processes > 1:
        # As torchrun does: N workers each running a thread per core would
        # oversubscribe the node. The workers inherit this; a user's value wins.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="torchfleet-outcomes-") as outcomes:
        failed: list[int] = []
        code = run_workers(
            launch_config, config.model_dump_json(by_alias=True), Path(outcomes), failed
        )
    if code != 0:
        root = resolve_checkpoint_dir(config, pod)
        tail = logtee.kept_tail(root, pod.restart_count, failed[0] if failed else None)
        preempted = code == EXIT_PREEMPTED
        termination.after_failure(Path(pod.termination_message_path), tail, preempted)
    return code


def train_alone(config: TrainConfig, pod: PodContract) -> int:
    """Trains in this process (no agent of ours between it and the pod); after a
    failure, as launch() does, the figures stay with the failure's last lines:
    its traceback, or what the kept log says of a failure it exits with."""
    path = Path(pod.termination_message_path)
    rank = pod.ranks.rank if pod.ranks else 0
    if rank != 0:  # under someone else's torchrun: only rank 0 writes figures
        return train(config)
    try:
        code = train(config)
    except BaseException as err:
        if isinstance(err, SystemExit) and not err.code:
            raise
        text = "".join(traceback.format_exception(err))
        termination.after_failure(path, text[-logtee.TAIL_BYTES :])
        raise
    if code != 0:
        logtee.finish()  # every line it printed is in the kept log now
        tail = logtee.kept_tail(resolve_checkpoint_dir(config, pod), pod.restart_count, rank)
        termination.after_failure(path, tail, code == EXIT_PREEMPTED)
    return code


def start_forkserver() -> None:
    """Starts the forkserver the agent forks every worker from (worker.py), with
    torch and the trainer imported once (forkserver.py). Started with the
    launcher, so that it imports while the first round meets and is warm long
    before a failure needs a worker again; it inherits this process's
    environment as it is now, so it starts after the launcher has set it."""
    multiprocessing.set_forkserver_preload([FORKSERVER_PRELOAD])
    forkserver.ensure_running()


def run_workers(
    launch_config: LaunchConfig, config_json: str, outcomes: Path, failed: list[int]
) -> int:
    """The trainer's workers under the elastic agent, forked from the warm
    forkserver; the pod's exit code. The global rank that failed first, if one
    did, goes into ``failed``."""
    # Deferred: worker.py imports this module.
    from torchfleet_trainer.launcher.worker import run

    start_forkserver()
    format_agent_tracebacks_plainly()
    args = (config_json, str(outcomes), os.getpid())
    return run_children(launch_config, *args, outcomes=outcomes, entrypoint=run, failed=failed)


class _PlainTraceback(logging.Filter):
    """Puts a record's traceback into its text before torch's formatter sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        return True


def format_agent_tracebacks_plainly() -> None:
    """torch's log formatter imports torch._dynamo (with inductor and triton) to
    format the first record that carries a traceback, and the agent logs one for
    every worker that fails: every in-place or elastic round waited for that
    import in the launcher, 2.5 s of CPU on an idle 2-core machine and 4-6 s on
    a loaded one, before its rendezvous began. The same text, formatted here,
    costs nothing."""
    # torch gives several of its loggers a handler of their own (torch,
    # torch.distributed, ...): every one of them formats that way.
    names = [name for name in logging.Logger.manager.loggerDict if name.split(".")[0] == "torch"]
    for name in names:
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, _PlainTraceback) for f in handler.filters):
                handler.addFilter(_PlainTraceback())


def static_launch_config(pod: PodContract, processes: int) -> LaunchConfig:
    """A fixed gang: every node at its NODE_RANK, no restarts."""
    return LaunchConfig(
        min_nodes=pod.nodes,
        max_nodes=pod.nodes,
        nproc_per_node=processes,
        run_id=pod.rendezvous_id,
        rdzv_backend="static",
        rdzv_endpoint=f"{pod.master_addr}:{pod.master_port}",
        rdzv_configs={"rank": pod.node_rank},
        # The operator restarts the whole gang; restarting here would hide failures.
        max_restarts=0,
        start_method=START_METHOD,
    )


def elastic_launch_config(pod: PodContract, processes: int) -> LaunchConfig:
    """torchrun's elastic launch from the contract's PET_* variables."""
    assert pod.elastic is not None
    return rendezvous_launch_config(pod.elastic, processes)


def rendezvous_launch_config(elastic: ElasticRendezvous, processes: int) -> LaunchConfig:
    """torchrun's elastic launch: an elastic job's, or a fixed gang's with an
    in-place restart budget (one implementation, one set of restarts)."""
    # Each round's rank-0 agent then hands its workers a fresh store address.
    # Sharing the agent's store keeps the first round's address in nodes whose
    # rank stays non-zero, which is wrong once the rank-0 node has been lost.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    # A peer whose heartbeat stopped starts a new round at once (lost_peer.py).
    # Workers that stop because a peer's did are not a failure of their own.
    lost_peer.install(
        fallout_codes=(EXIT_PREEMPTED, EXIT_PREEMPTED_UNSAVED, EXIT_COLLECTIVE_FAILED)
    )
    return LaunchConfig(
        min_nodes=elastic.min_nodes,
        max_nodes=elastic.max_nodes,
        nproc_per_node=processes,
        run_id=elastic.run_id,
        rdzv_backend="c10d",
        rdzv_endpoint=elastic.endpoint,
        rdzv_configs=ELASTIC_RDZV_DEFAULTS | rendezvous_configs(elastic.conf),
        max_restarts=elastic.max_restarts,
        start_method=START_METHOD,
        local_addr=elastic.local_addr,
    )


def run_children(
    launch_config: LaunchConfig,
    *args: Any,
    outcomes: Path | None = None,
    entrypoint: Callable[..., int] | str = sys.executable,
    failed: list[int] | None = None,
) -> int:
    """Runs ``entrypoint(*args)`` under the elastic agent (a function, or a
    command: by default ``python *args``); the pod's exit code. The global rank
    of the first child to fail goes into ``failed``, when given.

    Each worker writes its own exit code into ``outcomes`` (see worker.py):
    when the launcher itself is signalled the agent stops the workers and
    keeps their codes to itself, and only those codes say whether they saved."""
    try:
        elastic_launch(launch_config, entrypoint)(*args)
    except RendezvousError as err:
        # Another launcher spent its budget and closed the rendezvous, or the
        # round never completed: the gang is broken, not this pod's program.
        print(
            f"torchfleet-train: rendezvous: {err}; exiting {EXIT_COLLECTIVE_FAILED}",
            file=sys.stderr,
        )
        return EXIT_COLLECTIVE_FAILED
    except SignalException:
        permanent = permanent_failure(outcomes) if outcomes else None
        if permanent is not None:
            return permanent
        return preempted_exit_code(outcomes, launch_config.nproc_per_node)
    except ChildFailedError as err:
        if failed is not None:
            failed.append(err.get_first_failure()[0])
        return child_failure_exit_code([f.exitcode for f in err.failures.values()], _first(err))
    return 0


def preempted_exit_code(outcomes: Path | None, workers: int) -> int:
    """143 only when every one of this pod's ``workers`` reported a saved
    checkpoint; a worker with no report was stopped before it could save."""
    rounds = {_round_of(path) for path in outcomes.glob(OUTCOME_GLOB)} if outcomes else set()
    codes = list(round_outcomes(outcomes, max(rounds)).values()) if outcomes and rounds else []
    if len(codes) == workers and all(code == EXIT_PREEMPTED for code in codes):
        return EXIT_PREEMPTED
    return EXIT_PREEMPTED_UNSAVED


def permanent_failure(outcomes: Path) -> int | None:
    """A code the run policy does not retry among the newest round's reports: a
    worker that exited with it stopped this launcher (stop_launcher_if_permanent)."""
    rounds = {_round_of(path) for path in outcomes.glob(OUTCOME_GLOB)}
    if not rounds:
        return None
    policy = ExitCodePolicy.from_env()
    for code in round_outcomes(outcomes, max(rounds)).values():
        if code not in (None, 0, EXIT_PREEMPTED, EXIT_PREEMPTED_UNSAVED) and not policy.retries(
            code
        ):
            return code
    return None


def stop_launcher_if_permanent(code: int, launcher_pid: int) -> None:
    """In a worker its agent would restart after a failure: when the run policy
    does not retry ``code``, stop the launcher (SIGTERM: its agent stops the
    other workers, it exits with this code) rather than retry in place what the
    operator would not retry as a gang."""
    if code in (0, EXIT_PREEMPTED, EXIT_PREEMPTED_UNSAVED) or in_place_restarts_left() <= 0:
        return
    policy = ExitCodePolicy.from_env()
    if policy.retries(code):
        return
    print(
        f"torchfleet-train: exit code {code} is permanent under restartPolicy "
        f"{policy.restart_policy}: stopping the launcher instead of restarting in place",
        file=sys.stderr,
        flush=True,
    )
    os.kill(launcher_pid, signal.SIGTERM)


def write_outcome(outcomes: Path, local_rank: int, code: int, round_: int = 0) -> None:
    # By local rank: an elastic job's global ranks change from round to round.
    (outcomes / f"round-{round_}.rank-{local_rank}.exit").write_text(str(code))


def round_outcomes(outcomes: Path, round_: int) -> dict[int, int | None]:
    """The codes this pod's workers of ``round_`` reported, by local rank."""
    found = {}
    for path in outcomes.glob(f"round-{round_}.rank-*.exit"):
        local = path.name.removesuffix(".exit").rpartition("rank-")[2]
        found[int(local)] = _read_code(path)
    return found


def _round_of(path: Path) -> int:
    return int(path.name.split(".", 1)[0].removeprefix("round-"))


def failed_round_reason(outcomes: Path, round_: int, workers: int) -> str | None:
    """Why this pod's workers of the failed ``round_`` ended, as far as they could
    say (one of contract.RESTART_REASONS): a worker that left no report died by a
    signal or crashed; one that lost its peer says so; any other code is the
    program's own failure."""
    codes = round_outcomes(outcomes, round_)
    if len(codes) < workers or None in codes.values():
        return contract.RESTART_REASON_WORKER_KILLED
    if any(code not in (0, EXIT_COLLECTIVE_FAILED) for code in codes.values()):
        return contract.RESTART_REASON_WORKER_FAILED
    if EXIT_COLLECTIVE_FAILED in codes.values():
        return contract.RESTART_REASON_PEER_LOST
    return None


# Set by worker.py: reports this worker's exit code for its launcher, also on a
# path that leaves through os._exit.
report_exit: Callable[[int], None] = lambda code: None  # noqa: E731


def _read_code(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def _first(err: ChildFailedError) -> int:
    _, failure = err.get_first_failure()
    return int(failure.exitcode)


def child_failure_exit_code(codes: list[int], first: int) -> int:
    """The pod's exit code for failed children, in the shell's convention.

    A child killed by signal N (the elastic agent reports -N) becomes 128 + N,
    so that the operator's ExitCode policy sees an OOM kill (137) as the
    retryable signal it is, not as the program's own error. 143 means
    preempted-after-saving only when every child stopped that way; otherwise
    the first child to fail decides (its peers usually exit 1 after it).
    """
    as_shell = [_shell_code(code) for code in codes]
    if as_shell and all(code == EXIT_PREEMPTED for code in as_shell):
        return EXIT_PREEMPTED
    first_code = _shell_code(first)
    return first_code if first_code != 0 else 1


def _shell_code(code: int) -> int:
    return 128 - code if code < 0 else code


def train(config: TrainConfig, restart_reason: str | None = None) -> int:
    """Trains in this process (its output kept on the checkpoint volume too); the
    exit code its outcome calls for. ``restart_reason``: why this pod's workers of
    the previous in-place round failed (worker.py's), None in the first."""
    pod = pod_contract()
    rank = pod.ranks.rank if pod.ranks else 0
    keep_logs(resolve_checkpoint_dir(config, pod), rank, recovery_settings())
    # Deferred: a launcher whose workers train never needs the training stack
    # (seconds of imports, paid again by every elastic agent before it joins).
    from torchfleet_trainer.preflight import PreflightFailed
    from torchfleet_trainer.timeouts import is_peer_failure
    from torchfleet_trainer.train import TrainingDiverged, run_worker

    try:
        return exit_code(run_worker(config, restart_reason).status)
    except TrainingDiverged as err:
        print(f"torchfleet-train: {err}", file=sys.stderr)
        return EXIT_DIVERGED
    except PreflightFailed as err:
        print(f"torchfleet-train: preflight: {err}", file=sys.stderr)
        return EXIT_PREFLIGHT_FAILED
    except Exception as err:
        if not is_peer_failure(err):
            raise
        exit_on_peer_failure(err)


def exit_on_peer_failure(err: BaseException) -> NoReturn:
    """Logs which rank lost its gang and how, then exits 202 at once: threads
    still waiting on the gang (an async save's, the batch prefetcher's) would
    hold an orderly exit up, and nothing they hold is worth keeping."""
    ranks = pod_contract().process
    who = f"rank {ranks.rank}/{ranks.world_size}" if ranks else "this process"
    first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    print(
        f"torchfleet-train: {who}: a collective failed waiting on a peer that is silent "
        f"or gone ({first_line}); exiting {EXIT_COLLECTIVE_FAILED} (retryable)",
        file=sys.stderr,
        flush=True,
    )
    report_exit(EXIT_COLLECTIVE_FAILED)
    logtee.finish()
    os._exit(EXIT_COLLECTIVE_FAILED)


def exit_code(status: str) -> int:
    codes = {"preempted": EXIT_PREEMPTED, "preempted_unsaved": EXIT_PREEMPTED_UNSAVED}
    return codes.get(status, 0)
