"""Model code knows nothing of parallelism (TorchTitan's split): no module under
models/ imports torch.distributed or the trainer's distributed package, so DTensor
handling (meta-init materialisation, shard copies) lives in distributed/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import torchfleet_trainer.models

MODELS = Path(torchfleet_trainer.models.__file__).parent
FORBIDDEN = ("torch.distributed", "torchfleet_trainer.distributed")


def imported_modules(source: str) -> list[str]:
    """Every module an ``import`` or ``from ... import`` names, ``from torch import
    distributed`` spelled out as ``torch.distributed``."""
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            names.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def parallelism_imports(source: str) -> list[str]:
    return [
        name
        for name in imported_modules(source)
        if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN)
    ]


@pytest.mark.parametrize(
    "source",
    [
        "import torch.distributed as dist",
        "from torch.distributed.tensor import DTensor",
        "from torch import distributed",
        "def f():\n    from torchfleet_trainer.distributed.materialize import copy_my_shard",
    ],
)
def test_the_check_catches_each_spelling(source: str) -> None:
    assert parallelism_imports(source)


def test_no_model_module_imports_parallelism() -> None:
    modules = sorted(MODELS.rglob("*.py"))
    assert len(modules) >= 4  # __init__, common, gpt, llama: the walk found the package
    offenders = {
        str(path.relative_to(MODELS)): found
        for path in modules
        if (found := parallelism_imports(path.read_text()))
    }
    assert offenders == {}
