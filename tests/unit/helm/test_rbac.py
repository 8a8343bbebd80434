"""The chart's RBAC: exactly what the operator uses, in both modes, and never
anything an operator of training jobs has no business holding."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fixtures.helm import CI_VALUES, RELEASE_NAMESPACE, Helm, find_object, find_objects

Grant = tuple[str, str, str]  # (apiGroup, resource, verb)


def _grants(*groups: str, resources: tuple[str, ...], verbs: str) -> set[Grant]:
    return {(g, r, v) for g in groups for r in resources for v in verbs.split()}


# Exactly the calls the operator makes (handlers.py, kube.py): kopf lists and
# watches jobs and children (PodGroups too) into its indexes; the operator
# creates the gang, its Service, PVC and PodGroup, deletes pods (gang restarts) and jobs (TTL),
# merge-patches status, posts core Events, and owns children with
# blockOwnerDeletion (which needs finalizers update).
NAMESPACED_GRANTS = (
    _grants("torchfleet.dev", resources=("trainingjobs",), verbs="list watch delete")
    # Runtimes a job's spec.runtimeRef names: read into an index, never written.
    | _grants("torchfleet.dev", resources=("trainingruntimes",), verbs="list watch")
    | _grants("torchfleet.dev", resources=("trainingjobs/status",), verbs="patch")
    | _grants("torchfleet.dev", resources=("trainingjobs/finalizers",), verbs="update")
    | _grants("", resources=("pods",), verbs="list watch create delete")
    | _grants("", resources=("services", "persistentvolumeclaims"), verbs="list watch create")
    | _grants("", resources=("events",), verbs="create")
    # Kueue: a queued job's Workload (created, watched, status applied,
    # spec.active patched for suspend, replaced when the job changed waiting).
    | _grants("kueue.x-k8s.io", resources=("workloads",), verbs="list watch create patch delete")
    | _grants("kueue.x-k8s.io", resources=("workloads/status",), verbs="patch")
)
PODGROUP_GRANTS = {
    group: _grants(group, resources=("podgroups",), verbs="list watch create")
    for group in ("scheduling.x-k8s.io", "scheduling.volcano.sh", "scheduling.k8s.io")
}
# Kubernetes' own gang: the job's Workload is created, and listed by name
# when a create answers 409 (the executor's ownership check); never watched.
# A gang generation's PodGroup is deleted once the generation is over.
PODGROUP_GRANTS["scheduling.k8s.io"] |= _grants(
    "scheduling.k8s.io", resources=("workloads",), verbs="list create"
) | _grants("scheduling.k8s.io", resources=("podgroups",), verbs="delete")
# Cluster-scoped, in both modes: the operator watches nodes (a NotReady node
# loses its pods) and kopf watches CRDs (TrainingJob's coming and going).
CLUSTER_GRANTS = (
    _grants("", resources=("nodes",), verbs="list watch")
    | _grants("torchfleet.dev", resources=("clustertrainingruntimes",), verbs="list watch")
    | _grants("apiextensions.k8s.io", resources=("customresourcedefinitions",), verbs="list watch")
    # Kueue: admitted flavors' placement, and the priority a Workload carries.
    | _grants(
        "kueue.x-k8s.io",
        resources=("resourceflavors", "workloadpriorityclasses"),
        verbs="list watch",
    )
    | _grants("scheduling.k8s.io", resources=("priorityclasses",), verbs="list watch")
)
# Leader election, in the release namespace only: its one Lease read and
# renewed by name, created once (create cannot be limited to a name).
LEASE_GRANTS = _grants("coordination.k8s.io", resources=("leases",), verbs="get update create")
# Namespaced mode only: kopf resolves its --namespace list by watching them.
NAMESPACE_GRANTS = _grants("", resources=("namespaces",), verbs="list watch")

# Never: reading credentials, running code in pods, changing RBAC, acting as
# someone else.
FORBIDDEN_RESOURCES = {
    "secrets",
    "pods/exec",
    "pods/attach",
    "pods/portforward",
    "serviceaccounts/token",
}
FORBIDDEN_VERBS = {"escalate", "bind", "impersonate", "*"}


def grants_of(rules: list[dict[str, Any]]) -> set[Grant]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule["verbs"]
    }


def assert_leader_election_role(objects: list[dict[str, Any]], role: dict[str, Any]) -> None:
    """The Lease grants, for the Lease the operator is told to use, bound to its account."""
    assert role["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert grants_of(role["rules"]) == LEASE_GRANTS
    container = find_object(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    lease = next(
        a.split("=", 1)[1] for a in container["args"] if a.startswith("--leader-elect-name=")
    )
    for rule in role["rules"]:
        names = rule.get("resourceNames")
        assert names == [lease] if set(rule["verbs"]) != {"create"} else names is None, rule
    binding = next(
        b
        for b in find_objects(objects, "RoleBinding")
        if b["roleRef"]["name"] == role["metadata"]["name"]
    )
    account = find_object(objects, "ServiceAccount")["metadata"]["name"]
    assert binding["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": RELEASE_NAMESPACE}
    ]


def test_cluster_wide_mode_grants_exactly_what_the_operator_uses(helm: Helm) -> None:
    objects = helm.template()
    cluster_role = find_object(objects, "ClusterRole")
    expected = CLUSTER_GRANTS | NAMESPACED_GRANTS | set().union(*PODGROUP_GRANTS.values())
    assert grants_of(cluster_role["rules"]) == expected
    # The one Role: leader election's, where the operator runs.
    (lease_role,) = find_objects(objects, "Role")
    assert_leader_election_role(objects, lease_role)

    binding = find_object(objects, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": cluster_role["metadata"]["name"],
    }
    account = find_object(objects, "ServiceAccount")
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": RELEASE_NAMESPACE,
        }
    ]
    deployment = find_object(objects, "Deployment")
    assert (
        deployment["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    )


def test_namespaced_mode_confines_namespaced_grants_to_watched_namespaces(helm: Helm) -> None:
    # ci/namespaced-values.yaml: team-a, team-b (team-a listed twice), Volcano only.
    objects = helm.template([CI_VALUES / "namespaced-values.yaml"])
    roles = find_objects(objects, "Role")
    lease_role = next(r for r in roles if r["metadata"]["namespace"] == RELEASE_NAMESPACE)
    assert_leader_election_role(objects, lease_role)
    roles = [r for r in roles if r is not lease_role]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert (
            grants_of(role["rules"]) == NAMESPACED_GRANTS | PODGROUP_GRANTS["scheduling.volcano.sh"]
        )

    bindings = [
        b
        for b in find_objects(objects, "RoleBinding")
        if b["roleRef"]["name"] != lease_role["metadata"]["name"]
    ]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    account = find_object(objects, "ServiceAccount")["metadata"]["name"]
    for binding in bindings:
        role_in_same_namespace = next(
            r for r in roles if r["metadata"]["namespace"] == binding["metadata"]["namespace"]
        )
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["roleRef"]["name"] == role_in_same_namespace["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": RELEASE_NAMESPACE}
        ]

    # The one ClusterRole left holds cluster-scoped reads only.
    cluster_role = find_object(objects, "ClusterRole")
    assert grants_of(cluster_role["rules"]) == CLUSTER_GRANTS | NAMESPACE_GRANTS


@pytest.mark.parametrize(
    "values_file",
    [None, *sorted(CI_VALUES.glob("*.yaml"))],
    ids=lambda p: p.name if p else "default",
)
def test_no_values_file_grants_secrets_exec_rbac_or_wildcards(helm: Helm, values_file: Any) -> None:
    objects = helm.template([values_file] if values_file else [])
    roles = find_objects(objects, "ClusterRole") + find_objects(objects, "Role")
    assert roles, "the chart rendered no RBAC at all"
    for role in roles:
        for rule in role["rules"]:
            assert "nonResourceURLs" not in rule, rule
            assert "*" not in rule["apiGroups"] and "*" not in rule["resources"], rule
            assert "rbac.authorization.k8s.io" not in rule["apiGroups"], rule
            assert not FORBIDDEN_RESOURCES & set(rule["resources"]), rule
            assert not FORBIDDEN_VERBS & set(rule["verbs"]), rule
            assert "resourceNames" not in rule or rule["resourceNames"], rule


def test_podgroup_access_follows_the_configured_scheduler_apis(helm: Helm) -> None:
    objects = helm.template(set_values={"rbac.podGroupAPIGroups": []})
    groups = {
        g
        for g, resource, _ in grants_of(find_object(objects, "ClusterRole")["rules"])
        if resource == "podgroups"
    }
    assert groups == set()

    objects = helm.template(set_values={"rbac.podGroupAPIGroups": ["scheduling.x-k8s.io"]})
    rules = find_object(objects, "ClusterRole")["rules"]
    assert {g for g, r, _ in grants_of(rules) if r == "podgroups"} == {"scheduling.x-k8s.io"}
    assert ("scheduling.k8s.io", "workloads", "create") not in grants_of(rules)

    # Kubernetes' own gang scheduling: its PodGroups and a create on Workloads.
    objects = helm.template(set_values={"rbac.podGroupAPIGroups": ["scheduling.k8s.io"]})
    rules = find_object(objects, "ClusterRole")["rules"]
    native = {grant for grant in grants_of(rules) if grant[0] == "scheduling.k8s.io"}
    native -= CLUSTER_GRANTS  # Kueue reads PriorityClasses of the same group
    assert native == PODGROUP_GRANTS["scheduling.k8s.io"]


def test_rbac_and_service_account_can_be_left_to_the_cluster_admin(helm: Helm) -> None:
    objects = helm.template(
        set_values={
            "rbac.create": False,
            "serviceAccount.create": False,
            "serviceAccount.name": "ops-managed",
        }
    )
    kinds = {o["kind"] for o in objects}
    assert not kinds & {
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ServiceAccount",
    }
    pod_spec = find_object(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod_spec["serviceAccountName"] == "ops-managed"


def test_an_existing_service_account_must_be_named(helm: Helm) -> None:
    out = helm.run(*helm.template_args(set_values={"serviceAccount.create": False}), check=False)
    assert out.returncode != 0
    assert "serviceAccount.name is required" in out.stderr


@pytest.mark.parametrize(
    "values, strategy, elects, budget",
    [
        pytest.param({}, "RollingUpdate", True, False, id="default: one replica, electing"),
        pytest.param({"operator.replicas": 2}, "RollingUpdate", True, True, id="two replicas"),
        pytest.param({"operator.leaderElection": False}, "Recreate", False, False, id="off"),
    ],
)
def test_replicas_and_leader_election(
    helm: Helm, values: dict[str, Any], strategy: str, elects: bool, budget: bool
) -> None:
    objects = helm.template(set_values=values)
    deployment = find_object(objects, "Deployment")
    assert deployment["spec"]["replicas"] == values.get("operator.replicas", 1)
    assert deployment["spec"]["strategy"]["type"] == strategy
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert ("--leader-elect" in container["args"]) is elects
    assert any(e["name"] == "POD_NAMESPACE" for e in container["env"]) is elects
    assert bool(find_objects(objects, "PodDisruptionBudget")) is budget
    lease_roles = [r for r in find_objects(objects, "Role") if "leader" in r["metadata"]["name"]]
    assert bool(lease_roles) is elects
    # The chart owns the Lease, so uninstall removes it (tests/e2e/test_helm_real_node.py).
    assert bool(find_objects(objects, "Lease")) is elects


def test_two_replicas_without_leader_election_are_refused(helm: Helm) -> None:
    args = helm.template_args(set_values={"operator.replicas": 2, "operator.leaderElection": False})
    out = helm.run(*args, check=False)
    assert out.returncode != 0 and "needs operator.leaderElection" in out.stderr
