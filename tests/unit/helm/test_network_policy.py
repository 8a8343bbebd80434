"""networkPolicy: off by default; on, the operator pod admits ingress to its
metrics port only, from whom networkPolicy.metricsFrom names."""

from __future__ import annotations

from tests.fixtures.helm import Helm, find_object, find_objects

MONITORING = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]


def test_no_network_policy_by_default(helm: Helm) -> None:
    assert find_objects(helm.template(), "NetworkPolicy") == []


def test_the_policy_selects_the_operator_pod_and_admits_only_its_metrics_port(helm: Helm) -> None:
    objects = helm.template(
        set_values={"networkPolicy.enabled": True, "networkPolicy.metricsFrom": MONITORING}
    )
    policy = find_object(objects, "NetworkPolicy")["spec"]
    pod = find_object(objects, "Deployment")["spec"]["template"]
    assert policy["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    # Ingress only: egress (the API server) stays open.
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert "metrics" in ports and set(ports) == {"health", "metrics"}
    assert rule["from"] == MONITORING


def test_without_sources_any_may_scrape_but_only_the_metrics_port(helm: Helm) -> None:
    objects = helm.template(set_values={"networkPolicy.enabled": True})
    (rule,) = find_object(objects, "NetworkPolicy")["spec"]["ingress"]
    assert "from" not in rule and rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
