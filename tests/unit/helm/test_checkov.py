"""checkov over the rendered chart, with its defaults, every ci/ values file and
every option on: each finding is fixed or has its reason in
tests/checkov-skips.yaml (scope: chart)."""

from __future__ import annotations

from pathlib import Path

from tests.fixtures.checkov import assert_explained, load_skips, scan, write_documents
from tests.fixtures.helm import CI_VALUES, Helm

# Every optional object rendered: monitoring, two replicas (the PDB), the
# NetworkPolicy, the operator image pinned by digest.
ALL_ON = {
    "operator.replicas": 2,
    "operator.image.digest": "sha256:" + "0" * 64,
    "networkPolicy.enabled": True,
    "metrics.serviceMonitor.enabled": True,
    "metrics.podMonitor.enabled": True,
    "metrics.prometheusRule.enabled": True,
    "metrics.grafanaDashboard.enabled": True,
}


def test_the_rendered_chart_passes_checkov_or_says_why(helm: Helm, tmp_path: Path) -> None:
    # checkov's graph checks join objects across the files of one run, by
    # labels alone (a NetworkPolicy of one render would cover the pods of
    # every other): the render with the NetworkPolicy is scanned on its own.
    renders = {"defaults": helm.template()}
    for values in sorted(CI_VALUES.glob("*.yaml")):
        renders[values.stem] = helm.template([values])
    for name, objects in renders.items():
        write_documents(tmp_path / "without-policy" / f"{name}.yaml", objects)
    write_documents(tmp_path / "all-on" / "all-on.yaml", helm.template(set_values=ALL_ON))
    findings = scan(tmp_path / "without-policy") + scan(tmp_path / "all-on")
    assert_explained(findings, load_skips("chart"))
