"""`helm install` into the real cluster, the first job from NOTES.txt, and a
`helm uninstall` that leaves no operator object behind (the CRD stays)."""

from __future__ import annotations

import re
import textwrap
from typing import Any

import pytest
import yaml

from tests.fixtures.helm import CI_VALUES, Helm
from tests.fixtures.poll import wait_for

pytestmark = pytest.mark.cluster

CRD_NAME = "trainingjobs.torchfleet.dev"
CRD = f"customresourcedefinition/{CRD_NAME}"
NAMESPACED_KINDS = (
    "deployments,replicasets,pods,services,serviceaccounts,configmaps,roles,rolebindings"
)
CLUSTER_KINDS = "clusterroles,clusterrolebindings"


def first_job_from_notes(notes: str) -> str:
    """The TrainingJob manifest NOTES.txt tells the user to apply."""
    match = re.search(r"cat <<'YAML' \| kubectl -n (\S+) apply -f -\n(.*?)\n\s*YAML\n", notes, re.S)
    assert match, f"NOTES.txt has no first job:\n{notes}"
    return textwrap.dedent(match[2])


def release_objects(cluster: Any, kinds: str, release: str, namespace: str | None) -> list[str]:
    where = ["-n", namespace] if namespace else []
    out = cluster.kubectl(
        "get", kinds, *where, "-l", f"app.kubernetes.io/instance={release}", "-o", "name"
    )
    return out.stdout.split()


def wait_for_operator_pod(cluster: Any, namespace: str, release: str) -> dict[str, Any]:
    """The pod the Deployment's ReplicaSet creates; fails with the ReplicaSet's
    events when admission (e.g. Pod Security) refused it."""
    selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component=operator"

    def refusals() -> str:
        events = cluster.kubectl("get", "events", "-n", namespace, "-o", "name").stdout
        refused = cluster.kubectl(
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            "reason=FailedCreate",
            "-o",
            "json",
        ).stdout
        return f"events: {events}\n{refused}"

    pods = wait_for(
        "the operator pod",
        lambda: cluster.get_json("pods", "-n", namespace, "-l", selector)["items"],
        60,
        interval=0.5,
        explain=refusals,
    )
    return dict(pods[0])


@pytest.mark.parametrize(
    "values_file",
    [None, *sorted(CI_VALUES.glob("*.yaml"))],
    ids=lambda p: p.name if p else "default",
)
def test_every_rendered_object_passes_strict_server_validation(
    cluster: Any, helm: Helm, namespace: str, values_file: Any, operator_crd: None
) -> None:
    # Unknown or misplaced fields fail here, which a client-side render hides.
    # Watched namespaces must exist for their Roles; Prometheus Operator kinds
    # are left out (this cluster has no such CRDs); the chart's own CRDs are
    # there, as Helm installs them first (the shipped runtimes need theirs).
    objects = helm.template(
        [values_file] if values_file else [],
        set_values={"operator.watchNamespaces": [namespace]},
        namespace=namespace,
    )
    objects = [o for o in objects if not o["apiVersion"].startswith("monitoring.coreos.com/")]
    for obj in objects:
        if obj["kind"] == "ConfigMap":  # the dashboard's namespace is Grafana's
            obj["metadata"]["namespace"] = namespace
    out = cluster.kubectl(
        "apply",
        "--dry-run=server",
        "--validate=strict",
        "-f",
        "-",
        input=yaml.safe_dump_all(objects),
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("(server dry run)") == len(objects), out.stdout


def test_install_serves_the_first_job_and_uninstall_leaves_only_the_crd(
    cluster: Any, helm: Helm, helm_release: Any, namespace: str, operator_crd: None
) -> None:
    # The operator pod must pass the "restricted" Pod Security Standard.
    cluster.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    release = helm_release(namespace, {"operator.watchNamespaces": [namespace]})
    notes = release.install_output
    assert f"rollout status deployment/{release.fullname}-operator" in notes

    # Every object the chart renders was admitted by the apiserver.
    namespaced = release_objects(cluster, NAMESPACED_KINDS, release.name, namespace)
    for expected in (
        f"deployment.apps/{release.fullname}-operator",
        f"service/{release.fullname}-metrics",
        f"serviceaccount/{release.fullname}",
        f"role.rbac.authorization.k8s.io/{release.fullname}-operator",
        f"rolebinding.rbac.authorization.k8s.io/{release.fullname}-operator",
    ):
        assert expected in namespaced, (expected, namespaced)
    assert release_objects(cluster, CLUSTER_KINDS, release.name, None) == [
        f"clusterrole.rbac.authorization.k8s.io/{release.fullname}-operator",
        f"clusterrolebinding.rbac.authorization.k8s.io/{release.fullname}-operator",
    ]

    pod = wait_for_operator_pod(cluster, namespace, release.name)
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True

    # The first job NOTES.txt gives is one the CRD accepts as written.
    manifest = first_job_from_notes(notes)
    applied = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=manifest
    )
    assert "trainingjob.torchfleet.dev/hello-ddp created (server dry run)" in applied.stdout

    helm.run(
        "uninstall", release.name, "--namespace", namespace, "--wait", kubeconfig=cluster.kubeconfig
    )
    assert release_objects(cluster, CLUSTER_KINDS, release.name, None) == []
    # The garbage collector removes the ReplicaSet and pod after the Deployment.
    wait_for(
        "the garbage collector to delete the release's namespaced objects",
        lambda: release_objects(cluster, NAMESPACED_KINDS, release.name, namespace) == [],
        60,
        interval=0.5,
        explain=lambda: str(release_objects(cluster, NAMESPACED_KINDS, release.name, namespace)),
    )
    # Helm never deletes what it installed from crds/: user jobs survive.
    assert cluster.kubectl("get", CRD, "-o", "name").stdout.strip().endswith(CRD_NAME)
