"""The operator Deployment: one kopf process, locked down, probed, and
configured from the chart's values."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.fixtures.helm import CHART, CI_VALUES, RELEASE_NAMESPACE, Helm, find_object
from torchfleet_operator.config import OperatorConfig
from torchfleet_operator.main import parse_args

CHART_META = yaml.safe_load((CHART / "Chart.yaml").read_text())


def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers = find_object(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    return containers[0]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_a_single_operator_without_leader_election_is_replaced_never_rolled(helm: Helm) -> None:
    # Two standalone replicas would both reconcile every job (leader election
    # is on by default: test_rbac.py::test_replicas_and_leader_election).
    objects = helm.template(set_values={"operator.leaderElection": False})
    spec = find_object(objects, "Deployment")["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}


def test_operator_pod_meets_the_restricted_pod_security_standard(helm: Helm) -> None:
    objects = helm.template()
    pod = find_object(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")

    security = operator_container(objects)["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["runAsNonRoot"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in security

    # A read-only root needs somewhere writable for temporary files.
    mounts = {m["mountPath"]: m["name"] for m in operator_container(objects)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]


def test_operator_has_requests_and_limits(helm: Helm) -> None:
    resources = operator_container(helm.template())["resources"]
    for bound in ("requests", "limits"):
        assert set(resources[bound]) >= {"cpu", "memory"}, bound


def operator_cli(container: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The settings the operator itself reads from the rendered container: its
    own argument parser over the args, its own config over the env."""
    for name, value in env_of(container).items():
        monkeypatch.setenv(name, value)
    return parse_args(container["args"]), OperatorConfig.from_env()


def test_liveness_probe_asks_kopfs_health_endpoint_on_the_port_kopf_serves(
    helm: Helm, monkeypatch: pytest.MonkeyPatch
) -> None:
    container = operator_container(helm.template(set_values={"operator.healthPort": 9091}))
    probe = container["livenessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert probe["path"] == "/healthz"
    assert ports[probe["port"]] == 9091
    args, _ = operator_cli(container, monkeypatch)
    assert args.health_port == 9091


def test_readiness_probe_asks_the_same_endpoint_with_its_own_timing(helm: Helm) -> None:
    # kopf serves /healthz once its startup handlers have run (the controller started).
    timing = {"initialDelaySeconds": 2, "periodSeconds": 7, "timeoutSeconds": 3}
    container = operator_container(
        helm.template(set_values={"operator.readinessProbe": timing | {"failureThreshold": 4}})
    )
    probe = container["readinessProbe"]
    assert probe["httpGet"] == container["livenessProbe"]["httpGet"]
    assert probe == {"httpGet": probe["httpGet"], **timing, "failureThreshold": 4}


def test_metrics_service_reaches_the_operators_metrics_port(
    helm: Helm, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = helm.template(set_values={"operator.metricsPort": 9100})
    service = find_object(objects, "Service")
    pod_labels = find_object(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    container = operator_container(objects)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    (service_port,) = service["spec"]["ports"]
    assert ports[service_port["targetPort"]] == 9100
    args, _ = operator_cli(container, monkeypatch)
    assert args.metrics_port == 9100


def test_operator_settings_reach_the_operator(helm: Helm, monkeypatch: pytest.MonkeyPatch) -> None:
    # ci/cluster-wide-values.yaml sets every operator default.
    container = operator_container(helm.template([CI_VALUES / "cluster-wide-values.yaml"]))
    args, config = operator_cli(container, monkeypatch)
    assert args.log_level == "debug"
    assert args.namespace == []  # every namespace
    assert args.peering is None  # standalone: the single replica is the only one
    assert args.trainer_image == "registry.example.com/ml/trainer:2026.11"
    assert config.restart_backoff_seconds == 5
    assert config.restart_backoff_max_seconds == 120
    # Not read by the operator yet (see the chart's report): passed for when it is.
    assert env_of(container)["TORCHFLEET_OPERATOR_DEFAULT_SHM_SIZE"] == "32Gi"
    assert container["image"] == "ghcr.io/torchfleet/operator:ci"


def test_watched_namespaces_reach_the_operator_once_each(
    helm: Helm, monkeypatch: pytest.MonkeyPatch
) -> None:
    container = operator_container(helm.template([CI_VALUES / "namespaced-values.yaml"]))
    args, _ = operator_cli(container, monkeypatch)
    assert args.namespace == ["team-a", "team-b"]


def test_images_default_to_the_chart_app_version(helm: Helm) -> None:
    container = operator_container(helm.template())
    app_version = CHART_META["appVersion"]
    assert container["image"] == f"ghcr.io/torchfleet/operator:{app_version}"
    assert f"--trainer-image=ghcr.io/torchfleet/trainer:{app_version}" in container["args"]


def test_an_image_digest_pins_the_image(helm: Helm) -> None:
    digest = "sha256:" + "ab" * 32
    container = operator_container(
        helm.template(set_values={"operator.image.digest": digest, "operator.image.tag": "v9"})
    )
    assert container["image"] == f"ghcr.io/torchfleet/operator@{digest}"


def test_extra_env_and_scheduling_values_are_passed_through(helm: Helm) -> None:
    toleration = {"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}
    objects = helm.template(
        set_values={
            "operator.extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
            "operator.tolerations": [toleration],
            "operator.nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
            "operator.priorityClassName": "system-cluster-critical",
        }
    )
    pod = find_object(objects, "Deployment")["spec"]["template"]["spec"]
    assert env_of(pod["containers"][0])["HTTPS_PROXY"] == "http://proxy:3128"
    assert pod["tolerations"] == [toleration]
    assert pod["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}
    assert pod["priorityClassName"] == "system-cluster-critical"


def test_namespaced_objects_land_in_the_release_namespace(helm: Helm) -> None:
    for obj in helm.template([CI_VALUES / "monitoring-values.yaml"]):
        kind, meta = obj["kind"], obj["metadata"]
        if kind in {"ClusterRole", "ClusterRoleBinding"}:
            assert "namespace" not in meta, kind
        elif kind == "ConfigMap":  # the dashboard goes where Grafana looks
            assert meta["namespace"] == "monitoring"
        else:
            assert meta["namespace"] == RELEASE_NAMESPACE, kind


def test_every_object_carries_the_standard_labels(helm: Helm) -> None:
    for obj in helm.template([CI_VALUES / "monitoring-values.yaml"]):
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "torchfleet", obj["kind"]
        assert labels["app.kubernetes.io/instance"] == "torchfleet", obj["kind"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm", obj["kind"]
        assert labels["helm.sh/chart"] == f"torchfleet-{CHART_META['version']}", obj["kind"]
