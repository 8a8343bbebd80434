"""The ``torchfleet`` command against a real API server and operator, run as a
user runs it (the installed console script, a subprocess): ``run --detach``
packs the script into a ConfigMap the job owns and creates the job, the
operator makes its pods; ``ls -o json`` lists it; ``describe`` shows its
phase; ``delete`` removes the job and the garbage collector its code; ``run
--runtime`` gives only the code and the size, the runtime the rest; the code
is created after its job, owned by it, and a refused one takes the job away."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.test_runtimes import Runtimes, runtime_spec
from tests.fixtures.cluster import audit_log
from tests.fixtures.poll import wait_for
from torchfleet_operator.api.constants import CLUSTER_RUNTIME_KIND

pytestmark = pytest.mark.cluster

TORCHFLEET = Path(sys.executable).parent / "torchfleet"
SCRIPT = "import torch.distributed as dist\ndist.init_process_group('gloo')\n"


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def torchfleet(
    cluster: Any, namespace: str, verb: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """``torchfleet VERB --kubeconfig K -n NS ARGS...`` (before a ``--`` in ARGS)."""
    out = subprocess.run(
        [str(TORCHFLEET), verb, "--kubeconfig", cluster.kubeconfig, "-n", namespace, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, f"torchfleet {' '.join(args)} exited {out.returncode}: {out}"
    return out


def test_run_ls_describe_delete(
    cluster: Any, shared_operator: Any, job_driver: Any, namespace: str, script: Path
) -> None:
    created = torchfleet(
        cluster, namespace, "run", str(script), "--nodes", "2", "--name", "cli",
        "--detach", "--", "--epochs", "3",
    )  # fmt: skip
    assert "trainingjob.torchfleet.dev/cli created" in created.stdout

    job = job_driver.get(namespace, "cli")
    assert job["spec"]["command"] == ["torchrun", "/workspace/train.py"]
    assert job["spec"]["args"] == ["--epochs", "3"] and job["spec"]["worker"]["replicas"] == 1
    code = job_driver.get_core(namespace, "configmaps", "cli-code")
    assert code["data"] == {"train.py": SCRIPT}
    owners = [
        (owner["kind"], owner["name"], owner["uid"])
        for owner in code["metadata"].get("ownerReferences") or ()
    ]
    assert owners == [("TrainingJob", "cli", job["metadata"]["uid"])], code["metadata"]

    pods = wait_for(
        "the operator's two pods of cli",
        lambda: len(p := job_driver.live_pods(namespace, "cli")) == 2 and p,
    )
    for pod in pods:
        [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "code"]
        assert volume["configMap"]["name"] == "cli-code"
        [trainer] = [c for c in pod["spec"]["containers"] if c["name"] == "trainer"]
        assert trainer["workingDir"] == "/workspace"
        assert {"name": "code", "mountPath": "/workspace"} in [
            {key: m[key] for key in ("name", "mountPath")} for m in trainer["volumeMounts"]
        ]

    listed = json.loads(torchfleet(cluster, namespace, "ls", "-o", "json").stdout)
    assert [item["metadata"]["name"] for item in listed["items"]] == ["cli"]
    # As a kubectl plugin (kubectl runs kubectl-torchfleet from PATH), the
    # cluster found through KUBECONFIG.
    plugin = subprocess.run(
        [str(cluster.bin_dir / "kubectl"), "torchfleet", "ls", "-n", namespace, "-o", "json"],
        env={**os.environ, "PATH": str(TORCHFLEET.parent), "KUBECONFIG": cluster.kubeconfig},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert plugin.returncode == 0, plugin.stderr
    assert json.loads(plugin.stdout) == listed

    job_driver.wait_phase(namespace, "cli", "Running")
    described = torchfleet(cluster, namespace, "describe", "cli").stdout
    assert "Name:        cli" in described and "Phase:       Running" in described
    assert "Running=True  GangRunning: all 2 pods are running" in described, described

    torchfleet(cluster, namespace, "delete", "cli")
    wait_for("cli deleted", lambda: job_driver.get(namespace, "cli") is None)
    wait_for(
        "the garbage collector to delete cli-code",
        lambda: job_driver.get_core(namespace, "configmaps", "cli-code") is None,
        timeout=90,
    )


def test_the_code_is_created_after_its_job_and_owned_by_it_from_the_start(
    cluster: Any, shared_operator: Any, job_driver: Any, namespace: str, script: Path
) -> None:
    """Wherever the command dies, it leaves no ConfigMap that nothing owns: the
    API server's audit log shows the job created first and the code's one
    write a create that already names its owner (no owner patched in later)."""
    log = audit_log(cluster)
    if log is None:
        pytest.skip("another cluster's API server audit log is not ours to read")
    torchfleet(cluster, namespace, "run", str(script), "--name", "owned", "--detach")
    # Seconds after the command exited: whatever it wrote is logged by then.
    job_driver.wait_phase(namespace, "owned", "Running")
    writes = _writes_of(log, namespace, {("trainingjobs", "owned"), ("configmaps", "owned-code")})
    seen = [(w["verb"], w["objectRef"]["resource"], w["requestReceivedTimestamp"]) for w in writes]
    code_writes = [w for w in writes if w["objectRef"]["resource"] == "configmaps"]
    assert [w["verb"] for w in code_writes] == ["create"], seen
    [job_create] = [
        w for w in writes if w["objectRef"]["resource"] == "trainingjobs" and w["verb"] == "create"
    ]
    assert job_create["stageTimestamp"] <= code_writes[0]["requestReceivedTimestamp"], seen
    job = job_driver.get(namespace, "owned")
    code = job_driver.get_core(namespace, "configmaps", "owned-code")
    assert [owner["uid"] for owner in code["metadata"]["ownerReferences"]] == [
        job["metadata"]["uid"]
    ]


def test_a_refused_code_configmap_takes_its_job_away_again(
    cluster: Any, shared_operator: Any, job_driver: Any, namespace: str, script: Path
) -> None:
    """The API server refuses the code (a ConfigMap of that name is someone
    else's): the command says so, exits 1 and deletes the job it created,
    leaving the other ConfigMap as it was."""
    cluster.kubectl("create", "configmap", "taken-code", "-n", namespace, "--from-literal=a=b")
    out = subprocess.run(
        [str(TORCHFLEET), "run", "--kubeconfig", cluster.kubeconfig, "-n", namespace,
         str(script), "--name", "taken", "--detach"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 1, out
    assert 'Error from server (Conflict): configmaps "taken-code" already exists' in out.stderr
    wait_for("the job taken deleted again", lambda: job_driver.get(namespace, "taken") is None)
    theirs = job_driver.get_core(namespace, "configmaps", "taken-code")
    assert theirs["data"] == {"a": "b"} and "ownerReferences" not in theirs["metadata"], theirs


def _writes_of(log: Path, namespace: str, objects: set[tuple[str, str]]) -> list[dict[str, Any]]:
    """The audit log's completed writes to ``objects`` ((resource, name)) in
    ``namespace``, subresources (a status) left out."""
    events = (json.loads(line) for line in log.read_text().splitlines() if namespace in line)
    return [
        e
        for e in events
        if e.get("stage") == "ResponseComplete"
        and e["verb"] in ("create", "update", "patch", "delete")
        and (ref := e.get("objectRef") or {}).get("namespace") == namespace
        and (ref.get("resource"), ref.get("name")) in objects
        and not ref.get("subresource")
    ]


def test_run_on_a_runtime_gives_only_the_code_and_the_size(
    cluster: Any, shared_operator: Any, job_driver: Any, namespace: str, script: Path
) -> None:
    """A platform team's ClusterTrainingRuntime holds the image, the placement
    and the env; `torchfleet run --runtime` gives the code and the size, and
    the gang runs the merged spec to the end."""
    runtimes = Runtimes(job_driver)
    name = f"cli-{namespace}"[:63]
    runtimes.create(CLUSTER_RUNTIME_KIND, name, runtime_spec("registry.example/team:7"))
    try:
        command = start(
            cluster, namespace, "run", str(script), "--name", "rt", "--nodes", "2",
            "--runtime", name, "--no-logs",
        )  # fmt: skip
        pods = job_driver.wait_running_pods(namespace, "rt", 2)
        job = job_driver.get(namespace, "rt")
        assert job["spec"]["runtimeRef"] == {"kind": CLUSTER_RUNTIME_KIND, "name": name}
        assert "image" not in job["spec"]  # the runtime's, not the command's default
        for pod in pods:
            trainer = next(c for c in pod["spec"]["containers"] if c["name"] == "trainer")
            assert trainer["image"] == "registry.example/team:7"
            assert {"name": "FROM_RUNTIME", "value": "yes"} in trainer["env"]
            assert trainer["workingDir"] == "/workspace"  # the command's code, merged in
        master = next(p for p in pods if p["metadata"]["name"] == "rt-master-0")
        job_driver.succeed_pod(namespace, master["metadata"]["name"])
        code, printed = ended(command)
        assert code == 0, printed
    finally:
        runtimes.delete(CLUSTER_RUNTIME_KIND, name)


def start(cluster: Any, namespace: str, verb: str, *args: str) -> subprocess.Popen[str]:
    """The command as a user runs it at a terminal: in the foreground, where
    Ctrl-C's SIGINT is not ignored. A shell starts a background job with SIGINT
    ignored, and make test's sessions are such jobs (dev/test-tiers.sh): the
    command would inherit that, and Python then never raises KeyboardInterrupt."""
    return subprocess.Popen(
        [str(TORCHFLEET), verb, "--kubeconfig", cluster.kubeconfig, "-n", namespace, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_foreground_signals,
    )


def _foreground_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ended(command: subprocess.Popen[str]) -> tuple[int, str]:
    """The command's exit status and all it printed, once it exits."""
    stdout, stderr = command.communicate(timeout=90)
    return command.returncode, stdout + stderr


def test_run_follows_the_job_to_success_and_exits_0(
    cluster: Any, shared_operator: Any, job_driver: Any, namespace: str, script: Path
) -> None:
    command = start(cluster, namespace, "run", str(script), "--name", "ok")
    [pod] = job_driver.wait_running_pods(namespace, "ok", 1)
    job_driver.succeed_pod(namespace, pod["metadata"]["name"])
    code, printed = ended(command)
    assert code == 0, printed
    assert "trainingjob.torchfleet.dev/ok created" in printed
    # The phases it saw before depend on when it looked (once a second): the
    # operator may write none before Succeeded on a loaded machine.
    assert re.search(r"^((Pending|Running) -> )?Succeeded$", printed, re.M), printed


def test_attach_exits_non_zero_with_the_failures_reason(
    cluster: Any, shared_operator: Any, job_driver: Any, namespace: str, script: Path
) -> None:
    torchfleet(cluster, namespace, "run", str(script), "--name", "bad", "--detach")
    job_driver.patch(namespace, "bad", {"spec": {"runPolicy": {"backoffLimit": 0}}})
    command = start(cluster, namespace, "attach", "bad")
    [pod] = job_driver.wait_running_pods(namespace, "bad", 1)
    job_driver.fail_pod(namespace, pod["metadata"]["name"], exit_code=3)
    code, printed = ended(command)
    assert code == 1, printed
    assert "Error: bad failed: BackoffLimitExceeded: pod bad-master-0" in printed
    assert "exit code 3" in printed


def test_ctrl_c_detaches_saying_how_to_attach_again_and_the_job_runs_on(
    cluster: Any, shared_operator: Any, job_driver: Any, namespace: str, script: Path
) -> None:
    command = start(cluster, namespace, "run", str(script), "--name", "held")
    # The command follows the job from the moment it exists; Running comes
    # seconds later (the pods scheduled and started), so Ctrl-C lands in there.
    job_driver.wait_phase(namespace, "held", "Running")
    command.send_signal(signal.SIGINT)
    code, printed = ended(command)
    assert code == 130, printed
    assert f"Detached; held keeps running. Re-attach: torchfleet attach held -n {namespace}" in (
        " ".join(printed.split())
    )
    assert job_driver.status(namespace, "held")["phase"] == "Running"


@pytest.mark.parametrize("ends_by", ["success", "ctrl-c"])
def test_run_rm_deletes_the_job_when_the_command_ends(
    ends_by: str, cluster: Any, shared_operator: Any, job_driver: Any, namespace: str, script: Path
) -> None:
    command = start(cluster, namespace, "run", str(script), "--name", "once", "--rm")
    if ends_by == "success":
        [pod] = job_driver.wait_running_pods(namespace, "once", 1)
        job_driver.succeed_pod(namespace, pod["metadata"]["name"])
    else:
        job_driver.wait_phase(namespace, "once", "Running")
        command.send_signal(signal.SIGINT)
    code, printed = ended(command)
    assert code == (0 if ends_by == "success" else 130), printed
    assert "trainingjob.torchfleet.dev/once deleted" in printed
    assert "Re-attach" not in printed
    wait_for("once deleted", lambda: job_driver.get(namespace, "once") is None)


def test_the_python_client_runs_waits_lists_and_deletes(
    cluster: Any, shared_operator: Any, job_driver: Any, namespace: str, script: Path
) -> None:
    from torchfleet_cli import Client, JobNotFound
    from torchfleet_operator.api import TrainingJobStatus

    client = Client(kubeconfig=cluster.kubeconfig, namespace=namespace)
    job = client.run(script, nodes=2, args=["--epochs", "1"], name="notebook")
    assert [j.name for j in client.list()] == ["notebook"]
    assert job_driver.get(namespace, "notebook")["spec"]["args"] == ["--epochs", "1"]
    pods = job_driver.wait_running_pods(namespace, "notebook", 2)
    # job.status: the CRD's own model, read afresh at each access.
    status = wait_for(
        "the client's status: Running on 2/2",
        lambda: (s := job.status).phase == "Running" and s.nodes_ready == "2/2" and s,
    )
    assert isinstance(status, TrainingJobStatus)
    with pytest.raises(TimeoutError, match="still"):
        job.wait(timeout=0.5, interval=0.1)
    master = next(p for p in pods if p["metadata"]["name"] == "notebook-master-0")
    job_driver.succeed_pod(namespace, master["metadata"]["name"])
    assert job.wait(timeout=60, interval=0.2) == "Succeeded"
    job.delete()
    wait_for("notebook deleted", lambda: job_driver.get(namespace, "notebook") is None)
    with pytest.raises(JobNotFound):
        client.get("notebook")
