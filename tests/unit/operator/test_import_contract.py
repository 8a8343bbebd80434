"""The operator's layering, checked over every import of the package.

The pure layer (api/ build/ policy/ status/, observed.py, planning.py,
reconcile.py, config.py) takes plain data and returns plain data: it imports
no Kubernetes client, no kopf, no HTTP client and none of the modules that
talk to the cluster. And no module imports, however indirectly, one that
imports it back: each name has one home and the layers have one direction.

Every import statement counts, including those inside functions and under
``TYPE_CHECKING``: a cycle hidden there is still a cycle for the reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import torchfleet_operator

PACKAGE = "torchfleet_operator"
ROOT = Path(torchfleet_operator.__file__).parent
PURE = ("api", "build", "policy", "status", "observed", "planning", "reconcile", "config")
# Third-party modules that reach the cluster or the network.
FORBIDDEN_THIRD_PARTY = ("kopf", "kubernetes", "aiohttp", "urllib3", "orjson")
# The operator's own modules that run the API calls, the loop and the process.
SHELL = (
    "controller",
    "handlers",
    "informer",
    "kube",
    "leader",
    "main",
    "metrics",
    "scraper",
    "workqueue",
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(path: Path) -> set[str]:
    """Every module an import statement of ``path`` names: ``from a import b``
    names ``a.b`` when that is a module of the package, else ``a``."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path.parent)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                module = f"{base}.{alias.name}"
                found.add(module if module in MODULES else base)
    return found


GRAPH = {
    name: {m for m in _imports(path) if m in MODULES and m != name}
    for name, path in MODULES.items()
}


def _layer(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def _pure(module: str) -> bool:
    return _layer(module) in PURE


def test_the_walk_sees_the_package() -> None:
    # A walk that found nothing would pass every check below.
    assert "torchfleet_operator.reconcile" in MODULES
    assert "torchfleet_operator.policy.failure" in GRAPH["torchfleet_operator.reconcile"]
    assert "torchfleet_operator.kube" in GRAPH["torchfleet_operator.controller"]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _pure(m)))
def test_the_pure_layer_imports_no_client_and_no_shell(module: str) -> None:
    imported = _imports(MODULES[module])
    clients = sorted(m for m in imported if m.split(".")[0] in FORBIDDEN_THIRD_PARTY)
    shell = sorted(m for m in imported if m.startswith(PACKAGE) and _layer(m) in SHELL)
    assert not clients, f"{module} imports {clients}"
    assert not shell, f"{module} imports {shell}"


def _cycle_through(start: str) -> list[str] | None:
    """A path start -> ... -> start over the import graph, or None."""
    stack = [(start, [start])]
    seen: set[str] = set()
    while stack:
        module, path = stack.pop()
        for imported in sorted(GRAPH[module]):
            if imported == start:
                return [*path, start]
            if imported not in seen:
                seen.add(imported)
                stack.append((imported, [*path, imported]))
    return None


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_itself_back(module: str) -> None:
    cycle = _cycle_through(module)
    assert cycle is None, " -> ".join(cycle or ())
