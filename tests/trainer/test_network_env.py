"""The network env the operator renders lets gloo rendezvous.

NCCL reads ``^lo,docker`` (exclude) and ``=ib0`` (exact) in NCCL_SOCKET_IFNAME;
gloo reads only exact interface names, so the same string in
GLOO_SOCKET_IFNAME makes every rank fail at init_process_group. Two real
processes join a gloo group with exactly the env of the pods the operator
builds (only the master's address is this machine's instead of its DNS name).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.fixtures.trainer import trainer_env
from tests.trainer.cli_process import free_port
from torchfleet_contract import pod as contract
from torchfleet_operator.api.v1alpha1 import TrainingJob
from torchfleet_operator.desired.pods import build_pod

pytestmark = pytest.mark.trainer

# Joins the group from the env alone (env://), all-reduces its rank, prints the sum.
WORKER = """
import datetime, torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
print(f"sum={int(value.item())}", flush=True)
dist.destroy_process_group()
"""


def _pod_env(socket_interface: str, rank: int, port: int) -> dict[str, str]:
    body = {
        "apiVersion": "torchfleet.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "gloo"},
        "spec": {
            "worker": {"replicas": 1},
            "command": ["python", "worker.py"],
            "network": {"transport": "tcp", "socketInterface": socket_interface},
        },
    }
    spec = TrainingJob.model_validate(body).spec
    pod = build_pod("gloo", "team", "uid-1", spec, rank, 0, "img:1")
    # By value only: the node name comes from the downward API, resolved on a node.
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if "value" in e}
    # The master pod's DNS name does not resolve here; everything else is as rendered.
    return env | {contract.MASTER_ADDR: "127.0.0.1", contract.MASTER_PORT: str(port)}


def _run_group(envs: list[dict[str, str]]) -> list[subprocess.CompletedProcess[str]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER],
            env=trainer_env() | env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for env in envs
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return results


@pytest.mark.parametrize("socket_interface", ["^lo,docker", "=lo", "lo"])
def test_gloo_initialises_with_the_rendered_env(socket_interface: str) -> None:
    port = free_port()
    envs = [_pod_env(socket_interface, rank, port) for rank in (0, 1)]
    assert envs[0]["NCCL_SOCKET_IFNAME"] == socket_interface
    for result in _run_group(envs):
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.strip() == "sum=3"


def test_nccl_syntax_in_the_gloo_variable_would_break_the_rendezvous() -> None:
    """Why the operator leaves GLOO_SOCKET_IFNAME out for NCCL's forms."""
    port = free_port()
    envs = [_pod_env("lo", rank, port) | {"GLOO_SOCKET_IFNAME": "^lo"} for rank in (0, 1)]
    results = _run_group(envs)
    assert all(result.returncode != 0 for result in results)
    assert "^lo" in results[0].stderr
