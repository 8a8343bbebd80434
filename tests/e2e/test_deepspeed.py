"""DeepSpeed through the operator: examples/deepspeed-cpu.yaml, a 1 + 1 job
running DeepSpeed's own launcher in no-ssh mode on the operator's hostfile
(ZeRO stage 2, gloo on CPU), as real processes under the node agent.

Once DeepSpeed's ``save_checkpoint`` has written the first checkpoint on the
job's volume (rank 0 holds there, the script's ``--hold-after-checkpoint``,
until the kill), the worker's training process is SIGKILLed: DeepSpeed's launcher ends
the pod, the operator restarts the gang, and the new gang's script resumes
from DeepSpeed's ``latest`` checkpoint (the parameters it loads are the ones
saved) and the job succeeds. The same script then runs under torchrun, which
takes the gang from the pods' ``PET_*`` variables.

DeepSpeed's shared-memory collective op comes compiled into the venv's
DeepSpeed (``make deepspeed-ops``, as the DeepSpeed trainer image has it).
Where it was not (no compiler at set-up), DeepSpeed compiles it at a process's
first start into ``TORCH_EXTENSIONS_DIR``, this machine's cache beside the
cluster binaries, and later starts load it.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_training import failure_report, get_job, load_example, pod_uid, wait_job
from tests.fixtures.e2e import HOLD_FOLDER, Hold, apply_objects
from tests.fixtures.poll import wait_for
from torchfleet_operator.api.v1alpha1 import TrainingJob
from torchfleet_operator.desired import hostfile
from torchfleet_operator.desired.pods import build_pod

from nodeagent import procs  # isort: skip  (dev/ is put on the path by the fixtures)

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.timeout(1200)]

SCRIPTS = Path(__file__).parent / "scripts"
# Where every pod of every run finds the compiled op (the pods' processes see
# this machine's files): compiled once per machine, not once per test run.
TORCH_EXTENSIONS_DIR = Path.home() / ".cache" / "torchfleet" / "torch-extensions"
STEPS = 16
CHECKPOINT_EVERY = 4


@pytest.fixture
def compiler() -> None:
    """DeepSpeed's first start builds its op with the machine's C++ compiler
    (the pods' processes are this machine's): without one it would fail in the
    pod, and the test only after its time-outs."""
    if shutil.which("c++") is None:
        pytest.fail("no C++ compiler for DeepSpeed's op build: `make deps` installs g++")


def code_config_map() -> dict[str, Any]:
    files = ("deepspeed_train.py", "ds_config.json")
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "deepspeed-train"},
        "data": {name: (SCRIPTS / name).read_text() for name in files},
    }


def deepspeed_job(**overrides: Any) -> dict[str, Any]:
    """The example, shorter, held after its first checkpoint (``held``), with
    the shared extensions cache."""
    job = load_example("deepspeed-cpu.yaml")
    job["spec"]["args"] = [
        "--checkpoint-dir=$(TORCHFLEET_CHECKPOINT_DIR)",
        f"--steps={STEPS}",
        f"--checkpoint-every={CHECKPOINT_EVERY}",
        f"--hold-after-checkpoint={CHECKPOINT_EVERY}",
        f"--hold-dir=$(TORCHFLEET_CHECKPOINT_DIR)/{HOLD_FOLDER}",
    ]
    for role in ("master", "worker"):
        trainer = job["spec"][role]["template"]["spec"]["containers"][0]
        trainer["env"].append({"name": "TORCH_EXTENSIONS_DIR", "value": str(TORCH_EXTENSIONS_DIR)})
    job["spec"].update(overrides)
    return job


def reports(log: str) -> list[dict[str, Any]]:
    """The script's JSON lines (the launchers' own log lines are not JSON)."""
    return [json.loads(line) for line in log.splitlines() if line.startswith('{"event"')]


def of(log: str, event: str) -> list[dict[str, Any]]:
    return [r for r in reports(log) if r["event"] == event]


def wait_held(cluster: Any, hold: Hold, namespace: str, name: str, timeout: float) -> int:
    """The step rank 0 holds at, after its first save (the first start may
    compile DeepSpeed's op: minutes on a busy machine)."""

    def held() -> dict[str, Any] | None:
        status = get_job(cluster, namespace, name).get("status") or {}
        assert status.get("phase") not in ("Failed", "Succeeded", "Restarting"), status
        return hold.held()

    return int(wait_for("rank 0 held after its first checkpoint", held, timeout, 0.5)["step"])


def test_deepspeed_launcher_restarts_the_gang_and_resumes_from_its_checkpoint(
    cluster, e2e_namespace, node_agent, e2e_operator, compiler
):
    namespace, job = e2e_namespace, deepspeed_job()
    name = job["metadata"]["name"]
    master, worker = f"{name}-master-0", f"{name}-worker-0"
    apply_objects(cluster, namespace, code_config_map(), job)
    hold = Hold(node_agent.claim_dir(namespace, f"{name}-checkpoint") / HOLD_FOLDER, 0)
    try:
        held_step = wait_held(cluster, hold, namespace, name, timeout=540)
        ranks = procs.rank_processes(pod_uid(cluster, namespace, worker))
        assert [("deepspeed_train.py" in r.cmdline) for r in ranks] == [True], ranks
        procs.kill(ranks[0], signal.SIGKILL)
        hold.release()
        done = wait_job(cluster, namespace, name, {"Succeeded", "Failed"}, timeout=540)
        assert done["status"]["phase"] == "Succeeded", done["status"]
    except AssertionError as error:
        report = failure_report(cluster, namespace, node_agent, e2e_operator)
        raise AssertionError(f"{error}\n{report}") from None
    assert done["status"]["restartCount"] == 1

    master_logs = node_agent.logs(namespace, master, "trainer")
    worker_logs = node_agent.logs(namespace, worker, "trainer")
    assert len(master_logs) == len(worker_logs) == 2, "one run per gang"
    hosts = [line.split()[0] for line in hostfile.lines(name, namespace, _spec(job))]
    for node_rank, logs in enumerate((master_logs, worker_logs)):
        for log in logs:
            # DeepSpeed's launcher read the operator's hostfile, in node-rank order,
            # and ran this pod as its node rank.
            world = re.search(r"WORLD INFO DICT: (\{.*\})", log)
            assert world is not None, log[-2000:]
            assert list(ast.literal_eval(world.group(1))) == hosts
            assert f"nnodes=2, num_local_procs=1, node_rank={node_rank}" in log
            (start,) = of(log, "start")
            assert (start["world_size"], start["zero_stage"], start["backend"]) == (2, 2, "gloo")

    # The first gang saved, then lost its worker before the end.
    first = of(master_logs[0], "checkpoint")
    assert first and not of(master_logs[0], "done")
    saved = {r["step"]: r["checksum"] for r in first}
    # The new gang loaded DeepSpeed's latest checkpoint: the step after the last
    # one saved (the one held at, the first), with the very parameters saved
    # (both ranks).
    last = max(saved)
    assert last == held_step == CHECKPOINT_EVERY, (saved, held_step)
    for logs in (master_logs, worker_logs):
        (start,) = of(logs[1], "start")
        assert start["step"] == last + 1
        assert start["resumed_from"].endswith(f"/step{last}/mp_rank_00_model_states.pt")
        assert start["checksum"] == saved[last]
        assert [r["step"] for r in of(logs[1], "done")] == [STEPS]
    latest = node_agent.claim_dir(namespace, f"{name}-checkpoint") / "latest"
    assert latest.read_text().strip() == f"step{STEPS}"


def test_the_same_script_runs_under_torchrun_from_the_pods_pet_variables(
    cluster, e2e_namespace, node_agent, e2e_operator, compiler
):
    namespace = e2e_namespace
    job = deepspeed_job(
        command=[
            "python",
            "-m",
            "torch.distributed.run",
            "/workspace/deepspeed_train.py",
            "--deepspeed",
            "--deepspeed_config=/workspace/ds_config.json",
        ],
        args=["--checkpoint-dir=$(TORCHFLEET_CHECKPOINT_DIR)", "--steps=4", "--checkpoint-every=2"],
    )
    name = job["metadata"]["name"] = "torchrun-zero2"
    apply_objects(cluster, namespace, code_config_map(), job)
    try:
        done = wait_job(cluster, namespace, name, {"Succeeded", "Failed"}, timeout=540)
        assert done["status"]["phase"] == "Succeeded", done["status"]
    except AssertionError as error:
        report = failure_report(cluster, namespace, node_agent, e2e_operator)
        raise AssertionError(f"{error}\n{report}") from None
    starts = []
    for pod in (f"{name}-master-0", f"{name}-worker-0"):
        (log,) = node_agent.logs(namespace, pod, "trainer")
        (start,) = of(log, "start")
        starts.append(start)
        assert [r["step"] for r in of(log, "done")] == [4]
    # torchrun numbered the processes from PET_NODE_RANK: the master's is rank 0.
    assert [s["rank"] for s in starts] == [0, 1]
    assert {(s["world_size"], s["zero_stage"], s["resumed_from"]) for s in starts} == {(2, 2, None)}
    latest = node_agent.claim_dir(namespace, f"{name}-checkpoint") / "latest"
    assert latest.read_text().strip() == "step4"


# ---- the hostfile writer's script, run by a real shell --------------------------------------


def _spec(manifest: dict[str, Any]) -> Any:
    return TrainingJob.model_validate({**manifest, "metadata": {"name": "x"}}).spec


@pytest.mark.parametrize(
    ("spec", "rank", "restart"),
    [
        ({"worker": {"replicas": 3}, "processesPerNode": 8}, 2, 0),
        ({"worker": {"replicas": 3}, "processesPerNode": 8}, 2, 4),
        ({"worker": {"replicas": 1}, "elastic": {"minNodes": 2, "maxNodes": 5}}, 1, 0),
        ({"worker": {"replicas": 0}}, 0, 0),
    ],
    ids=["fixed", "restarted", "elastic", "master-only"],
)
def test_the_init_containers_script_writes_the_operators_lines(tmp_path, spec, rank, restart):
    """The init container's POSIX shell script writes exactly hostfile.lines()."""
    manifest = {"apiVersion": "torchfleet.dev/v1alpha1", "kind": "TrainingJob"}
    parsed = _spec({**manifest, "spec": {"command": ["torchrun", "train.py"], **spec}})
    pod = build_pod("llm", "team", "uid-1", parsed, rank, restart, "image:1")
    (init,) = pod["spec"]["initContainers"]
    command = list(init["command"])
    path = tmp_path / "hostfile"
    command[command.index("/etc/deepspeed/hostfile")] = str(path)
    subprocess.run(command, check=True, timeout=30)
    assert path.read_text().splitlines() == hostfile.lines("llm", "team", parsed)
