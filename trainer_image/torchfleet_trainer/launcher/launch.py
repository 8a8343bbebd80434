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

What the exit codes mean and the workers' outcome reports are outcomes.py's;
training in a process, this one or a worker, is in_process.py's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping
from multiprocessing import forkserver
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous import RendezvousError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from torchfleet_contract.pod import (
    ContractError,
    ElasticRendezvous,
    ExitCodePolicy,
    PodContract,
    rendezvous_configs,
)
from torchfleet_contract.trainer_config import (
    ConfigError,
    TrainConfig,
    largest_world,
    pod_contract,
    recovery_settings,
    resolve_checkpoint_dir,
)
from torchfleet_trainer import termination
from torchfleet_trainer.launcher import logtee, lost_peer, worker
from torchfleet_trainer.launcher.in_process import train
from torchfleet_trainer.launcher.outcomes import (
    EXIT_COLLECTIVE_FAILED,
    EXIT_CONFIG,
    EXIT_PREEMPTED,
    EXIT_PREEMPTED_UNSAVED,
    permanent_failure,
    preempted_exit_code,
)

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
    start_forkserver()
    format_agent_tracebacks_plainly()
    args = (config_json, str(outcomes), os.getpid())
    return run_children(
        launch_config, *args, outcomes=outcomes, entrypoint=worker.run, failed=failed
    )


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
    if not isinstance(launch_config.logs_specs, _OwnLogs):
        # torch's default (made with the LaunchConfig) is a torchelastic_*
        # folder in TMPDIR for the agent's per-round files, never removed: the
        # agent gets one that goes with the launch, and the default, still
        # empty, goes now.
        _remove_if_empty(launch_config.logs_specs)
        with tempfile.TemporaryDirectory(prefix="torchelastic_") as logs:
            return run_children(
                dataclasses.replace(launch_config, logs_specs=_OwnLogs(log_dir=logs)),
                *args,
                outcomes=outcomes,
                entrypoint=entrypoint,
                failed=failed,
            )
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


class _OwnLogs(DefaultLogsSpecs):
    """The agent's log folder run_children made, and removes, for one launch."""


def _remove_if_empty(specs: object) -> None:
    if isinstance(specs, DefaultLogsSpecs):
        with contextlib.suppress(OSError):
            os.rmdir(specs.root_log_dir)


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
