"""Kubernetes' own gang objects against the real API server of this release:
the operator's discovery finds the scheduling.k8s.io version it serves, the
Workload and PodGroup the operator builds in that version are accepted as
built, and the version it does not serve is refused (why discovery is needed).
``make test-kubernetes-oldest`` runs them on 1.36 (v1alpha2)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from torchfleet_operator.api.v1alpha1 import TrainingJob
from torchfleet_operator.desired import podgroup
from torchfleet_operator.kube import Executor, collection_path

pytestmark = pytest.mark.cluster


@pytest.fixture
def executor(cluster: Any) -> Iterator[Executor]:
    made = Executor(cluster.api_client(), 1)
    try:
        yield made
    finally:
        made.close()


def gang(api: str, namespace: str) -> list[dict[str, Any]]:
    """The PodGroup and Workload of a 3-pod job's first gang, as the operator
    builds them in ``api``; owned by nothing (no job exists here)."""
    spec = TrainingJob.model_validate(
        {
            "apiVersion": "torchfleet.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "llm"},
            "spec": {
                "command": ["python", "train.py"],
                "worker": {"replicas": 2},
                "scheduling": {"podGroup": "Kubernetes"},
            },
        }
    ).spec
    made = podgroup.gang_objects("llm", namespace, "uid-1", spec, 0, api)
    for manifest in made:
        del manifest["metadata"]["ownerReferences"]
    return made


def test_discovery_finds_the_version_this_release_serves(executor, native_gang):
    assert executor.native_api() == native_gang.api


def test_the_gang_objects_are_accepted_as_built(executor, native_gang, namespace):
    for manifest in gang(native_gang.api, namespace):
        path = collection_path(manifest["apiVersion"], manifest["kind"], namespace)
        # Strict: a field this version does not know is refused, not dropped.
        made = executor.raw.request("POST", path, manifest, query={"fieldValidation": "Strict"})
        assert made["apiVersion"] == native_gang.api
        # Every field as built (the server adds its defaults: nulls, priority 0).
        assert kept(manifest["spec"], made["spec"]), made["spec"]


def kept(built: Any, stored: Any) -> bool:
    """``stored`` holds everything ``built`` says, in the same places."""
    if isinstance(built, dict):
        return isinstance(stored, dict) and all(kept(v, stored.get(k)) for k, v in built.items())
    if isinstance(built, list):
        same_length = isinstance(stored, list) and len(stored) == len(built)
        return same_length and all(kept(b, s) for b, s in zip(built, stored, strict=True))
    return bool(built == stored)


def test_the_version_it_does_not_serve_is_refused(executor, native_gang, namespace):
    others = [f"{podgroup.NATIVE_GROUP}/{v}" for v in podgroup.NATIVE_VERSIONS]
    others.remove(native_gang.api)
    for api in others:
        group = gang(api, namespace)[0]
        with pytest.raises(ApiException) as refused:
            executor.raw.request("POST", collection_path(api, "PodGroup", namespace), group)
        assert refused.value.status == 404, refused.value.body
