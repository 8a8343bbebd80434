"""From the pod contract to training processes.

* Started by torchrun, or one process per pod (``RANK``/``WORLD_SIZE`` set):
  this process trains.
* N processes per pod: PyTorch's elastic launcher (the API behind torchrun)
  starts them with a static rendezvous at the master pod, forwards SIGTERM to
  them and reports failures.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from torchfleet_trainer.config import ConfigError, TrainConfig, pod_contract
from torchfleet_trainer.train import TrainingDiverged, run_worker

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
OUTCOME_GLOB = "rank-*.exit"
# Too many consecutive non-finite steps (training.maxNonFiniteSteps): a
# permanent failure under the operator's ExitCode policy.
EXIT_DIVERGED = 3


def launch(
    config: TrainConfig,
    processes_per_node: int | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    try:
        pod = pod_contract(env)
        if pod.process is not None:
            config.check_world(pod.process.world_size)
            return train(config)
        processes = processes_per_node or pod.processes_per_node
        config.check_world(pod.nodes * processes)
    except ConfigError as err:
        print(f"torchfleet-train: {err}", file=sys.stderr)
        return EXIT_CONFIG
    if pod.nodes * processes == 1:
        return train(config)
    launch_config = LaunchConfig(
        min_nodes=pod.nodes,
        max_nodes=pod.nodes,
        nproc_per_node=processes,
        run_id=pod.rendezvous_id,
        rdzv_backend="static",
        rdzv_endpoint=f"{pod.master_addr}:{pod.master_port}",
        rdzv_configs={"rank": pod.node_rank},
        # The operator restarts the whole gang; restarting here would hide failures.
        max_restarts=0,
        start_method="spawn",
    )
    if processes > 1:
        # As torchrun does: N workers each running a thread per core would
        # oversubscribe the node. The workers inherit this; a user's value wins.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="torchfleet-outcomes-") as outcomes:
        config_json = config.model_dump_json(by_alias=True)
        worker = ["-u", "-m", "torchfleet_trainer.worker", config_json, outcomes]
        return run_children(launch_config, *worker, outcomes=Path(outcomes))


def run_children(launch_config: LaunchConfig, *args: str, outcomes: Path | None = None) -> int:
    """Runs ``python *args`` under the elastic agent; the pod's exit code.

    Each worker writes its own exit code into ``outcomes`` (see worker.py):
    when the launcher itself is signalled the agent stops the workers and
    keeps their codes to itself, and only those codes say whether they saved."""
    try:
        elastic_launch(launch_config, sys.executable)(*args)
    except SignalException:
        return preempted_exit_code(outcomes, launch_config.nproc_per_node)
    except ChildFailedError as err:
        return child_failure_exit_code([f.exitcode for f in err.failures.values()], _first(err))
    return 0


def preempted_exit_code(outcomes: Path | None, workers: int) -> int:
    """143 only when every one of this pod's ``workers`` reported a saved
    checkpoint; a worker with no report was stopped before it could save."""
    reported = list(outcomes.glob(OUTCOME_GLOB)) if outcomes else []
    codes = [_read_code(path) for path in reported]
    if len(codes) == workers and all(code == EXIT_PREEMPTED for code in codes):
        return EXIT_PREEMPTED
    return EXIT_PREEMPTED_UNSAVED


def write_outcome(outcomes: Path, rank: int, code: int) -> None:
    (outcomes / f"rank-{rank}.exit").write_text(str(code))


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


def train(config: TrainConfig) -> int:
    """Trains in this process; the exit code its outcome calls for."""
    try:
        return exit_code(run_worker(config).status)
    except TrainingDiverged as err:
        print(f"torchfleet-train: {err}", file=sys.stderr)
        return EXIT_DIVERGED


def exit_code(status: str) -> int:
    codes = {"preempted": EXIT_PREEMPTED, "preempted_unsaved": EXIT_PREEMPTED_UNSAVED}
    return codes.get(status, 0)
