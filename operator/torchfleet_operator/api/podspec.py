"""The core/v1 PodSpec schema embedded in the CRD's role templates, and its Python mirror.

Source: the API server's own OpenAPI v3 document for core/v1 (served at
``/openapi/v3/api/v1``), as committed in the pinned Kubernetes release at
``api/openapi-spec/v3/api__v1_openapi.json`` of the ``k8s.io/kubernetes``
module. ``make pod-schema`` reads it from the Go module cache (offline once the
control plane is built) and writes the trimmed closure of PodSpec to
``podspec_schema.json`` beside this file (``crdgen --pod-schema-source``);
``make crds`` and the models read only that checked-in file.

Trimmed as Kubeflow's and JobSet's generated CRDs are: no descriptions (the CRD
stays far below the API server's size limit; ``kubectl explain pod.spec``
documents the fields), no patch-strategy or union hints, and no defaults on
required fields (the API server would fill them in before checking that they
are there) nor ``{}`` ones (a struct's zero value). Made structural
for a CRD when embedded: references inlined, Quantity and IntOrString as
``x-kubernetes-int-or-string`` (a Quantity with apimachinery's syntax as its
pattern, as controller-gen writes it), ObjectMeta (only in ephemeral volume
claim templates) as an open object; ``ephemeralContainers`` as an empty list
(the API server refuses them on pod creation).

What a schema cannot check (a mount naming a missing volume) the API server
checks when the operator dry-runs the first pod.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from torchfleet_contract import pod as contract

SCHEMA_FILE = Path(__file__).with_name("podspec_schema.json")
ROOT = "io.k8s.api.core.v1.PodSpec"
_QUANTITY_TYPE = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_INT_OR_STRING_TYPE = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
_OBJECT_META_TYPE = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_ENV_VAR_TYPE = "io.k8s.api.core.v1.EnvVar"
_OPAQUE = (_QUANTITY_TYPE, _INT_OR_STRING_TYPE, _OBJECT_META_TYPE)

# apimachinery's resource.Quantity syntax (sign allowed), as controller-gen writes it.
SIGNED_QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)

# Keywords kept from the source; any other one stops the refresh, so that a new
# Kubernetes release cannot slip an unreviewed keyword into the CRD.
_KEPT = {
    "type",
    "format",
    "properties",
    "items",
    "additionalProperties",
    "required",
    "enum",
    "allOf",
    "$ref",
    "default",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
}
_DROPPED = {
    "description",
    "x-kubernetes-patch-merge-key",
    "x-kubernetes-patch-strategy",
    "x-kubernetes-unions",
    "oneOf",  # only on Quantity and IntOrString, which are rewritten whole
}


class PodSchemaError(ValueError):
    """The source schema has something this trimmer does not understand."""


# ---- the pod contract's reserved env names ---------------------------------------------

RESERVED_ENV_NAMES = (
    contract.MASTER_ADDR,
    contract.MASTER_PORT,
    contract.NNODES,
    contract.NODE_RANK,
    contract.RANK,
    contract.WORLD_SIZE,
    contract.LOCAL_RANK,
)
RESERVED_ENV_MESSAGE = (
    "env may not set the pod contract's variables ("
    + ", ".join(f"{p}*" for p in contract.RESERVED_ENV_PREFIXES)
    + ", "
    + ", ".join(RESERVED_ENV_NAMES)
    + "): the operator sets them (the trainer's knobs, "
    + ", ".join(f"{p}*" for p in contract.USER_ENV_PREFIXES)
    + ", are yours to set)"
)


def is_reserved_env_name(name: str) -> bool:
    if name.startswith(contract.USER_ENV_PREFIXES):
        return False
    return name in RESERVED_ENV_NAMES or name.startswith(contract.RESERVED_ENV_PREFIXES)


def _reserved_env_rule() -> dict[str, str]:
    names = ", ".join(f"'{name}'" for name in RESERVED_ENV_NAMES)
    knobs = " || ".join(f"self.name.startsWith('{p}')" for p in contract.USER_ENV_PREFIXES)
    prefixes = " || ".join(f"self.name.startsWith('{p}')" for p in contract.RESERVED_ENV_PREFIXES)
    # in / startsWith cost a constant per item, whatever the list and string sizes
    # (the API server's budget has no room for the knobs' names in the list).
    return {
        "rule": f"{knobs} || !(self.name in [{names}] || {prefixes})",
        "message": RESERVED_ENV_MESSAGE,
        "fieldPath": ".name",
    }


# ---- refresh: the source document -> the checked-in trimmed closure --------------------


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _without_default(node: dict[str, Any]) -> dict[str, Any]:
    """A required field's default would fill the field in before the API server
    checks that it is there: a container without a name would pass."""
    return {k: v for k, v in node.items() if k != "default"}


def _trim_node(node: Any, wanted: set[str], path: str) -> Any:
    if not isinstance(node, dict):
        return node
    unknown = set(node) - _KEPT - _DROPPED
    if unknown:
        raise PodSchemaError(f"{path}: unknown keywords {sorted(unknown)}")
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED or (key == "default" and value == {}):
            continue  # {} is a struct's zero value: the same as absent
        if key == "$ref":
            wanted.add(_ref_name(value))
            out[key] = _ref_name(value)
        elif key == "properties":
            required = set(node.get("required", ()))
            out[key] = {
                name: _trim_node(
                    _without_default(child) if name in required else child,
                    wanted,
                    f"{path}.{name}",
                )
                for name, child in value.items()
            }
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _trim_node(value, wanted, f"{path}[]")
        elif key == "allOf":
            out[key] = [_trim_node(v, wanted, path) for v in value]
        else:
            out[key] = value
    return out


def trim(document: dict[str, Any], version: str) -> dict[str, Any]:
    """The closure of PodSpec in ``document`` (an OpenAPI v3 core/v1 document)."""
    schemas = document["components"]["schemas"]
    trimmed: dict[str, Any] = {}
    wanted, done = {ROOT}, set[str]()
    while wanted - done:
        name = min(wanted - done)
        done.add(name)
        if name in _OPAQUE:
            continue  # rewritten whole when embedded
        trimmed[name] = _trim_node(schemas[name], wanted, name)
    return {
        "source": "k8s.io/kubernetes api/openapi-spec/v3/api__v1_openapi.json",
        "kubernetesVersion": version,
        "root": ROOT,
        "schemas": dict(sorted(trimmed.items())),
    }


# ---- embed: the trimmed closure -> one structural schema --------------------------------


@functools.cache
def _trimmed() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMA_FILE.read_text())
    return loaded


def kubernetes_version() -> str:
    return str(_trimmed()["kubernetesVersion"])


def _opaque(name: str) -> dict[str, Any]:
    if name == _QUANTITY_TYPE:
        return {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": SIGNED_QUANTITY_PATTERN,
        }
    if name == _INT_OR_STRING_TYPE:
        return {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
        }
    return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def _inline(
    node: dict[str, Any], schemas: dict[str, Any], stack: tuple[str, ...]
) -> dict[str, Any]:
    if "$ref" in node or "allOf" in node:
        (ref,) = [node["$ref"]] if "$ref" in node else [part["$ref"] for part in node["allOf"]]
        if ref in stack:
            raise PodSchemaError(f"recursive type {ref}")
        siblings = {k: v for k, v in node.items() if k not in ("$ref", "allOf")}
        target = _opaque(ref) if ref in _OPAQUE else _inline(schemas[ref], schemas, (*stack, ref))
        if ref == _ENV_VAR_TYPE:
            target = {**target, "x-kubernetes-validations": [_reserved_env_rule()]}
        return {**target, **siblings}
    out = dict(node)
    if "properties" in node:
        out["properties"] = {k: _inline(v, schemas, stack) for k, v in node["properties"].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            out[key] = _inline(node[key], schemas, stack)
    _check_list_map_keys(out, stack)
    return out


def _check_list_map_keys(node: dict[str, Any], stack: tuple[str, ...]) -> None:
    """A structural list-map's keys must be required or defaulted."""
    if node.get("x-kubernetes-list-type") != "map":
        return
    item = node["items"]
    for key in node.get("x-kubernetes-list-map-keys", ()):
        if key not in item.get("required", ()) and "default" not in item["properties"][key]:
            raise PodSchemaError(f"{'/'.join(stack)}: list-map key {key} needs required or default")


