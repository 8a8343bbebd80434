"""The operator's layering, checked over every import of the package.

The pure layer (api/ desired/ policy/ status/, observed.py, planning.py,
reconcile.py, config.py) takes plain data and returns plain data: it imports
no Kubernetes client, no kopf, no HTTP client and none of the modules that
talk to the cluster. And no module imports, however indirectly, one that
imports it back: each name has one home and the layers have one direction.

The layers are ordered, lowest first: api (with config, the settings) <
desired (what the operator wants to exist) < observed (what it saw) < status <
planning < policy < reconcile < the shell. A module imports its own layer or
one below it, never one above: a name two layers share lives in the lower.

Every import statement counts, including those inside functions and under
``TYPE_CHECKING``: a cycle hidden there is still a cycle for the reader.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import torchfleet_operator
from tests.import_graph import ImportGraph, Layers, imports, layer_of

PACKAGE = "torchfleet_operator"
ROOT = Path(torchfleet_operator.__file__).parent
PURE = ("api", "desired", "policy", "status", "observed", "planning", "reconcile", "config")
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
LAYERS: Layers = (
    ("api", ("", "api", "config")),
    ("desired", ("desired",)),
    ("observed", ("observed",)),
    ("status", ("status",)),
    ("planning", ("planning",)),
    ("policy", ("policy",)),
    ("reconcile", ("reconcile",)),
    ("shell", SHELL),
)


_GRAPH = ImportGraph.of(ROOT)
MODULES = _GRAPH.modules
GRAPH = _GRAPH.edges


def _imports(path: Path) -> set[str]:
    return imports(ROOT, path, MODULES)


def _layer(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def _pure(module: str) -> bool:
    return _layer(module) in PURE


def _layer_of(module: str) -> tuple[int, str]:
    return layer_of(module, LAYERS)


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
    upward = _GRAPH.upward_imports(module, LAYERS)
    assert not upward, "an import goes up the layers: " + "; ".join(upward)


def test_the_layer_order_catches_an_upward_import() -> None:
    # The check above passes vacuously if the order were read backwards.
    assert (
        _layer_of("torchfleet_operator.api.v1alpha1")[0]
        < _layer_of("torchfleet_operator.policy.failure")[0]
    )
    assert _layer_of("torchfleet_operator.reconcile")[0] < _layer_of("torchfleet_operator.kube")[0]
    assert "torchfleet_operator.api.reasons" in GRAPH["torchfleet_operator.policy.failure"]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_itself_back(module: str) -> None:
    cycle = _GRAPH.cycle_through(module)
    assert cycle is None, " -> ".join(cycle or ())
