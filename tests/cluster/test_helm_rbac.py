"""RBAC proof: the operator runs with nothing but the chart's ServiceAccount
(a token from the TokenRequest API) and still takes a job through its whole
lifecycle; `kubectl auth can-i` shows what that account cannot do."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.cluster import token_kubeconfig
from tests.fixtures.helm import Release
from tests.fixtures.poll import poll

pytestmark = pytest.mark.cluster

# How the apiserver words an RBAC denial: `pods is forbidden: User "..." cannot list ...`.
# Cluster-wide, the operator also works through whatever else the cluster
# holds (another tier's leftovers), so waits are generous.
WAIT = 120
RBAC_REFUSAL = re.compile(r'is forbidden: User "[^"]+" cannot [^\n]*')

ON_FAKE_NODES = {"spec": {"nodeSelector": {"torchfleet.dev/fake-node": "true"}}}
JOB_SPEC = {
    "command": ["python", "train.py"],
    "master": {"template": ON_FAKE_NODES},
    "worker": {"replicas": 1, "template": ON_FAKE_NODES},
    # A gang restart exercises deleting pods; deleting the finished job the
    # delete grant on TrainingJobs.
    "runPolicy": {"restartPolicy": "ExitCode", "ttlSecondsAfterFinished": 2},
}


def service_account_kubeconfig(cluster: Any, release: Release, path: Path) -> str:
    """A kubeconfig that authenticates as the release's ServiceAccount only."""
    return token_kubeconfig(cluster, release.namespace, release.fullname, path)


def another_operator_answers(job_driver: Any, namespace: str, job: str) -> bool:
    """Whether some operator already running picks up a new job within seconds."""
    return bool(
        poll(lambda: job_driver.status(namespace, job) or job_driver.pods(namespace, job), 5, 0.5)
    )


def can_i(cluster: Any, kubeconfig: str, *question: str) -> bool:
    out = cluster.kubectl(f"--kubeconfig={kubeconfig}", "auth", "can-i", *question, check=False)
    assert out.stdout.strip() in {"yes", "no"}, out.stdout + out.stderr
    return out.stdout.strip() == "yes"


def allowed(
    cluster: Any, kubeconfig: str, verb: str, group: str, resource: str, namespace: str
) -> bool:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {
            "resourceAttributes": {
                "verb": verb,
                "group": group,
                "resource": resource,
                "namespace": namespace,
            }
        },
    }
    out = cluster.kubectl(
        f"--kubeconfig={kubeconfig}", "create", "-f", "-", "-o", "json", input=json.dumps(review)
    )
    return bool(json.loads(out.stdout)["status"].get("allowed"))


