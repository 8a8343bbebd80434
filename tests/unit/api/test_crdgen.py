"""The generated CRD: structural, described, with rules, and in sync with the models."""

from __future__ import annotations

import copy
import functools
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from torchfleet_operator.api import crdgen, podspec, v1alpha1
from torchfleet_operator.api.base import ApiModel, Rule

REPO = Path(__file__).resolve().parents[3]


@functools.cache
def _generated() -> dict[str, Any]:
    return crdgen.crd()


def _crd() -> dict[str, Any]:
    return copy.deepcopy(_generated())


def _schema() -> dict[str, Any]:
    return _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def _node(path: str) -> dict[str, Any]:
    node = _schema()
    for name in path.split("."):
        node = node["properties"][name]
    return node


def test_committed_crds_match_the_models() -> None:
    assert crdgen.main(["--check", "--root", str(REPO)]) == 0


def test_check_names_a_drifted_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert crdgen.main(["--root", str(tmp_path)]) == 0
    chart_copy = tmp_path / crdgen.OUTPUTS[1]
    chart_copy.write_text(chart_copy.read_text().replace("maxLength: 512", "maxLength: 511"))
    assert crdgen.main(["--check", "--root", str(tmp_path)]) == 1
    named = [line.split(":")[0] for line in capsys.readouterr().err.splitlines()]
    assert named == [str(crdgen.OUTPUTS[1])]


def test_check_names_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(REPO / "crds", tmp_path / "crds")
    assert crdgen.main(["--check", "--root", str(tmp_path)]) == 1
    assert str(crdgen.OUTPUTS[1]) in capsys.readouterr().err


def test_both_files_are_the_same_yaml() -> None:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRD is ~470 KB of YAML
    first, second = (yaml.load((REPO / path).read_text(), loader) for path in crdgen.OUTPUTS)
    assert first == second == _crd()


