"""The images' install steps: the operator image gets a working
``torchfleet-operator`` and no torch; the trainer image a working
``torchfleet-train`` on top of the PyTorch base's torch.

The operator image is built for real where the builder runs
(dev/realnode/operator-image.sh: buildah on a Debian-made Python base, as root,
cached) and checked inside the built image (``buildah run``, as its USER).
Where it cannot run, and for the trainer image (its PyTorch base is not built
here), the Dockerfiles' install steps are replayed in clean virtual
environments instead (no Docker engine here); the operator's replay runs only
as that fallback, and says so.

pip's cache under $HOME is reused (what is installed is hash-checked all the
same), so a warm run takes well under a minute; a cold one downloads about
60 MB for the operator and the trainer's numpy.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.images.replay import Replay, base_images, host_environment, replay

REPO = Path(__file__).resolve().parents[2]
OPERATOR_DOCKERFILE = REPO / "Dockerfile"
TRAINER_DOCKERFILE = REPO / "trainer_image/Dockerfile"

OPERATOR_IMAGE_BUILDER = REPO / "dev/realnode/operator-image.sh"

VENV_SEEDS = {"pip", "setuptools"}


def operator_builder_runs() -> bool:
    """root, mmdebstrap and buildah (``operator-image.sh --check``)."""
    return subprocess.run([OPERATOR_IMAGE_BUILDER, "--check"]).returncode == 0


BUILDER_RUNS = operator_builder_runs()

pytestmark = pytest.mark.timeout(420)


def locked_names(lock: Path) -> set[str]:
    names: set[str] = set()
    for line in lock.read_text().splitlines():
        if line and not line[0].isspace() and not line.startswith("#") and "==" in line:
            names.add(canonicalize_name(line.split("==")[0]))
    return names


@pytest.fixture(scope="module")
def python_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Stands in for the slim Python image: this interpreter's base Python,
    alone on PATH (its bin folder also holds unrelated tools)."""
    bin_dir = tmp_path_factory.mktemp("python-image") / "bin"
    bin_dir.mkdir()
    base = Path(sys.base_prefix) / "bin"
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for link in ("python", "python3", version):
        (bin_dir / link).symlink_to(base / version)
    (bin_dir / "pip").symlink_to(base / "pip3")
    return bin_dir


def dependency_closure(name: str) -> list[importlib.metadata.Distribution]:
    """A distribution and everything it requires (extras included, as in
    torch's ``cuda-toolkit[cudart,...]``), as installed in this venv."""
    found: dict[str, importlib.metadata.Distribution] = {}
    seen: set[tuple[str, str]] = set()
    todo: list[tuple[str, str]] = [(name, "")]
    while todo:
        key, extra = todo.pop()
        key = canonicalize_name(key)
        if (key, extra) in seen:
            continue
        seen.add((key, extra))
        dist = found.setdefault(key, importlib.metadata.distribution(key))
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": extra}):
                todo += [(requirement.name, e) for e in ("", *requirement.extras)]
    return list(found.values())


@pytest.fixture(scope="module")
def pytorch_image(tmp_path_factory: pytest.TempPathFactory, python_image: Path) -> Path:
    """Stands in for the official PyTorch image: a fresh venv that already has
    torch and torch's own dependencies, and nothing else.

    Installing the CUDA torch wheel again would cost gigabytes and minutes, so
    torch and its dependency closure are linked in from this test run's venv
    through a .pth file (a --system-site-packages venv would instead expose the
    base interpreter's packages, which hold no torch). Packages outside the
    venv's own prefix are never uninstalled or changed by pip."""
    root = tmp_path_factory.mktemp("pytorch-image")
    subprocess.run([python_image / "python", "-m", "venv", root / "venv"], check=True)
    # The venv's seed setuptools (3.11 only) is older than torch requires; in
    # the image the one torch's dependencies bring is the one there is.
    pip: list[str | Path] = [root / "venv/bin/python", "-m", "pip", "--disable-pip-version-check"]
    subprocess.run([*pip, "uninstall", "--yes", "--quiet", "setuptools"], check=True)
    provided = root / "site"
    provided.mkdir()
    for dist in dependency_closure("torch"):
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] != ".."}:
            link = provided / top
            if not link.exists():
                link.symlink_to(Path(str(dist.locate_file(top))))
    site_packages = next((root / "venv/lib").glob("python3*/site-packages"))
    (site_packages / "pytorch_image.pth").write_text(f"{provided}\n")
    return root / "venv/bin"


def run(replayed: Replay, *command: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in command],
        env=replayed.stage.env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def installed(replayed: Replay, python: Path) -> set[str]:
    out = run(replayed, python, "-m", "pip", "list", "--format=json")
    assert out.returncode == 0, out.stderr
    return {canonicalize_name(p["name"]) for p in json.loads(out.stdout)}


