"""values.yaml and values.schema.json: every key documented, typed and
checked, so a typo or a bad value fails `helm install` with the key's path."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from tests.fixtures.helm import CHART, CI_VALUES, RENDER_KUBE_VERSION, Helm

VALUES_TEXT = (CHART / "values.yaml").read_text()
VALUES = yaml.safe_load(VALUES_TEXT)
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w.-]*):")


def test_helm_lint_is_clean_for_defaults_and_every_ci_values_file(helm: Helm) -> None:
    for values in [None, *sorted(CI_VALUES.glob("*.yaml"))]:
        args = ["lint", "--strict", str(CHART), "--kube-version", RENDER_KUBE_VERSION]
        out = helm.run(*args, *(["--values", str(values)] if values else []), check=False)
        assert out.returncode == 0, f"{values}: {out.stdout}{out.stderr}"
        assert "[ERROR]" not in out.stdout and "[WARNING]" not in out.stdout, out.stdout


def undocumented_keys(text: str) -> list[str]:
    """Keys with no comment right above them. A documented key covers the keys
    nested under it (the children of `resources`), and a key that only groups
    other keys (its value is a nested mapping) needs no comment of its own."""
    lines = [line for line in text.splitlines() if line.strip()]
    missing: list[str] = []
    covered_below: int | None = None  # indent of the nearest documented ancestor
    for number, line in enumerate(lines):
        match = KEY_LINE.match(line)
        if not match:
            continue
        indent = len(match["indent"])
        if covered_below is not None and indent <= covered_below:
            covered_below = None
        if covered_below is not None:
            continue
        if number and lines[number - 1].lstrip().startswith("#"):
            covered_below = indent
        elif not _groups_keys(lines, number, indent):
            missing.append(match["key"])
    return missing


def _groups_keys(lines: list[str], number: int, indent: int) -> bool:
    if not lines[number].rstrip().endswith(":"):
        return False
    below = [line for line in lines[number + 1 :] if not line.lstrip().startswith("#")]
    child = KEY_LINE.match(below[0]) if below else None
    return child is not None and len(child["indent"]) > indent


def test_every_value_is_documented() -> None:
    assert undocumented_keys(VALUES_TEXT) == []


def test_the_documentation_check_finds_an_undocumented_key() -> None:
    text = "operator:\n  # -- Log level.\n  logLevel: info\n  shmSize: 1Gi\n"
    assert undocumented_keys(text) == ["shmSize"]


def schema_paths(schema: dict[str, Any], prefix: str = "") -> set[str]:
    paths = set()
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}{key}"
        paths.add(path)
        if sub.get("additionalProperties") is False:
            paths |= schema_paths(sub, f"{path}.")
    return paths


def value_paths(values: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> set[str]:
    """Paths of values.yaml down to where the schema stops being strict."""
    paths = set()
    for key, value in values.items():
        path = f"{prefix}{key}"
        paths.add(path)
        sub = schema.get("properties", {}).get(key, {})
        if isinstance(value, dict) and sub.get("additionalProperties") is False:
            paths |= value_paths(value, sub, f"{path}.")
    return paths


def test_schema_and_defaults_describe_the_same_keys() -> None:
    in_values = value_paths(VALUES, SCHEMA)
    in_schema = schema_paths(SCHEMA) - {"global"}
    assert in_values == in_schema, {
        "in values.yaml, not in the schema": sorted(in_values - in_schema),
        "in the schema, not in values.yaml": sorted(in_schema - in_values),
    }


def test_every_object_in_the_schema_rejects_unknown_keys() -> None:
    def loose(node: dict[str, Any], path: str) -> list[str]:
        found = []
        if "properties" in node and node.get("additionalProperties") is not False:
            found.append(path or "<root>")
        for key, sub in node.get("properties", {}).items():
            found += loose(sub, f"{path}.{key}".lstrip("."))
        return found

    assert loose(SCHEMA, "") == []


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("operatr", {"logLevel": "info"}, "additional properties 'operatr' not allowed"),
        ("operator.replica", 2, "additional properties 'replica' not allowed"),
        ("operator.replicas", 0, "at '/operator/replicas'"),
        ("metrics.serviceMonitor.enable", True, "additional properties 'enable' not allowed"),
        ("operator.logLevel", "verbose", "at '/operator/logLevel'"),
        ("operator.watchNamespaces", ["Team_A"], "at '/operator/watchNamespaces/0'"),
        ("operator.defaults.shmSize", "lots", "at '/operator/defaults/shmSize'"),
        ("operator.metricsPort", 70000, "at '/operator/metricsPort'"),
        ("operator.image.digest", "latest", "at '/operator/image/digest'"),
        ("rbac.podGroupAPIGroups", ["apps"], "at '/rbac/podGroupAPIGroups/0'"),
        (
            "metrics.prometheusRule.restartsWindow",
            "an hour",
            "at '/metrics/prometheusRule/restartsWindow'",
        ),
    ],
)
def test_bad_values_are_refused_naming_the_key(
    helm: Helm, key: str, value: Any, message: str
) -> None:
    out = helm.run(*helm.template_args(set_values={key: value}), check=False)
    assert out.returncode != 0
    assert "values don't meet the specifications of the schema" in out.stderr
    assert message in out.stderr, out.stderr