@pytest.mark.parametrize("mode", ["namespaced", "cluster-wide"])
def test_operator_with_only_the_charts_service_account_runs_a_job_lifecycle(
    mode: str,
    cluster: Any,
    helm_release: Any,
    make_namespace: Any,
    operator_factory: Any,
    job_driver: Any,
    tmp_path: Path,
) -> None:
    system, watched, other = (make_namespace(p) for p in ("tf-system", "team", "other"))
    values = {"operator.watchNamespaces": [watched]} if mode == "namespaced" else {}
    release = helm_release(system, values)
    kubeconfig = service_account_kubeconfig(cluster, release, tmp_path / "operator.kubeconfig")
    deployment = json.loads(
        cluster.kubectl("get", "deployments", "-n", system, "-o", "json").stdout
    )["items"][0]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    lease = next(a.split("=", 1)[1] for a in args if a.startswith("--leader-elect-name="))

    # What the account may and may not do, as the apiserver's authorizer says.
    question: tuple[str, ...]
    for question in (
        ("create", "pods", "-n", watched),
        ("delete", "pods", "-n", watched),
        ("watch", "trainingjobs.torchfleet.dev", "-n", watched),
        ("patch", "trainingjobs.torchfleet.dev", "--subresource=status", "-n", watched),
        ("delete", "trainingjobs.torchfleet.dev", "-n", watched),
        ("create", "events", "-n", watched),
        ("create", "persistentvolumeclaims", "-n", watched),
        ("watch", "nodes"),
        ("get", f"leases.coordination.k8s.io/{lease}", "-n", system),
        ("update", f"leases.coordination.k8s.io/{lease}", "-n", system),
        ("create", "leases.coordination.k8s.io", "-n", system),
    ):
        assert can_i(cluster, kubeconfig, *question), question
    for group in ("scheduling.x-k8s.io", "scheduling.volcano.sh", "scheduling.k8s.io"):
        # The PodGroup CRDs need not be installed, and then `kubectl auth can-i`
        # cannot map the name to a group (it asks about a group-less resource
        # and says no); a SelfSubjectAccessReview asks about the group itself.
        for verb in ("create", "list", "watch"):
            assert allowed(cluster, kubeconfig, verb, group, "podgroups", watched), (verb, group)
        # Only Kubernetes' own: one group per gang generation, deleted after it.
        deletes = allowed(cluster, kubeconfig, "delete", group, "podgroups", watched)
        assert deletes == (group == "scheduling.k8s.io"), group
    # Kubernetes' own gang: the job's Workload is created (and listed by name
    # after a 409), never watched.
    for verb in ("create", "list"):
        assert allowed(cluster, kubeconfig, verb, "scheduling.k8s.io", "workloads", watched)
    assert not allowed(cluster, kubeconfig, "watch", "scheduling.k8s.io", "workloads", watched)
    for question in (
        ("get", "secrets", "-n", watched),
        ("list", "secrets", "-n", system),
        ("create", "pods", "--subresource=exec", "-n", watched),
        ("create", "pods", "--subresource=attach", "-n", watched),
        ("patch", "trainingjobs.torchfleet.dev", "-n", watched),  # spec is the user's
        ("create", "rolebindings.rbac.authorization.k8s.io", "-n", watched),
        ("create", "clusterroles.rbac.authorization.k8s.io"),
        ("impersonate", "serviceaccounts", "-n", watched),
        ("delete", "namespaces"),
        ("delete", "nodes"),
        ("update", "leases.coordination.k8s.io/someone-elses", "-n", system),
        ("delete", f"leases.coordination.k8s.io/{lease}", "-n", system),
        ("create", "leases.coordination.k8s.io", "-n", watched),
    ):
        assert not can_i(cluster, kubeconfig, *question), question
    confined = mode == "namespaced"
    for question in (
        ("create", "pods", "-n", other),
        ("list", "pods", "-n", other),
        ("list", "trainingjobs.torchfleet.dev", "-n", other),
        ("list", "pods", "--all-namespaces"),
    ):
        assert can_i(cluster, kubeconfig, *question) is not confined, question

    # The proof needs this operator to be the only one: another test's
    # operator reconciling every namespace would do the work in its place.
    job_driver.create(other, "elsewhere", JOB_SPEC)
    if another_operator_answers(job_driver, other, "elsewhere"):
        pytest.fail(
            "another operator reconciles TrainingJobs in every namespace of this cluster right "
            "now (a `make demo` or test operator left running cluster-wide?), so this test "
            "cannot show what the chart's RBAC alone allows; stop it and run again"
        )

    # Electing on the chart's Lease, as the chart runs it: it leads (and so
    # reconciles) only if the Lease grants are enough.
    election = {
        "TORCHFLEET_OPERATOR_LEADER_ELECT": "true",
        "POD_NAMESPACE": system,
        "TORCHFLEET_OPERATOR_LEASE_NAME": lease,
    }
    operator = operator_factory(
        kubeconfig=kubeconfig, env=election, namespaces=[watched] if confined else []
    )
    job_driver.create(watched, "llm", JOB_SPEC)
    job_driver.wait_running_pods(watched, "llm", 2, timeout=WAIT)
    job_driver.fail_pod(watched, "llm-worker-0", exit_code=137)  # retryable: a gang restart
    job_driver.wait_running_pods(watched, "llm", 2, restart=1, timeout=WAIT)
    job_driver.wait_phase(watched, "llm", "Running", timeout=WAIT)
    # This operator's own counters: it created both gangs, and it knows only
    # the jobs it may (read now, before the TTL removes "llm").
    created = operator.metric("torchfleet_operator_pods_created_total")
    known_jobs = operator.metric("torchfleet_operator_jobs")
    if confined:
        assert (created, known_jobs) == (4, 1)  # "elsewhere" is invisible to it
    else:
        assert created >= 4 and known_jobs >= 2
    job_driver.succeed_pod(watched, "llm-master-0")
    job_driver.wait_phase(watched, "llm", "Succeeded", timeout=WAIT)
    job_driver.wait_events(watched, "llm", {"GangRunning"})
    job_driver.wait_for(
        "TTL deletion", lambda: job_driver.get(watched, "llm") is None, timeout=WAIT
    )

    # The authorizer refused not one call, the operator's or kopf's. (A 403
    # for a namespace being deleted, from other tests, is not a refusal.)
    refusals = RBAC_REFUSAL.findall(operator.logs(last=100_000))
    assert not refusals, refusals

    if confined:
        # Outside watchNamespaces nothing happened to the job.
        assert job_driver.pods(other, "elsewhere") == []
        assert job_driver.status(other, "elsewhere") == {}
    else:
        job_driver.wait_running_pods(other, "elsewhere", 2, timeout=WAIT)
