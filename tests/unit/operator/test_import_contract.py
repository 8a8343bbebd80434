"""The operator's layering, checked over every import of the package.

The pure layer (api/ build/ policy/ status/, observed.py, planning.py,
reconcile.py, config.py) takes plain data and returns plain data: it imports
no Kubernetes client, no kopf, no HTTP client and none of the modules that
talk to the cluster. And no module imports, however indirectly, one that
imports it back: each name has one home and the layers have one direction.

The layers are ordered, lowest first: api (with config, the settings) <
build (what the operator wants to exist) < observed (what it saw) < status <
planning < policy < reconcile < the shell. A module imports its own layer or
one below it, never one above: a name two layers share lives in the lower.

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
# The layers, lowest first; each top-level module or package of the operator is
# in exactly one (the package's own __init__, which imports nothing, is the root).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("api", ("", "api", "config")),
    ("build", ("build",)),
    ("observed", ("observed",)),
    ("status", ("status",)),
    ("planning", ("planning",)),
    ("policy", ("policy",)),
    ("reconcile", ("reconcile",)),
    ("shell", SHELL),
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


def _layer_of(module: str) -> tuple[int, str]:
    """The rank and name of the layer ``module`` belongs to."""
    for rank, (name, members) in enumerate(LAYERS):
        if _layer(module) in members:
            return rank, name
    raise AssertionError(f"{module} is in no layer: add {_layer(module)!r} to one of LAYERS")


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


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_a_layer_above_its_own(module: str) -> None:
    rank, layer = _layer_of(module)
    upward = [
        f"{module} (layer {layer}) imports {imported} (layer {above})"
        for imported in sorted(GRAPH[module])
        for imported_rank, above in [_layer_of(imported)]
        if imported_rank > rank
    ]
    assert not upward, "an import goes up the layers: " + "; ".join(upward)


def test_the_layer_order_catches_an_upward_import() -> None:
    # The check above passes vacuously if the order were read backwards.
    assert (
        _layer_of("torchfleet_operator.api.v1alpha1")[0]
        < _layer_of("torchfleet_operator.policy.failure")[0]
    )
    assert _layer_of("torchfleet_operator.reconcile")[0] < _layer_of("torchfleet_operator.kube")[0]
    assert "torchfleet_operator.api.reasons" in GRAPH["torchfleet_operator.policy.failure"]


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
