"""Property: the API server admits a random TrainingJob exactly when the models
do. Jobs are drawn from the models' own schema, mostly valid with values at and
just past every bound, so both the shared rules and each side's edge cases are
exercised; a disagreement fails naming the fields each side blamed.

One whole-spec property finds cross-section disagreements; one property per
spec section draws only that section (the rest minimal), so the rules inside a
section meet their edge cases often enough to matter; one property aims at
the world-size rule, the one rule that spans four sections, and one at the
elastic rules over the same shapes.
"""

from __future__ import annotations

import os
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.fixtures.api import Rejection, TrainingJobs
from torchfleet_operator.api import API_VERSION, KIND, InvalidSpecError, parse_training_job
from torchfleet_operator.api.crdgen import openapi_schema

pytestmark = pytest.mark.cluster

# Examples per property; the defaults keep the whole module near a minute here.
WHOLE_SPEC_EXAMPLES = int(os.environ.get("TORCHFLEET_API_PROPERTY_EXAMPLES", "150"))
SECTION_EXAMPLES = WHOLE_SPEC_EXAMPLES // 3

Strategy = st.SearchStrategy[Any]
_ABSENT = object()
ASCII = st.characters(codec="ascii")
MAP_KEYS = ["NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_ib", "OMP_NUM_THREADS"]
RESOURCE_KEYS = ["rdma/ib", "rdma/roce", "example.com/hca", "rdma", "Rdma/IB"]


def mostly(valid: Strategy, invalid: Strategy) -> Strategy:
    """``valid`` nine times in ten: a spec with one bad value in it is the
    interesting case; a spec with many is rejected by both for dull reasons."""
    return st.sampled_from(range(10)).flatmap(lambda roll: invalid if roll == 0 else valid)


def sometimes(value: Strategy, odds: int) -> Strategy:
    """An optional field, set one time in ``odds``."""
    return st.sampled_from(range(odds)).flatmap(lambda r: value if r == 0 else st.just(_ABSENT))


TEMPLATE_SPECS = [
    {},
    {"nodeSelector": {"pool": "gpu"}},
    {"containers": [{"name": "trainer", "env": [{"name": "HF_HOME", "value": "/cache"}]}]},
    {"containers": [{"name": "trainer", "resources": {"limits": {"memory": "64Gi", "cpu": 8}}}]},
    {"tolerations": [{"key": "gpu", "operator": "Exists"}], "priorityClassName": "high"},
]
BAD_TEMPLATE_SPECS = [
    {"containers": [{"name": "trainer", "resources": {"limits": {"cpu": "lots"}}}]},
    {"containers": [{"name": "trainer", "ports": "many"}]},
    {"containers": [{"name": "trainer", "env": [{"name": "WORLD_SIZE", "value": "8"}]}]},
    {"containers": [{"image": "no-name:1"}]},
    {"tolerations": {"key": "gpu"}},
]


