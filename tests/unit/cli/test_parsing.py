"""The command's argument parsing (click parses; nothing reaches a cluster),
and the refusals that come before anything is sent: a script past the
ConfigMap limit, a job name the API would refuse."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from torchfleet_cli import cli as command
from torchfleet_cli.manifest import DEFAULT_IMAGE
from torchfleet_cli.packing import CONFIGMAP_LIMIT_BYTES

# A kubeconfig for a server that is not there: a command that reached it would
# fail with a connection error, not with the refusals these tests expect.
NOWHERE = """
apiVersion: v1
kind: Config
clusters: [{name: nowhere, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: someone, user: {token: none}}]
contexts: [{name: nowhere, context: {cluster: nowhere, user: someone, namespace: team}}]
current-context: nowhere
"""


def parsed(verb: click.Command, *args: str) -> dict[str, Any]:
    with verb.make_context(verb.name, list(args)) as ctx:
        return dict(ctx.params)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return path


def test_run_takes_the_sizes_and_passes_what_follows_dashes_to_the_script(script: Path) -> None:
    params = parsed(
        command.run, str(script), "--nodes", "4", "--procs-per-node", "gpu", "--gpus", "8",
        "-n", "team", "--context", "prod", "--", "--lr", "0.1", "-v",
    )  # fmt: skip
    assert params["nodes"] == 4 and params["procs_per_node"] == "gpu" and params["gpus"] == 8
    assert params["args"] == ("--lr", "0.1", "-v")
    assert (params["namespace"], params["context"]) == ("team", "prod")
    assert (
        params["image"] is None and params["detach"] is False
    )  # the runtime's, else DEFAULT_IMAGE


def test_run_defaults_to_one_node_and_one_process(script: Path) -> None:
    params = parsed(command.run, str(script))
    assert (params["nodes"], params["procs_per_node"], params["args"]) == (1, 1, ())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "0"], "0 is not in the range x>=1"),
        (["--procs-per-node", "0"], "'0' is neither a positive integer nor 'gpu'"),
        (["--procs-per-node", "gpus"], "'gpus' is neither a positive integer nor 'gpu'"),
        # A script's own option needs `--` before it.
        (["--epochs", "3"], "No such option '--epochs'"),
    ],
)
def test_run_refuses_bad_arguments(script: Path, args: list[str], message: str) -> None:
    with pytest.raises(click.UsageError, match=re.escape(message)):
        parsed(command.run, str(script), *args)


def test_run_refuses_a_script_that_is_not_there(tmp_path: Path) -> None:
    with pytest.raises(click.UsageError, match="does not exist"):
        parsed(command.run, str(tmp_path / "missing.py"))


def test_kubeconfig_comes_from_the_environment_as_kubectls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KUBECONFIG", "/somewhere/config")
    assert parsed(command.list_jobs)["kubeconfig"] == "/somewhere/config"
    assert parsed(command.list_jobs, "--kubeconfig", "/other")["kubeconfig"] == "/other"


def test_listings_print_yaml_or_json_only() -> None:
    assert parsed(command.list_jobs, "-o", "json", "-A")["output"] == "json"
    with pytest.raises(click.UsageError, match=re.escape("'xml' is not one of 'yaml', 'json'")):
        parsed(command.list_jobs, "-o", "xml")


def test_logs_takes_a_rank_and_follow() -> None:
    params = parsed(command.logs, "job", "--rank", "3", "-f", "-n", "team")
    assert (params["job"], params["rank"], params["follow"]) == ("job", 3, True)


def test_a_script_past_the_configmap_limit_is_refused_before_the_cluster_is_asked(
    tmp_path: Path, script: Path
) -> None:
    (tmp_path / "kubeconfig").write_text(NOWHERE)
    script.write_bytes(b"#" * CONFIGMAP_LIMIT_BYTES)
    result = CliRunner().invoke(
        command.cli, ["run", str(script), "--kubeconfig", str(tmp_path / "kubeconfig")]
    )
    assert result.exit_code == 2, result.output
    assert "over the ConfigMap limit" in result.output
    assert "build the code into your image" in result.output


def test_a_name_the_api_would_refuse_is_refused_naming_the_field(
    tmp_path: Path, script: Path
) -> None:
    (tmp_path / "kubeconfig").write_text(NOWHERE)
    result = CliRunner().invoke(
        command.cli,
        ["run", str(script), "--name", "Bad_Name", "--kubeconfig", str(tmp_path / "kubeconfig")],
    )
    assert result.exit_code == 2, result.output
    assert "metadata.name" in result.output


def test_importing_the_command_and_client_imports_no_torch() -> None:
    code = (
        "import sys, torchfleet_cli, torchfleet_cli.cli\n"
        "torchfleet_cli.Client\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_namespace_is_the_contexts_as_kubectls(tmp_path: Path) -> None:
    from torchfleet_cli import Client

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        NOWHERE.replace(
            "contexts: [",
            "contexts: [{name: other, context: {cluster: nowhere, user: someone}}, ",
        )
    )
    assert Client(kubeconfig=str(kubeconfig)).namespace == "team"
    assert Client(kubeconfig=str(kubeconfig), context="other").namespace == "default"
    assert Client(kubeconfig=str(kubeconfig), namespace="mine").namespace == "mine"


def test_placement_flags_place_both_roles(script: Path) -> None:
    from torchfleet_cli.manifest import toleration, training_job
    from torchfleet_cli.packing import pack

    params = parsed(
        command.run, str(script), "--node-selector", "pool=a100", "--node-selector", "zone=b",
        "--toleration", "gpu=true:NoSchedule", "--toleration", "spot:NoExecute",
    )  # fmt: skip
    assert params["node_selector"] == ("pool=a100", "zone=b")
    tolerations = [toleration(text) for text in params["toleration"]]
    job = training_job(
        "placed", pack(script), nodes=2, node_selector={"pool": "a100"}, tolerations=tolerations
    )
    for role in ("master", "worker"):
        spec = job["spec"][role]["template"]["spec"]
        assert spec["nodeSelector"] == {"pool": "a100"}
        assert spec["tolerations"] == [
            {"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
            {"key": "spot", "operator": "Exists", "effect": "NoExecute"},
        ]


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--toleration", "gpu=true", "toleration 'gpu=true': want KEY=VALUE:EFFECT"),
        ("--toleration", "gpu:Never", "toleration 'gpu:Never': want KEY=VALUE:EFFECT"),
        ("--node-selector", "pool", "node selector 'pool': want KEY=VALUE"),
    ],
)
def test_bad_placement_is_refused_naming_the_flags_form(
    tmp_path: Path, script: Path, flag: str, value: str, message: str
) -> None:
    (tmp_path / "kubeconfig").write_text(NOWHERE)
    result = CliRunner().invoke(
        command.cli, ["run", str(script), flag, value, "--kubeconfig", str(tmp_path / "kubeconfig")]
    )
    assert result.exit_code == 2, result.output
    assert message in result.output


@pytest.mark.parametrize("verb", ["run", "attach"])
def test_following_shows_rank_0s_log_unless_told_another_rank_or_none(
    verb: str, script: Path
) -> None:
    first = str(script) if verb == "run" else "train"
    follows = getattr(command, verb)
    assert (parsed(follows, first)["rank"], parsed(follows, first)["no_logs"]) == (0, False)
    assert parsed(follows, first, "--rank", "2")["rank"] == 2
    assert parsed(follows, first, "--no-logs")["no_logs"] is True
    with pytest.raises(click.BadParameter):
        parsed(follows, first, "--rank", "-1")


def test_rm_with_detach_is_refused_before_the_cluster_is_asked(
    tmp_path: Path, script: Path
) -> None:
    (tmp_path / "kubeconfig").write_text(NOWHERE)
    config = ["--kubeconfig", str(tmp_path / "kubeconfig")]
    result = CliRunner().invoke(command.cli, ["run", str(script), "--rm", "--detach", *config])
    assert result.exit_code == 2, result.output
    assert "--rm deletes the job when the command ends: not with --detach" in result.output
    assert parsed(command.run, str(script))["remove"] is False


@pytest.mark.parametrize(
    ("value", "ref"),
    [
        ("gpu", {"kind": "ClusterTrainingRuntime", "name": "gpu"}),
        ("ClusterTrainingRuntime/gpu", {"kind": "ClusterTrainingRuntime", "name": "gpu"}),
        ("trainingruntime/team-gpu", {"kind": "TrainingRuntime", "name": "team-gpu"}),
        ("TrainingRuntime/team-gpu", {"kind": "TrainingRuntime", "name": "team-gpu"}),
    ],
)
def test_a_runtime_gives_the_image_unless_one_is_given(
    script: Path, value: str, ref: dict[str, str]
) -> None:
    from torchfleet_cli.manifest import runtime_ref, training_job
    from torchfleet_cli.packing import pack

    assert parsed(command.run, str(script), "--runtime", value)["runtime"] == value
    on_runtime = training_job("rt", pack(script), nodes=2, runtime=runtime_ref(value))
    assert on_runtime["spec"]["runtimeRef"] == ref
    assert "image" not in on_runtime["spec"]  # the runtime's
    assert on_runtime["spec"]["worker"]["replicas"] == 1
    own = training_job("rt", pack(script), image="mine:1", runtime=runtime_ref(value))
    assert own["spec"]["image"] == "mine:1"
    plain = training_job("plain", pack(script))
    assert plain["spec"]["image"] == DEFAULT_IMAGE and "runtimeRef" not in plain["spec"]


@pytest.mark.parametrize("value", ["Job/gpu", "trainingruntime/", "/gpu"])
def test_a_runtime_of_another_form_is_refused_naming_the_forms(
    tmp_path: Path, script: Path, value: str
) -> None:
    (tmp_path / "kubeconfig").write_text(NOWHERE)
    result = CliRunner().invoke(
        command.cli,
        ["run", str(script), "--runtime", value, "--kubeconfig", str(tmp_path / "kubeconfig")],
    )
    assert result.exit_code == 2, result.output
    assert f"runtime {value!r}: want NAME (a ClusterTrainingRuntime)" in result.output