@functools.cache
def _structural() -> dict[str, Any]:
    trimmed = _trimmed()
    schema = _inline({"$ref": trimmed["root"]}, trimmed["schemas"], ())
    # A template may leave out containers: the operator adds the trainer container.
    schema.pop("required", None)
    # The API server refuses ephemeral containers on pod creation ("cannot be set
    # on create"): a template's would fail every pod. Refused at apply instead,
    # naming the field, without the Container schema a third time (12 KB per role,
    # a tenth of the CRD).
    schema["properties"]["ephemeralContainers"] = NO_EPHEMERAL_CONTAINERS
    return schema


NO_EPHEMERAL_CONTAINERS: dict[str, Any] = {
    "type": "array",
    "maxItems": 0,
    "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
}


def structural_schema(description: str) -> dict[str, Any]:
    """PodSpec as one structural schema, ready for a CRD (a fresh copy)."""
    return {"description": description, **json.loads(json.dumps(_structural()))}


# ---- validate: the same schema in Python ------------------------------------------------


class PodSpecViolation(ValueError):
    """A template's pod spec breaks the schema; ``path`` is relative (``.containers[0]``)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path


_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


def _type_ok(value: Any, schema: dict[str, Any]) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, int | str) and not isinstance(value, bool)
    expected = schema.get("type")
    if expected is None:
        return True
    if expected in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES[expected])


def _check(value: Any, schema: dict[str, Any], path: str) -> None:
    if value is None:
        return  # the API server drops a null as an absent field
    if not _type_ok(value, schema):
        kind = "integer|string" if schema.get("x-kubernetes-int-or-string") else schema["type"]
        raise PodSpecViolation(path, f"must be of type {kind}")
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        raise PodSpecViolation(path, f"should match '{schema['pattern']}'")
    if "enum" in schema and value not in schema["enum"]:
        raise PodSpecViolation(path, f"must be one of {schema['enum']}")
    if isinstance(value, dict):
        _check_object(value, schema, path)
    elif isinstance(value, list):
        _check_list(value, schema, path)
    for rule in schema.get("x-kubernetes-validations", ()):
        if rule["rule"] == _reserved_env_rule()["rule"] and is_reserved_env_name(value["name"]):
            raise PodSpecViolation(path + rule["fieldPath"], rule["message"])


def _check_object(value: dict[str, Any], schema: dict[str, Any], path: str) -> None:
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    for name in schema.get("required", ()):
        if value.get(name) is None:
            raise PodSpecViolation(f"{path}.{name}", "Required value")
    properties = schema.get("properties")
    values = schema.get("additionalProperties")
    for key, item in value.items():
        if properties is not None and key in properties:
            _check(item, properties[key], f"{path}.{key}")
        elif isinstance(values, dict):
            _check(item, values, f"{path}.{key}")
        else:
            raise PodSpecViolation(f"{path}.{key}", f'unknown field "{key}"')


def _check_list(value: list[Any], schema: dict[str, Any], path: str) -> None:
    most = schema.get("maxItems")
    if most is not None and len(value) > most:
        raise PodSpecViolation(path, f"Too many: {len(value)}: must have at most {most} items")
    for index, item in enumerate(value):
        _check(item, schema["items"], f"{path}[{index}]")
    keys = schema.get("x-kubernetes-list-map-keys")
    if schema.get("x-kubernetes-list-type") == "map" and keys:
        defaults = {k: schema["items"]["properties"][k].get("default") for k in keys}
        seen: set[tuple[Any, ...]] = set()
        for index, item in enumerate(value):
            key = tuple(json.dumps(item.get(k, defaults[k])) for k in keys)
            if key in seen:
                raise PodSpecViolation(f"{path}[{index}]", "Duplicate value")
            seen.add(key)


def validate(pod_spec: dict[str, Any]) -> None:
    """Raises :class:`PodSpecViolation` for the first problem the API server would report."""
    _check(pod_spec, _structural(), "")


# ---- the checked-in file -----------------------------------------------------------------


def trimmed_text(source: Path, version: str) -> str:
    """What ``podspec_schema.json`` holds for ``source``, the core/v1 document."""
    return json.dumps(trim(json.loads(source.read_text()), version), indent=1) + "\n"