class SchemaStrategies:
    """Strategies for the nodes of the models' structural schema."""

    def __init__(self, optional_odds: int) -> None:
        self.optional_odds = optional_odds

    def node(self, node: dict[str, Any], path: str) -> Strategy:
        if path.endswith(".template.spec"):
            # The API server's own PodSpec schema: drawn from a few pod specs, since
            # walking its hundreds of fields would drown the job's own rules.
            return mostly(st.sampled_from(TEMPLATE_SPECS), st.sampled_from(BAD_TEMPLATE_SPECS))
        if node.get("x-kubernetes-int-or-string"):
            return self._int_or_string(path)
        if node.get("x-kubernetes-preserve-unknown-fields"):
            return st.sampled_from([{}, {"nodeSelector": {"pool": "gpu"}}])
        kind = node["type"]
        if kind == "integer":
            return self._integers(node, path)
        if kind == "number":
            return self._numbers(node)
        if kind == "boolean":
            return st.booleans()
        if kind == "string":
            return self._strings(node)
        if kind == "array":
            return self._lists(node, path)
        if "additionalProperties" in node:
            return self._maps(node, path)
        return self._objects(node, path)

    def _integers(self, node: dict[str, Any], path: str) -> Strategy:
        if path.endswith("master.replicas"):  # bounded by a CEL rule, not minimum/maximum
            return mostly(st.just(1), st.sampled_from([0, 2]))
        low = node.get("minimum", 0)
        high = node.get("maximum", low + 1000)
        valid = st.one_of(st.integers(low, min(high, low + 16)), st.sampled_from([low, high]))
        return mostly(valid, st.sampled_from([low - 1, high + 1]))

    def _numbers(self, node: dict[str, Any]) -> Strategy:
        low, high = node.get("minimum", 0.0), node.get("maximum", 100.0)
        inside = st.sampled_from([low + (high - low) * f for f in (0.25, 0.5, 0.75)])
        edges = st.sampled_from([low, high])  # invalid where the bound is exclusive
        return mostly(st.one_of(inside, edges), st.sampled_from([low - 1.0, high + 1.0]))

    def _strings(self, node: dict[str, Any]) -> Strategy:
        if "enum" in node:
            return mostly(st.sampled_from(node["enum"]), st.just("Bogus"))
        max_length = node.get("maxLength", 40)
        if "pattern" in node:
            valid = st.from_regex(node["pattern"], fullmatch=True, alphabet=ASCII).filter(
                lambda s: len(s) <= max_length
            )
        else:
            valid = st.text(string.ascii_letters + string.digits + "-./:", min_size=1, max_size=12)
        # Non-ASCII letters: every pattern must read them as RE2 does (no Unicode \w).
        invalid = ["", "Not Valid!", "x" * (max_length + 1), "módulo:fábrica"]
        return mostly(valid, st.sampled_from(invalid))

    def _int_or_string(self, path: str) -> Strategy:
        if path.endswith("processesPerNode"):
            valid = st.sampled_from(["auto", "gpu", 1, 2, 4, 8, 1024])
            return mostly(valid, st.sampled_from([0, 1025, "eight", "4", ""]))
        valid = st.sampled_from([4, 0, "500m", "16Gi", "1.5", "1e3", ".5"])
        return mostly(valid, st.sampled_from([-1, "lots", "1x", "-1", "", "1 Gi"]))

    def _lists(self, node: dict[str, Any], path: str) -> Strategy:
        items = self.node(node["items"], f"{path}[]")
        low = node.get("minItems", 0)
        valid = st.lists(items, min_size=low, max_size=max(low, 3))
        return mostly(valid, st.just([])) if low else valid

    def _maps(self, node: dict[str, Any], path: str) -> Strategy:
        values = self.node(node["additionalProperties"], f"{path}{{}}")
        keys = {"ncclEnv": MAP_KEYS, "rdmaResources": RESOURCE_KEYS}.get(
            path.rsplit(".", 1)[-1], ["team", "app"]
        )
        return st.dictionaries(st.sampled_from(keys), values, max_size=2)

    def _objects(self, node: dict[str, Any], path: str) -> Strategy:
        required = set(node.get("required", ()))
        fields = {
            name: self.node(child, f"{path}.{name}")
            if name in required
            else sometimes(self.node(child, f"{path}.{name}"), self.optional_odds)
            for name, child in node.get("properties", {}).items()
        }
        return st.fixed_dictionaries(fields).map(
            lambda drawn: {name: value for name, value in drawn.items() if value is not _ABSENT}
        )


SPEC = openapi_schema()["properties"]["spec"]
SECTIONS = ("resources", "master", "worker", "network", "checkpoint", "runPolicy", "scheduling")
NAMES = mostly(st.sampled_from(["tj-a", "job-42", "a"]), st.sampled_from(["9lives", "x" * 49]))

# Small shapes, degrees and batches, so that products land on the world size
# (and batches split over the ranks) about half the time.
WORLD_SIZE_SPECS = st.fixed_dictionaries(
    {
        "processesPerNode": st.sampled_from(["auto", "gpu", 1, 2, 4]),
        "resources": st.fixed_dictionaries({"gpus": st.sampled_from([0, 1, 2, 4])}),
        "worker": st.fixed_dictionaries({"replicas": st.integers(0, 3)}),
        "trainer": st.fixed_dictionaries(
            {
                "data": st.fixed_dictionaries({}, optional={"seqLen": st.sampled_from([128, 129])}),
                "training": st.fixed_dictionaries(
                    {},
                    optional={
                        "globalBatchSize": st.sampled_from([8, 12, 16, 64]),
                        "gradAccumSteps": st.sampled_from([1, 2, 4]),
                    },
                ),
                "parallel": st.fixed_dictionaries(
                    {},
                    optional={
                        "dataParallelReplicate": st.integers(1, 4),
                        "dataParallelShard": st.integers(-1, 4),
                        "tensor": st.sampled_from([1, 2]),
                        "pipeline": st.sampled_from([1, 2]),
                        "pipelineSchedule": st.sampled_from(["1f1b", "interleaved_1f1b"]),
                        "pipelineMicrobatches": st.sampled_from([1, 2, 3]),
                        "sequenceParallel": st.booleans(),
                    },
                ),
            }
        ),
    }
)

