"""Which of the project's packages may import which, checked over every import.

What the operator and the trainer share (the pod contract, the trainer config
schema) lives in torchfleet_contract, below both: the operator and the trainer
import it and never each other, so neither reaches into the other's insides and
the operator's image needs no trainer code. The contract imports none of the
project's packages and nothing beyond the standard library, pydantic and
PyYAML (the operator and the CLI install no torch). The CLI is a client of the
API: it reads the operator's API models, never the trainer.

Every import statement counts, including those inside functions and under
``TYPE_CHECKING``. The layers inside each package are their own tests'
(tests/unit/operator/test_import_contract.py, tests/unit/trainer/test_layers.py).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {
    "torchfleet_contract": REPO / "contract/torchfleet_contract",
    "torchfleet_operator": REPO / "operator/torchfleet_operator",
    "torchfleet_trainer": REPO / "trainer_image/torchfleet_trainer",
    "torchfleet_cli": REPO / "client/torchfleet_cli",
}
# The project's packages each one may import, besides itself.
MAY_IMPORT = {
    "torchfleet_contract": set(),
    "torchfleet_operator": {"torchfleet_contract"},
    "torchfleet_trainer": {"torchfleet_contract"},
    "torchfleet_cli": {"torchfleet_operator", "torchfleet_contract"},
}
CONTRACT_THIRD_PARTY = {"pydantic", "yaml"}


def top_level_imports(path: Path) -> set[str]:
    """The top-level package of every absolute import in ``path``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def _sources() -> list[tuple[str, Path]]:
    return [
        (package, path) for package, root in PACKAGES.items() for path in sorted(root.rglob("*.py"))
    ]


def _id(source: tuple[str, Path]) -> str:
    return str(source[1].relative_to(REPO))


@pytest.mark.parametrize("source", _sources(), ids=_id)
def test_a_package_imports_only_the_packages_below_it(source: tuple[str, Path]) -> None:
    package, path = source
    reached = (top_level_imports(path) & PACKAGES.keys()) - {package} - MAY_IMPORT[package]
    assert not reached, f"{package} may not import {sorted(reached)} ({path.relative_to(REPO)})"


@pytest.mark.parametrize(
    "path", sorted(PACKAGES["torchfleet_contract"].rglob("*.py")), ids=lambda p: p.name
)
def test_the_contract_needs_only_pydantic_and_yaml(path: Path) -> None:
    outside = {
        name
        for name in top_level_imports(path)
        if name not in sys.stdlib_module_names
        and name not in CONTRACT_THIRD_PARTY
        and name != "torchfleet_contract"
    }
    assert not outside, f"{path.relative_to(REPO)} imports {sorted(outside)}"


def test_the_walk_sees_each_package_and_a_reach_across(tmp_path: Path) -> None:
    # A walk that found nothing, or read imports wrongly, would pass the checks above.
    assert all(any(root.rglob("*.py")) for root in PACKAGES.values())
    assert "torchfleet_contract" in top_level_imports(
        PACKAGES["torchfleet_operator"] / "desired/env.py"
    )
    assert "torchfleet_contract" in top_level_imports(PACKAGES["torchfleet_trainer"] / "train.py")
    reaching = tmp_path / "reaching.py"
    reaching.write_text("def f():\n    from torchfleet_trainer.train import run\n")
    assert top_level_imports(reaching) == {"torchfleet_trainer"}
