"""Monitoring objects: off by default; when on, they select what the operator
and the trainer really expose, and the alerts fire when they should (checked
with Prometheus's own promtool)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
import yaml
from prometheus_client import CollectorRegistry

from tests.fixtures.helm import CI_VALUES, Helm, find_object, find_objects
from torchfleet_operator import metrics as operator_metrics
from torchfleet_operator.api.parse import parse_spec
from torchfleet_operator.desired.pods import build_pod
from torchfleet_trainer.metrics import TrainMetrics

MONITORING = CI_VALUES / "monitoring-values.yaml"
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
METRIC_NAME = re.compile(r"\btorchfleet_[a-z0-9_]+")


def exposed_series(registry: CollectorRegistry) -> set[str]:
    """Every series name a registry can expose (counters add _total,
    histograms their _bucket/_sum/_count)."""
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "gauge": ("",),
    }
    return {
        family.name + suffix
        for family in registry.collect()
        for suffix in suffixes.get(family.type, ("",))
    }


def test_monitoring_is_off_by_default(helm: Helm) -> None:
    objects = helm.template()
    assert not {o["kind"] for o in objects} & MONITORING_KINDS
    assert not find_objects(objects, "ConfigMap")


def test_service_monitor_scrapes_the_operator_metrics_service(helm: Helm) -> None:
    objects = helm.template([MONITORING])
    monitor = find_object(objects, "ServiceMonitor")
    service = find_object(objects, "Service")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"] == {
        "matchNames": [service["metadata"]["namespace"]]
    }
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_pod_monitor_selects_the_pods_the_operator_builds(helm: Helm) -> None:
    monitor = find_object(helm.template([MONITORING]), "PodMonitor")
    spec = parse_spec({"worker": {"replicas": 2}})
    pod = build_pod("gpt", "ml", "uid-1", spec, node_rank=2, restart=1, default_image="trainer")
    labels = pod["metadata"]["labels"]
    ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    selector = monitor["spec"]["selector"]
    assert selector["matchLabels"].items() <= labels.items()
    for expression in selector["matchExpressions"]:
        assert expression["operator"] == "Exists" and expression["key"] in labels
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in ports
    # The dashboard and alerts group training series by job.
    assert {r["targetLabel"] for r in endpoint["relabelings"]} >= {"job_name"}
    for relabel in endpoint["relabelings"]:
        (source,) = relabel["sourceLabels"]
        pod_label = source.removeprefix("__meta_kubernetes_pod_label_")
        assert pod_label in {re.sub(r"[^a-zA-Z0-9_]", "_", k) for k in labels}, source


def test_pod_monitor_watches_only_the_watched_namespaces(helm: Helm) -> None:
    objects = helm.template(
        [MONITORING], set_values={"operator.watchNamespaces": ["team-a", "team-b", "team-a"]}
    )
    selector = find_object(objects, "PodMonitor")["spec"]["namespaceSelector"]
    assert selector == {"matchNames": ["team-a", "team-b"]}


def referenced_metrics(objects: list[dict[str, Any]]) -> set[str]:
    rule = find_object(objects, "PrometheusRule")
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    dashboard = json.loads(find_object(objects, "ConfigMap")["data"]["torchfleet.json"])
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return {name for expr in exprs for name in METRIC_NAME.findall(expr)}


def test_alerts_and_dashboard_use_only_series_the_code_exposes(helm: Helm) -> None:
    assert operator_metrics.JOBS  # the operator's series live in the default registry
    exposed = exposed_series(prometheus_client.REGISTRY) | exposed_series(TrainMetrics().registry)
    referenced = referenced_metrics(helm.template([MONITORING]))
    assert referenced, "no torchfleet series referenced at all"
    assert referenced <= exposed, f"not exposed by any code: {sorted(referenced - exposed)}"


def test_dashboard_shows_training_figures_goodput_restarts_and_phases(helm: Helm) -> None:
    configmap = find_object(helm.template([MONITORING]), "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(configmap["data"]["torchfleet.json"])
    series_by_title = {
        p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in dashboard["panels"]
    }
    for title, series in {
        "Training progress": "torchfleet_train_step",
        "Loss": "torchfleet_train_loss",
        "Tokens per second": "torchfleet_train_tokens_per_second",
        "MFU": "torchfleet_train_mfu_ratio",
        "Gang restarts": "torchfleet_operator_gang_restarts_total",
        "Jobs by phase": "torchfleet_operator_jobs",
        "Goodput": "torchfleet_operator_job_goodput",
        "Where the time went": "torchfleet_operator_job_time_seconds",
        "Node compute time": "torchfleet_train_node_compute_seconds",
        "Straggler score": "torchfleet_train_node_straggler_score",
    }.items():
        assert series in series_by_title[title], title
    # An elastic job's lost worker is replaced alone: shown beside the restarts.
    assert "torchfleet_operator_elastic_replacements_total" in series_by_title["Gang restarts"]
    assert "torchfleet_operator_in_place_restarts_total" in series_by_title["Gang restarts"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


# ---- the alerts, evaluated by promtool ------------------------------------


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if not found:
        pytest.skip("promtool not installed (Debian package prometheus: make deps)")
    return found


def rule_groups(helm: Helm) -> list[dict[str, Any]]:
    rule = find_object(helm.template([MONITORING]), "PrometheusRule")
    return rule["spec"]["groups"]


def test_prometheus_rules_are_valid(helm: Helm, promtool: str, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule_groups(helm)}))
    out = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 6 rules found" in out.stdout, out.stdout


def test_alerts_fire_exactly_when_they_should(helm: Helm, promtool: str, tmp_path: Path) -> None:
    # Annotations are checked by `promtool check rules`; here only when an
    # alert fires and with which labels.
    groups = rule_groups(helm)
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    common = {"severity": "warning", "team": "ml-platform"}
    flat_after_10m = "1+1x10 11x40"  # one step a minute for 10 minutes, then none
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": 'torchfleet_train_step{namespace="ml", job_name="stuck"}',
                        "values": flat_after_10m,
                    },
                    {
                        "series": 'torchfleet_train_step{namespace="ml", job_name="busy"}',
                        "values": "1+1x50",
                    },
                    {"series": 'torchfleet_operator_jobs{phase="Failed"}', "values": "0x5 1x10"},
                    {"series": 'torchfleet_operator_jobs{phase="Running"}', "values": "2x15"},
                    {
                        "series": 'torchfleet_operator_gang_restarts_total{reason="PodFailed"}',
                        "values": "0+1x20",
                    },
                    {
                        "series": 'torchfleet_operator_gang_restarts_total{reason="NodeLost"}',
                        "values": "0+0x20",
                    },
                ],
                "alert_rule_test": [
                    # monitoring-values.yaml: noProgressMinutes 20.
                    {
                        "eval_time": "25m",
                        "alertname": "TorchfleetTrainingStalled",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "31m",
                        "alertname": "TorchfleetTrainingStalled",
                        "exp_alerts": [
                            {"exp_labels": {**common, "namespace": "ml", "job_name": "stuck"}}
                        ],
                    },
                    {"eval_time": "4m", "alertname": "TorchfleetJobFailed", "exp_alerts": []},
                    {
                        "eval_time": "7m",
                        "alertname": "TorchfleetJobFailed",
                        "exp_alerts": [{"exp_labels": common}],
                    },
                    # restartsThreshold 3 within 1h: the fourth PodFailed restart.
                    {
                        "eval_time": "2m",
                        "alertname": "TorchfleetGangRestartsClimbing",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "10m",
                        "alertname": "TorchfleetGangRestartsClimbing",
                        "exp_alerts": [{"exp_labels": {**common, "reason": "PodFailed"}}],
                    },
                ],
            }
        ],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    out = subprocess.run(
        [promtool, "test", "rules", "tests.yaml"], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode == 0, out.stdout + out.stderr
