"""The chart renders and lints offline, as GitOps tools render it: no cluster and
no --kube-version. The real minimum Kubernetes version still stops a render
against an older cluster (templates/kube-version.yaml)."""

from __future__ import annotations

import pytest

from tests.fixtures.helm import CHART, RELEASE, Helm


def test_helm_template_renders_without_a_cluster_or_kube_version(helm: Helm) -> None:
    out = helm.run("template", RELEASE, str(CHART), "--namespace", "torchfleet-system")
    assert "kind: Deployment" in out.stdout and "kind: ClusterRole" in out.stdout


def test_helm_lint_passes_without_kube_version(helm: Helm) -> None:
    out = helm.run("lint", "--strict", str(CHART), check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[ERROR]" not in out.stdout and "[WARNING]" not in out.stdout, out.stdout


@pytest.mark.parametrize(("version", "renders"), [("1.28.9", False), ("1.29.0", True)])
def test_the_real_minimum_is_checked_against_a_clusters_version(
    helm: Helm, version: str, renders: bool
) -> None:
    out = helm.run("template", RELEASE, str(CHART), "--kube-version", version, check=False)
    assert (out.returncode == 0) is renders, out.stderr
    if not renders:
        assert "needs Kubernetes >= 1.29" in out.stderr and f"v{version}" in out.stderr