def in_built_image(*command: str) -> subprocess.CompletedProcess[str]:
    """``command`` run in the operator image built from its Dockerfile (built
    first if the cache lacks it: minutes cold, a hash warm)."""
    return subprocess.run(
        [OPERATOR_IMAGE_BUILDER, "--run", *command], capture_output=True, text=True, timeout=1200
    )


@pytest.mark.skipif(
    not BUILDER_RUNS,
    reason="the image builder cannot run here (needs root, mmdebstrap, buildah): "
    "the operator Dockerfile's install steps are replayed instead",
)
@pytest.mark.timeout(1500)
def test_built_operator_image_runs_the_operator_as_its_user_and_holds_no_torch() -> None:
    # One container for the three checks (vfs copies the image for each).
    out = in_built_image(
        "sh",
        "-c",
        "torchfleet-operator --help && echo @@ && id -u && id -g && echo @@"
        " && python -m pip list --format=json",
    )
    assert out.returncode == 0, out.stderr[-4000:]
    help_text, ids, listed = out.stdout.split("@@\n")
    assert help_text.startswith("usage: torchfleet-operator")
    # The Dockerfile's USER, as the chart's runAsUser/runAsGroup expect.
    assert ids.split() == ["65532", "65532"], ids

    packages = {canonicalize_name(p["name"]) for p in json.loads(listed)}
    assert "torch" not in packages
    assert {"kopf", "kubernetes", "prometheus-client", "torchfleet"} <= packages
    # Nothing beyond the lock got in, but the package and what `python -m venv`
    # seeds (pip; setuptools too on Python 3.11).
    unlocked = packages - locked_names(REPO / "requirements/operator.txt")
    assert unlocked - VENV_SEEDS == {"torchfleet"}


@pytest.mark.skipif(
    BUILDER_RUNS,
    reason="the image builder runs here: the built operator image is checked instead",
)
def test_operator_image_runs_the_operator_and_holds_no_torch(
    tmp_path: Path, python_image: Path
) -> None:
    warnings.warn(
        "the image builder cannot run here (dev/realnode/operator-image.sh --check): "
        "the operator Dockerfile's install steps are replayed in a venv instead of built",
        stacklevel=1,
    )
    (base,) = set(base_images(OPERATOR_DOCKERFILE))
    replayed = replay(OPERATOR_DOCKERFILE, REPO, tmp_path, {base: python_image}, host_environment())

    help_text = run(replayed, replayed.entrypoint_executable(), "--help")
    assert help_text.returncode == 0, help_text.stderr
    assert help_text.stdout.startswith("usage: torchfleet-operator")

    python = replayed.host_path("/opt/torchfleet/bin/python")
    packages = installed(replayed, python)
    assert "torch" not in packages
    assert {"kopf", "kubernetes", "prometheus-client", "torchfleet"} <= packages
    # Nothing beyond the lock got in, but the package and what `python -m venv`
    # seeds (pip; setuptools too on Python 3.11).
    unlocked = packages - locked_names(REPO / "requirements/operator.txt")
    assert unlocked - VENV_SEEDS == {"torchfleet"}

    assert replayed.stage.user == "65532:65532"
    assert [s.split()[0] for s in replayed.stage.skipped] == ["groupadd"]


def test_trainer_image_runs_the_trainer_on_the_base_images_torch(
    tmp_path: Path, python_image: Path, pytorch_image: Path
) -> None:
    bases = base_images(TRAINER_DOCKERFILE)
    pytorch_base = next(b for b in bases if b.startswith("pytorch/pytorch:"))
    python_base = next(b for b in bases if b.startswith("python:"))
    replayed = replay(
        TRAINER_DOCKERFILE,
        REPO,
        tmp_path,
        {python_base: python_image, pytorch_base: pytorch_image},
        host_environment(),
    )

    help_text = run(replayed, replayed.entrypoint_executable(), "--help")
    assert help_text.returncode == 0, help_text.stderr
    assert help_text.stdout.startswith("usage: torchfleet-train")

    # The runtime's real imports resolve: the base's torch, the lock's numpy.
    python = pytorch_image / "python"
    imports = run(replayed, python, "-c", "import numpy, torch, torchfleet_trainer.train")
    assert imports.returncode == 0, imports.stderr

    # The base image's torch was kept, not downloaded a second time.
    torch_at = run(replayed, python, "-c", "import torch; print(torch.__file__)")
    assert torch_at.stdout.startswith(str(pytorch_image.parent.parent / "site")), torch_at.stdout
    assert replayed.stage.user == "1000"
