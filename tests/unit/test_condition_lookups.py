"""Every test looks a condition up by type through the one shared helper.

The helper is the operator's own ``torchfleet_operator.status.conditions``
(``find`` for the condition, ``is_true`` for "present and True"), which works
on any Kubernetes-style ``conditions`` list: a job's, a Workload's, a pod's, a
node's. A hand-written scan (``next(c for c in ...["conditions"] if
c["type"] == ...)``, a loop, a ``{c["type"]: c ...}`` table) is a second,
slightly different answer to the same question (a missing list, a missing
type, a default of ``{}`` or ``None``), so this test fails on one anywhere
under tests/, naming the file and line.

A scan counts when it iterates over something named like conditions (the
``"conditions"`` key, or a name or attribute containing ``condition``) and
compares its item's ``"type"`` or keys a dict by it. Listing the types
(``[c["type"] for c in conditions]``) or reading one position is not a lookup.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


def _mentions_conditions(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and sub.value == "conditions":
            return True
        if isinstance(sub, ast.Name) and "condition" in sub.id.lower():
            return True
        if isinstance(sub, ast.Attribute) and "condition" in sub.attr.lower():
            return True
    return False


def _is_type_of(node: ast.AST, item: str) -> bool:
    """``item["type"]`` or ``item.get("type")``."""
    if isinstance(node, ast.Subscript):
        return (
            isinstance(node.value, ast.Name)
            and node.value.id == item
            and isinstance(node.slice, ast.Constant)
            and node.slice.value == "type"
        )
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return (
            node.func.attr == "get"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == item
            and bool(node.args)
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == "type"
        )
    return False


def _compares_type(nodes: list[ast.AST], item: str) -> bool:
    for node in nodes:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Compare) and any(
                _is_type_of(side, item) for side in (sub.left, *sub.comparators)
            ):
                return True
    return False


def _scans(tree: ast.AST) -> Iterator[int]:
    """Lines of hand-written condition lookups by type."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            parts: list[ast.AST] = (
                [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            )
            for gen in node.generators:
                if not (isinstance(gen.target, ast.Name) and _mentions_conditions(gen.iter)):
                    continue
                item = gen.target.id
                keyed = isinstance(node, ast.DictComp) and _is_type_of(node.key, item)
                if keyed or _compares_type([*parts, *gen.ifs], item):
                    yield node.lineno
        elif (
            isinstance(node, ast.For | ast.AsyncFor)
            and isinstance(node.target, ast.Name)
            and _mentions_conditions(node.iter)
            and _compares_type(list(node.body), node.target.id)
        ):
            yield node.lineno


def hand_written_lookups(source: str) -> list[int]:
    return sorted(set(_scans(ast.parse(source))))


def test_no_test_looks_a_condition_up_by_hand() -> None:
    found = [
        f"{path.relative_to(TESTS.parent)}:{line}"
        for path in sorted(TESTS.rglob("*.py"))
        for line in hand_written_lookups(path.read_text())
    ]
    assert not found, (
        "look conditions up with torchfleet_operator.status.conditions.find / is_true: "
        + ", ".join(found)
    )


@pytest.mark.parametrize(
    "source",
    [
        'x = next(c for c in status["conditions"] if c["type"] == "Failed")',
        'x = next((c for c in conditions if c.get("type") == t), None)',
        'ok = any(c["type"] == "Ready" and c["status"] == "True" for c in node_conditions)',
        'by_type = {c["type"]: c for c in body["status"]["conditions"]}',
        "for c in job.get('conditions', []):\n    if c['type'] == 'X':\n        pass",
    ],
)
def test_the_scan_finds_each_shape_of_hand_written_lookup(source: str) -> None:
    assert hand_written_lookups(source) == [1]


@pytest.mark.parametrize(
    "source",
    [
        'types = [c["type"] for c in status["conditions"]]',
        'first = patch["status"]["conditions"][0]["type"] == "Finished"',
        'kinds = [e for e in events if e["type"] == "ERROR"]',
        'x = find(status.get("conditions"), "Failed")',
    ],
)
def test_the_scan_leaves_other_code_alone(source: str) -> None:
    assert hand_written_lookups(source) == []
