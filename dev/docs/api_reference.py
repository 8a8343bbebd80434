"""The docs site's API reference, generated at build time from the pydantic models
(operator/torchfleet_operator/api/v1alpha1.py), the one source of the CRD.

mkdocs-gen-files runs this file on every `make docs` and writes
``reference/api.md`` into the site (never into the repository), so the page
cannot drift from the models. Every object the TrainingJob reaches, spec and
status, gets a table of its fields: JSON name, type (with its bounds), default
and description, followed by the cross-field rules the API server checks; then
the two runtime kinds (api/runtime.py), with the objects of theirs the
TrainingJob does not hold (the rest are the job's own, shown once).

It also places ``benchmarks/RESULTS.md`` in the site as ``benchmarks.md``, so
the pages can link to the measurements without a copy of them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torchfleet_operator.api.runtime import ClusterTrainingRuntime, TrainingRuntime
from torchfleet_operator.api.v1alpha1 import TrainingJob

REPO = Path(__file__).resolve().parents[2]
API_PAGE = "reference/api.md"
BENCHMARKS_PAGE = "benchmarks.md"
MODELS_FILE = "operator/torchfleet_operator/api/v1alpha1.py"
RUNTIME_MODELS_FILE = "operator/torchfleet_operator/api/runtime.py"
# Kubernetes' own metadata (a job's, a runtime's): only the fields the models
# describe are shown.
METADATA = ("ObjectMeta", "RuntimeMeta")
# spec.trainer is applied by the trainer image, not stored by the API server
# (crdgen moves its defaults into the descriptions).
TRAINER_CONFIG = "TrainConfig"


def _ref_name(node: dict[str, Any]) -> str | None:
    ref = node.get("$ref")
    return ref.rsplit("/", 1)[-1] if ref else None


def _anchor(name: str) -> str:
    return name.lower()


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell: a pipe is escaped outside code
    spans (inside one, Python-Markdown's tables already keep it, and an escape
    would show)."""
    parts = text.replace("\n", " ").split("`")
    return "`".join(part if i % 2 else part.replace("|", "\\|") for i, part in enumerate(parts))


