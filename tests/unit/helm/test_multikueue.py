"""The chart's MultiKueue values (templates/multikueue.yaml) render the same
objects as dev/cluster/multikueue.py, which tests/cluster/test_multikueue.py
proves against two clusters with the real Kueue; nothing by default."""

from __future__ import annotations

from typing import Any

from tests.fixtures.cluster import _load_localcluster
from tests.fixtures.helm import Helm, find_objects

# dev/cluster/multikueue.py, loaded by path as the harness loads its add-ons.
multikueue = _load_localcluster().load_addon("multikueue")

KINDS = ("MultiKueueCluster", "MultiKueueConfig", "AdmissionCheck")
WORKERS = [
    {"name": "worker-1", "kubeconfigSecret": "worker-1-kubeconfig"},
    {"name": "worker-2", "kubeconfigSecret": "worker-2-kubeconfig"},
]


def _named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [found] = [o for o in find_objects(objects, kind) if o["metadata"]["name"] == name]
    return found


def _kept(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without the chart's labels (the harness sets none)."""
    meta = {k: v for k, v in obj["metadata"].items() if k != "labels"}
    return {**obj, "metadata": meta}


def test_nothing_is_rendered_by_default(helm: Helm) -> None:
    rendered = helm.template()
    assert [o for o in rendered if o["kind"] in KINDS] == []
    assert not any("multikueue" in o["metadata"]["name"] for o in rendered)


def test_the_manager_side_is_the_harness_objects(helm: Helm) -> None:
    rendered = helm.template(
        set_values={"multikueue.manager.enabled": True, "multikueue.manager.workers": WORKERS}
    )
    ours = [_kept(o) for o in rendered if o["kind"] in KINDS]
    harness = [
        o
        for o in multikueue.manager_objects(
            "torchfleet-multikueue", {w["name"]: "unused" for w in WORKERS}
        )
        if o["kind"] in KINDS
    ]
    key = lambda o: (o["kind"], o["metadata"]["name"])  # noqa: E731
    assert sorted(ours, key=key) == sorted(harness, key=key)
    assert find_objects(rendered, "Secret") == []  # credentials stay the team's


def test_the_worker_side_grants_what_the_harness_grants(helm: Helm) -> None:
    rendered = helm.template(set_values={"multikueue.worker.enabled": True})
    role = _named(rendered, "ClusterRole", "torchfleet-multikueue-worker")
    assert role["rules"] == multikueue.worker_rules()
    binding = _named(rendered, "ClusterRoleBinding", "torchfleet-multikueue-worker")
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": multikueue.WORKER_ACCOUNT,
            "namespace": multikueue.KUEUE_NAMESPACE,
        }
    ]
    account = _named(rendered, "ServiceAccount", multikueue.WORKER_ACCOUNT)
    assert account["metadata"]["namespace"] == multikueue.KUEUE_NAMESPACE
