"""A user's install of the command: ``pip install 'torchfleet[cli]'`` into a
fresh virtual environment (the base interpreter's, nothing of this run's venv)
gives a working ``torchfleet`` and ``kubectl-torchfleet``; neither the
trainer's dependencies (torch, numpy, TensorBoard) nor the operator's (kopf,
prometheus-client) are installed, and none of them is imported by the command.
Installed without the extra (``pip install torchfleet``), the scripts say what
to install instead of a traceback.

The install reaches the package index as a user's would (pip's cache under
$HOME is reused); the test is skipped, saying so, only where no index answers.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BASE_PYTHON = (
    Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
)
# Distributions the command must not bring, and modules it must not import
# (aiohttp is installed, the Kubernetes client needs it, but not imported).
NOT_INSTALLED = ("torch", "numpy", "tensorboard", "kopf", "prometheus-client")
NOT_IMPORTED = ("torch", "numpy", "tensorboard", "kopf", "prometheus_client", "aiohttp")

pytestmark = pytest.mark.timeout(420)


def _pip(venv: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _installed(tmp_path_factory: pytest.TempPathFactory, what: str) -> Path:
    """A fresh virtual environment with ``pip install <what>``."""
    venv = tmp_path_factory.mktemp("user") / "venv"
    subprocess.run([str(BASE_PYTHON), "-m", "venv", str(venv)], check=True)
    probe = _pip(
        venv, "download", "--no-deps", "--dest", str(venv.parent / "probe"), "click", timeout=120
    )
    if probe.returncode != 0:
        pytest.skip(f"no package index answers here (pip download click: {probe.stderr[-300:]})")
    installed = _pip(venv, "install", "--quiet", what)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return venv


@pytest.fixture(scope="module")
def user_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _installed(tmp_path_factory, f"{REPO}[cli]")


def test_one_install_gives_the_command_and_the_kubectl_plugin(user_venv: Path) -> None:
    for script in ("torchfleet", "kubectl-torchfleet"):
        out = subprocess.run(
            [str(user_venv / "bin" / script), "--help"], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        assert "run" in out.stdout and "attach" in out.stdout and "logs" in out.stdout


def test_no_torch_and_no_operator_dependency_is_installed_or_imported(user_venv: Path) -> None:
    listed = _pip(user_venv, "list", "--format=freeze").stdout.lower()
    names = {line.split("==")[0] for line in listed.splitlines()}
    assert not names & set(NOT_INSTALLED), sorted(names)
    code = (
        "import sys, torchfleet_cli.cli, torchfleet_cli.client; "
        f"print(sorted(set({NOT_IMPORTED!r}) & set(sys.modules)))"
    )
    out = subprocess.run(
        [str(user_venv / "bin/python"), "-c", code], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_without_its_extra_the_command_says_what_to_install(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    bare = _installed(tmp_path_factory, str(REPO))
    for script in ("torchfleet", "kubectl-torchfleet"):
        out = subprocess.run(
            [str(bare / "bin" / script), "ls"], capture_output=True, text=True, timeout=60
        )
        assert (out.returncode, out.stdout) == (1, ""), out.stderr
        assert out.stderr.strip() == (
            "torchfleet: the command needs click, which its extra installs: "
            "pip install 'torchfleet[cli]'"
        )
