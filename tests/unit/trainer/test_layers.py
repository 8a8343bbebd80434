"""The trainer's layering, checked over every import of torchfleet_trainer.

Lowest first: the package's root < model code, free of parallelism
(models/) < parallelism (distributed/) < the training parts, one concern each (checkpoint, data,
metrics, schedule, ...) < the training loop (train) < the launcher (the
process tree around it: the launcher/ package, and main, the console script
that starts it). The pod contract and the config schema the operator shares
are torchfleet_contract's, below every layer here. A module imports its own
layer or one below, never one above; and no module imports, however
indirectly, one that imports it back: there is no known cycle to allow. (The
launcher and its workers once imported each other; what both need, the exit
codes and outcome reports, is launcher/outcomes.py's, below both.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

import torchfleet_trainer
from tests.import_graph import ImportGraph, Layers, layer_of

ROOT = Path(torchfleet_trainer.__file__).parent
GRAPH = ImportGraph.of(ROOT)
LAYERS: Layers = (
    ("root", ("",)),
    ("models", ("models",)),
    ("parallelism", ("distributed",)),
    (
        "training parts",
        (
            "checkpoint",
            "data",
            "health",
            "metrics",
            "preflight",
            "runtime",
            "schedule",
            "tensorboard",
            "termination",
            "timeouts",
        ),
    ),
    ("training loop", ("train",)),
    ("launcher", ("launcher", "main")),
)


def test_the_walk_sees_the_package() -> None:
    # A walk that found nothing would pass every check below.
    assert "torchfleet_trainer.train" in GRAPH.edges
    assert "torchfleet_trainer.checkpoint" in GRAPH.edges["torchfleet_trainer.train"]
    assert "torchfleet_trainer.train" in GRAPH.edges["torchfleet_trainer.launcher.forkserver"]
    assert "torchfleet_trainer.launcher.worker" in GRAPH.edges["torchfleet_trainer.launcher.launch"]
    assert (
        layer_of("torchfleet_trainer.models.gpt", LAYERS)[0]
        < layer_of("torchfleet_trainer.train", LAYERS)[0]
    )


@pytest.mark.parametrize("module", sorted(GRAPH.modules))
def test_no_module_imports_a_layer_above_its_own(module: str) -> None:
    upward = GRAPH.upward_imports(module, LAYERS)
    assert not upward, "an import goes up the layers: " + "; ".join(upward)


@pytest.mark.parametrize("module", sorted(GRAPH.modules))
def test_no_module_imports_itself_back(module: str) -> None:
    cycle = GRAPH.cycle_through(module)
    assert cycle is None, "an import cycle: " + " -> ".join(cycle or ())
