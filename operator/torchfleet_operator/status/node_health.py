"""The gang's node health from the master's Prometheus text: per node, its compute
seconds per step and straggler score, its preflight figures, and what the
trainer is doing now (its phase). Pure.

torchfleet-train's rank 0 exports these (names in the pod contract): one sample
per node of the gang, labelled with the node's rank and name. The text comes
from a pod, so it is untrusted like the progress figures (status/progress.py):
a sample with a value that is not a finite number >= 0, or a label that cannot
be a node name, is dropped, and at most one sample per node of the largest gang
is kept. What it yields (GangHealth) is an observation: observed.py holds it.
"""

from __future__ import annotations

import math
from typing import Any

from torchfleet_contract import pod as contract
from torchfleet_operator.api import constants as c
from torchfleet_operator.observed import GangHealth, NodeFigures

COMPUTE = contract.METRIC_NODE_COMPUTE_SECONDS
SCORE = contract.METRIC_NODE_STRAGGLER_SCORE
PREFLIGHT_RATIO = contract.METRIC_PREFLIGHT_MATMUL_RATIO
PREFLIGHT_PASSED = contract.METRIC_PREFLIGHT_NODE_PASSED
PHASE = contract.METRIC_PHASE
PHASE_STARTED = contract.METRIC_PHASE_STARTED
IN_PLACE_RESTARTS = contract.METRIC_IN_PLACE_RESTARTS
IN_PLACE_REASON = contract.METRIC_IN_PLACE_RESTART_REASON
PER_NODE = (COMPUTE, SCORE, PREFLIGHT_RATIO, PREFLIGHT_PASSED)
# The labelled families this module reads (the rest of a scrape is progress's).
WANTED = {*PER_NODE, PHASE, IN_PLACE_REASON}
MAX_NODES = c.MAX_WORKERS + 1
MAX_NODE_NAME = 253


def health_from_samples(
    samples: list[tuple[str, dict[str, str], float]],
    phase_started: float | None,
    step_seconds: float | None,
    restarts_in_gang: float | None = None,
) -> GangHealth | None:
    """The gang's health from the labelled samples of a scrape; None when it has none."""
    nodes: dict[str, dict[str, Any]] = {}
    phase = reason = None
    for name, labels, value in samples:
        if not math.isfinite(value) or value < 0:
            continue
        if name in (PHASE, IN_PLACE_REASON):
            label = labels.get(contract.LABEL_PHASE if name == PHASE else contract.LABEL_REASON)
            if value == 1 and label in (contract.PHASES + contract.RESTART_REASONS):
                phase, reason = (label, reason) if name == PHASE else (phase, label)
            continue
        node = labels.get(contract.LABEL_NODE, "")
        if not 0 < len(node) <= MAX_NODE_NAME:
            continue
        if node not in nodes and len(nodes) >= MAX_NODES:
            continue
        figures = nodes.setdefault(node, {"node": node})
        rank = labels.get(contract.LABEL_NODE_RANK, "")
        if rank.isdigit() and len(rank) < 7:
            figures["node_rank"] = int(rank)
        _set_figure(figures, name, value)
    restarts = _count(restarts_in_gang)
    if not nodes and phase is None and restarts is None:
        return None
    ordered = sorted(
        (NodeFigures(**f) for f in nodes.values()),
        key=lambda n: (n.node_rank is None, n.node_rank or 0, n.node),
    )
    return GangHealth(tuple(ordered), phase, phase_started, step_seconds, restarts, reason)


def _count(value: float | None) -> int | None:
    """A count from a gauge: a whole number within what a status holds, else none."""
    if value is None or not math.isfinite(value) or not 0 <= value <= 1_000_000:
        return None
    return int(value)


def _set_figure(figures: dict[str, Any], name: str, value: float) -> None:
    if name == COMPUTE:
        figures["compute_seconds"] = value
    elif name == SCORE:
        figures["straggler_score"] = value
    elif name == PREFLIGHT_RATIO:
        figures["preflight_ratio"] = value
    elif name == PREFLIGHT_PASSED:
        figures["preflight_passed"] = value >= 0.5