def _code(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return f"`{text}`"


def _non_null(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [option for option in node.get("anyOf", []) if option.get("type") != "null"]


def _bounds(node: dict[str, Any]) -> list[str]:
    """The node's numeric, length and pattern limits, in words."""
    words = []
    low, high = node.get("minimum"), node.get("maximum")
    if "exclusiveMinimum" in node:
        words.append(f"> {node['exclusiveMinimum']}")
    elif low is not None:
        words.append(f">= {low}")
    if "exclusiveMaximum" in node:
        words.append(f"< {node['exclusiveMaximum']}")
    elif high is not None:
        words.append(f"<= {high}")
    for key, word in (
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minItems", "min items"),
        ("maxItems", "max items"),
        ("maxProperties", "max entries"),
    ):
        if key in node:
            words.append(f"{word} {node[key]}")
    if "pattern" in node:
        words.append(f"pattern {_code(node['pattern'])}")
    if node.get("x-kubernetes-list-type") == "set":
        words.append("unique items")
    if node.get("x-kubernetes-list-type") == "map":
        keys = ", ".join(node.get("x-kubernetes-list-map-keys", []))
        words.append(f"one item per {keys}")
    return words


def type_of(node: dict[str, Any]) -> str:
    """A field's type as a reader says it, nested objects linked to their section."""
    name = _ref_name(node)
    if name:
        return f"[{name}](#{_anchor(name)})"
    if node.get("x-kubernetes-int-or-string"):
        return "integer or string"
    options = _non_null(node)
    if options:
        return " or ".join(type_of(option) for option in options)
    if "const" in node:
        return _code(node["const"])
    if "enum" in node:
        return "one of " + ", ".join(_code(value) for value in node["enum"])
    kind = node.get("type", "object")
    if kind == "array":
        return f"array of {type_of(node.get('items', {}))}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map of string to {type_of(node['additionalProperties'])}"
    if kind == "string" and "format" in node:
        return f"string ({node['format']})"
    return str(kind)


def _constraints(node: dict[str, Any]) -> list[str]:
    """Bounds of the field and of what it holds (an optional's value, a list's items)."""
    words = _bounds(node)
    for option in _non_null(node):
        words += _bounds(option)
        if option.get("type") == "array" and isinstance(option.get("items"), dict):
            words += [f"each {word}" for word in _bounds(option["items"])]
    if node.get("type") == "array" and isinstance(node.get("items"), dict):
        words += [f"each {word}" for word in _bounds(node["items"])]
    return words


def _default(node: dict[str, Any], required: bool) -> str:
    if required:
        return "required"
    if node.get("default", {}) == {} and _ref_name(node):
        # An object always present (`{}`, or built by a default factory): its own
        # fields' defaults apply.
        return "its fields' defaults"
    if "default" not in node or node["default"] is None:
        return "unset"
    return _code(node["default"])


def _description(node: dict[str, Any], defs: dict[str, Any]) -> str:
    """The field's own description, else that of the object it holds."""
    if node.get("description"):
        return str(node["description"])
    for candidate in [node, *_non_null(node)]:
        name = _ref_name(candidate)
        if name and defs[name].get("description"):
            return str(defs[name]["description"])
    return ""


def _children(node: dict[str, Any]) -> list[str]:
    """Names of the objects a field holds, directly or in a list or map."""
    found = []
    stack = [node]
    while stack:
        current = stack.pop()
        name = _ref_name(current)
        if name:
            found.append(name)
            continue
        stack += current.get("anyOf", [])
        for key in ("items", "additionalProperties"):
            if isinstance(current.get(key), dict):
                stack.append(current[key])
    return found


def reachable(schema: dict[str, Any], root: str = "TrainingJob") -> list[tuple[str, list[str]]]:
    """Every object the kind ``root`` holds, depth first in field order (so
    spec's objects come before status's, each next to its parent), with every
    path where it appears."""
    order: list[str] = []
    paths: dict[str, list[str]] = {root: []}

    def visit(name: str, model: dict[str, Any], path: str, inside: tuple[str, ...]) -> None:
        if name not in order:
            order.append(name)
        for field, node in model.get("properties", {}).items():
            child_path = f"{path}.{field}" if path else field
            for child in _children(node):
                paths.setdefault(child, []).append(child_path)
                if child not in inside:  # a model that holds itself: its paths once
                    visit(child, schema["$defs"][child], child_path, (*inside, child))

    visit(root, schema, "", (root,))
    return [(name, paths[name]) for name in order]


def _field_rows(model: dict[str, Any], defs: dict[str, Any], only_described: bool) -> list[str]:
    required = set(model.get("required", []))
    rows = []
    for field, node in model.get("properties", {}).items():
        description = _description(node, defs)
        if only_described and not description:
            continue
        kind = type_of(node)
        limits = _constraints(node)
        if limits:
            kind += " (" + "; ".join(limits) + ")"
        cells = (_code(field), kind, _default(node, field in required), description)
        rows.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return rows


def _rules(model: dict[str, Any]) -> list[str]:
    messages = []
    for rule in model.get("x-kubernetes-validations", []):
        if rule["message"] not in messages:
            messages.append(rule["message"])
    return messages


def _section(name: str, paths: list[str], model: dict[str, Any], defs: dict[str, Any]) -> list[str]:
    lines = [f"## {name}", ""]
    if paths:
        lines += ["At " + ", ".join(f"`{path}`" for path in paths) + ".", ""]
    if model.get("description"):
        lines += [str(model["description"]), ""]
    if name == TRAINER_CONFIG:
        lines += [
            "The built-in trainer applies these defaults itself: the API server "
            "stores only what the job's author wrote (the CRD states each default "
            "in the field's description).",
            "",
        ]
    if name in METADATA:
        lines += ["Kubernetes' standard metadata; the field the CRD constrains:", ""]
    rows = _field_rows(model, defs, only_described=name in METADATA)
    if rows:
        lines += ["| field | type | default | description |", "|---|---|---|---|", *rows, ""]
    rules = _rules(model)
    if rules:
        lines += ["Checked by the API server at `kubectl apply` (and by the models):", ""]
        lines += [f"- {message}" for message in rules]
        lines.append("")
    return lines


def render() -> str:
    """The API reference page, from the models."""
    lines = [
        "# API reference: `torchfleet.dev/v1alpha1`",
        "",
        f"Generated at build time from the pydantic models in `{MODELS_FILE}` and "
        f"`{RUNTIME_MODELS_FILE}`, which are also the only source of the CRDs "
        "(`make crds`). `kubectl explain trainingjob.spec` shows the same "
        "descriptions. Types are the JSON ones; *unset* means the field is absent "
        "unless you set it. The TrainingJob first, then TrainingRuntime and "
        "ClusterTrainingRuntime, which reuse the job's objects.",
        "",
    ]
    shown: set[str] = set()
    for kind in (TrainingJob, TrainingRuntime, ClusterTrainingRuntime):
        schema = kind.model_json_schema(by_alias=True, mode="validation")
        defs = schema.get("$defs", {})
        for name, paths in reachable(schema, kind.__name__):
            if name not in shown:
                shown.add(name)
                model = schema if name == kind.__name__ else defs[name]
                lines += _section(name, paths, model, defs)
    return "\n".join(lines)


def write_pages() -> None:
    """Writes the generated pages into the mkdocs build (mkdocs-gen-files)."""
    import mkdocs_gen_files

    with mkdocs_gen_files.open(API_PAGE, "w") as page:
        page.write(render())
    mkdocs_gen_files.set_edit_path(API_PAGE, MODELS_FILE)
    with mkdocs_gen_files.open(BENCHMARKS_PAGE, "w") as page:
        page.write((REPO / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8"))


# mkdocs-gen-files runs this file with runpy (its pages exist only in the build);
# run as a script it prints the reference, and a test imports it for render().
if __name__ == "<run_path>":
    write_pages()
elif __name__ == "__main__":
    print(render())
