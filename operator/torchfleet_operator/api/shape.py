"""The spec as the cross-field rules read it (api/world.py, api/elastic.py).

A Protocol that the model (``v1alpha1.TrainingJobSpec``) satisfies, so that
the rule modules need not import the model that imports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from torchfleet_contract.trainer_config import TrainConfig


class ElasticBounds(Protocol):
    @property
    def min_nodes(self) -> int: ...

    @property
    def max_nodes(self) -> int: ...


class SpecShape(Protocol):
    @property
    def trainer(self) -> TrainConfig | None: ...

    @property
    def command(self) -> Sequence[str] | None: ...

    @property
    def args(self) -> Sequence[str] | None: ...

    @property
    def elastic(self) -> ElasticBounds | None: ...

    @property
    def nodes(self) -> int: ...

    @property
    def resolved_processes_per_node(self) -> int: ...

    @property
    def world_size(self) -> int: ...