ELASTIC = st.fixed_dictionaries(
    {"minNodes": st.integers(1, 4), "maxNodes": st.integers(1, 5)},
    optional={"maxRestarts": st.integers(0, 3)},
)
COMMANDS = st.sampled_from(
    [["torchrun", "train.py"], ["python", "t.py", "--rank=$(RANK)"], ["x", "$(NODE_RANK)"]]
)


def _elastic(
    shape: dict[str, Any], elastic: dict[str, Any], command: list[str] | None, micro: int | None
) -> Any:
    """An elastic spec: the world-size shape with its trainer (and sometimes a
    micro batch), or with a command instead."""
    spec = {**shape, "elastic": elastic}
    if command is not None:
        del spec["trainer"]
        spec["command"] = command
    elif micro is not None:
        training = spec["trainer"]["training"]
        spec["trainer"] = {**spec["trainer"], "training": {**training, "microBatchSize": micro}}
    return spec


# The world-size shapes made elastic: bounds around the desired size, micro
# batches, and commands that do or do not name a per-pod rank.
ELASTIC_SPECS = st.builds(
    _elastic, WORLD_SIZE_SPECS, ELASTIC, st.none() | COMMANDS, st.none() | st.integers(1, 4)
)


def _models_verdict(manifest: dict[str, Any]) -> InvalidSpecError | None:
    try:
        parse_training_job(manifest)
    except InvalidSpecError as error:
        return error
    return None


def _disagreement(models: InvalidSpecError | None, server: Rejection | None) -> str | None:
    if models is None and server is not None:
        return (
            f"the models accept it, the API server rejects {list(server.fields)}: {server.message}"
        )
    if models is not None and server is None:
        return f"the API server accepts it, the models reject {models.field}: {models}"
    return None


def _check(trainingjobs: TrainingJobs, namespace: str, name: str, spec: dict[str, Any]) -> None:
    manifest = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec}
    models = _models_verdict(manifest)
    server = trainingjobs.admit(namespace, manifest)
    event("accepted by both" if models is None and server is None else "rejected")
    problem = _disagreement(models, server)
    assert problem is None, problem


@pytest.fixture(scope="module")
def property_namespace(cluster: Any, trainingjob_crd: str) -> Any:
    name = "api-property"
    cluster.kubectl("create", "namespace", name, check=False)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _settings(examples: int) -> Any:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@_settings(WHOLE_SPEC_EXAMPLES)
@given(name=NAMES, spec=SchemaStrategies(optional_odds=3).node(SPEC, ".spec"))
def test_whole_spec(
    name: str, spec: dict[str, Any], trainingjobs: TrainingJobs, property_namespace: str
) -> None:
    _check(trainingjobs, property_namespace, name, spec)


@pytest.mark.parametrize("section", SECTIONS)
def test_one_section(section: str, trainingjobs: TrainingJobs, property_namespace: str) -> None:
    strategy = SchemaStrategies(optional_odds=2).node(SPEC["properties"][section], f".{section}")

    @_settings(SECTION_EXAMPLES)
    @given(value=strategy)
    def agree(value: dict[str, Any]) -> None:
        _check(trainingjobs, property_namespace, "tj-section", {section: value})

    agree()


def test_trainer_config(trainingjobs: TrainingJobs, property_namespace: str) -> None:
    strategy = SchemaStrategies(optional_odds=3).node(SPEC["properties"]["trainer"], ".trainer")

    @_settings(SECTION_EXAMPLES)
    @given(trainer=strategy)
    def agree(trainer: dict[str, Any]) -> None:
        _check(trainingjobs, property_namespace, "tj-trainer", {"trainer": trainer})

    agree()


@pytest.mark.parametrize(
    ("name", "strategy"),
    [("tj-world", WORLD_SIZE_SPECS), ("tj-elastic", ELASTIC_SPECS)],
    ids=["world-size", "elastic"],
)
def test_shape_rules(
    name: str, strategy: Strategy, trainingjobs: TrainingJobs, property_namespace: str
) -> None:
    """The world-size rules, and the elastic rules over the same shapes."""

    @_settings(SECTION_EXAMPLES)
    @given(spec=strategy)
    def agree(spec: dict[str, Any]) -> None:
        _check(trainingjobs, property_namespace, name, spec)

    agree()