def test_names_subresources_and_columns() -> None:
    spec = _crd()["spec"]
    assert spec["names"]["shortNames"] == ["tj"]
    assert spec["names"]["categories"] == ["all"]
    version = spec["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = [column["name"] for column in version["additionalPrinterColumns"]]
    assert columns == [
        *("Phase", "Nodes", "Restarts", "Progress"),
        *("Loss", "Val-Loss", "Checkpoint", "Tokens/s", "MFU", "Goodput"),  # -o wide only
        "Managed-By",  # -o wide only
        "Age",
    ]
    wide = {c["name"] for c in version["additionalPrinterColumns"] if c.get("priority") == 1}
    assert wide == {"Loss", "Val-Loss", "Checkpoint", "Tokens/s", "MFU", "Goodput", "Managed-By"}
    for column in version["additionalPrinterColumns"][:-1]:
        path = column["jsonPath"].removeprefix(".").split(".")
        assert _node(".".join(path)), column  # the column points at a real field


def test_schema_is_structural() -> None:
    for path, node in _walk(_schema()):
        assert "$ref" not in node and "title" not in node and "$defs" not in node, path
        assert "propertyNames" not in node and "const" not in node, path
        assert node.get("additionalProperties") is not False, path
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert isinstance(node.get(bound, True), bool), path  # OpenAPI 3.0 style
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string") is True, path
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        else:
            open_object = node.get("x-kubernetes-preserve-unknown-fields")
            assert "type" in node or open_object, path


def _in_embedded_pod_spec(path: str) -> bool:
    """Below a role template's spec: the API server's PodSpec, descriptions dropped."""
    return any(path.startswith(f".spec.{role}.template.spec.") for role in ("master", "worker"))


def test_every_field_is_described() -> None:
    undescribed = [
        path
        for path, node in _walk(_schema())
        if path
        and not path.endswith(("[]", "{}"))
        and path != ".metadata"
        and not _in_embedded_pod_spec(path)
        and not node.get("description")
    ]
    assert undescribed == []


@pytest.mark.parametrize("role", ["master", "worker"])
def test_templates_embed_the_api_servers_pod_spec(role: str) -> None:
    pod_spec = _node(f"spec.{role}.template.spec")
    assert podspec.kubernetes_version() in pod_spec["description"]
    assert "required" not in pod_spec  # the operator adds the trainer container
    containers = pod_spec["properties"]["containers"]
    assert containers["x-kubernetes-list-type"] == "map"
    container = containers["items"]["properties"]
    cpu = container["resources"]["properties"]["limits"]["additionalProperties"]
    assert cpu["x-kubernetes-int-or-string"] and cpu["pattern"] == podspec.SIGNED_QUANTITY_PATTERN
    assert container["ports"]["items"]["properties"]["protocol"]["default"] == "TCP"
    assert container["name"].get("default") is None  # required: never filled in
    env_rules = container["env"]["items"]["x-kubernetes-validations"]
    assert [rule["fieldPath"] for rule in env_rules] == [".name"]
    claim_metadata = pod_spec["properties"]["volumes"]["items"]["properties"]["ephemeral"]
    claim_metadata = claim_metadata["properties"]["volumeClaimTemplate"]["properties"]["metadata"]
    assert claim_metadata == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def test_crd_stays_well_under_the_api_servers_size_limits() -> None:
    """etcd takes 1.5 MiB per object; client-side `kubectl apply` copies the object
    into a 256 KiB annotation. The CRD as the server stores it (compact JSON) fits both."""
    size = len(json.dumps(_crd(), separators=(",", ":")))
    assert size < 200_000, size


def test_pod_schema_file_is_the_trimmed_source() -> None:
    source = Path.home() / (
        f"go/pkg/mod/k8s.io/kubernetes@{podspec.kubernetes_version()}"
        "/api/openapi-spec/v3/api__v1_openapi.json"
    )
    if not source.exists():
        pytest.skip(f"{source} is not in the Go module cache (make cluster-build fetches it)")
    assert podspec.trimmed_text(source, podspec.kubernetes_version()) == (
        podspec.SCHEMA_FILE.read_text()
    ), "run `make pod-schema`"


def test_every_rule_has_a_message_and_a_relative_field_path() -> None:
    rules = [
        (path, rule)
        for path, node in _walk(_schema())
        for rule in node.get("x-kubernetes-validations", [])
    ]
    assert len(rules) > 30
    for path, rule in rules:
        assert rule["rule"] and (rule.get("message") or rule.get("messageExpression")), path
        assert rule.get("fieldPath", ".").startswith("."), path


def test_lists_and_maps_are_bounded_for_cel_cost() -> None:
    """The API server admits CEL rules only within a cost budget, so every list
    and map below a rule has a size bound."""
    for path, node in _walk(_node("spec")):
        if path.startswith(".trainer"):
            continue  # the trainer config has no lists or maps
        if _in_embedded_pod_spec(f".spec{path}"):
            # The API server's PodSpec, unbounded as upstream; its one rule (reserved
            # env names) costs a constant per item: `in` a literal list, startsWith.
            for rule in node.get("x-kubernetes-validations", []):
                assert rule["rule"] == podspec._reserved_env_rule()["rule"], path
            continue
        if node.get("type") == "array":
            assert "maxItems" in node, path
        if node.get("type") == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, path


def test_spec_defaults_match_the_models() -> None:
    spec = _node("spec")
    assert spec["properties"]["processesPerNode"]["default"] == "auto"
    assert spec["properties"]["runPolicy"]["default"] == {}
    assert spec["properties"]["runPolicy"]["properties"]["backoffLimit"]["default"] == 3
    assert spec["properties"]["suspend"]["default"] is False
    assert "default" not in spec["properties"]["checkpoint"]


@pytest.mark.parametrize(
    "model",
    [m for m in vars(v1alpha1).values() if isinstance(m, type) and issubclass(m, ApiModel)],
    ids=lambda m: m.__name__,
)
def test_every_python_default_is_a_schema_default(model: type[ApiModel]) -> None:
    """The API server can only apply defaults the schema carries; a default the
    models alone apply would make stored jobs differ from parsed ones."""
    properties = model.model_json_schema(by_alias=True)["properties"]
    for name, info in model.model_fields.items():
        if info.is_required() or (info.default is None and info.default_factory is None):
            continue
        if name == "trainer" or model is v1alpha1.TrainingJob:
            continue  # the trainer image owns its defaults; apiVersion/kind are the server's
        assert "default" in properties[info.alias or name], f"{model.__name__}.{name}"


def test_trainer_schema_comes_from_the_trainer_model_without_defaults() -> None:
    trainer = _node("spec.trainer")
    assert set(trainer["properties"]) >= {"model", "data", "training", "parallel", "checkpoint"}
    assert [path for path, node in _walk(trainer) if "default" in node] == []
    layers = trainer["properties"]["model"]["properties"]["layers"]
    assert layers["description"].endswith("Default: 6.")
    assert layers["minimum"] == 1
    model_rules = trainer["properties"]["model"]["x-kubernetes-validations"]
    assert any("% self.?heads.orValue(6)" in rule["rule"] for rule in model_rules)


def test_optional_fields_are_plain_types_not_nullable() -> None:
    image = _node("spec.image")
    assert image["type"] == "string" and "nullable" not in image
    assert _node("spec.checkpoint")["type"] == "object"


def test_spec_is_required_and_metadata_constrains_only_the_name() -> None:
    schema = _schema()
    assert schema["required"] == ["spec"]
    metadata = schema["properties"]["metadata"]
    assert set(metadata["properties"]) == {"name"}
    assert metadata["properties"]["name"]["maxLength"] == 48


def _rule_models() -> list[type[ApiModel]]:
    return [
        model
        for model in vars(v1alpha1).values()
        if isinstance(model, type) and issubclass(model, ApiModel) and model.rules
    ]


@pytest.mark.parametrize("model", _rule_models(), ids=lambda m: m.__name__)
def test_only_transition_rules_lack_a_python_check(model: type[ApiModel]) -> None:
    rule: Rule
    for rule in model.rules:
        assert (rule.check is None) == ("oldSelf" in rule.cel), rule.cel
