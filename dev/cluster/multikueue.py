"""MultiKueue between local clusters: the objects that point a manager
cluster's Kueue at a worker cluster, as a platform team would apply them
(Kueue's MultiKueue setup, with TrainingJob in the generic adapter).

On the worker: a ServiceAccount for the manager's Kueue and the rights Kueue
needs there (``worker_access``): the TrainingJobs it creates, deletes and
reads the status of, and the Workloads it copies there and watches.

On the manager (``manager_objects``): the worker's kubeconfig in a Secret of
Kueue's namespace (key ``kubeconfig``), a MultiKueueCluster naming it, a
MultiKueueConfig listing the workers, and an AdmissionCheck of controller
``kueue.x-k8s.io/multikueue`` pointing at that config; a ClusterQueue that
names the check dispatches its Workloads to the workers.

Both clusters' Kueue also need TrainingJob as an external framework
(kueue.py's Configuration: ``integrations.externalFrameworks`` and
``multiKueue.externalFrameworks``). Standard library only, like kueue.py.
"""

from __future__ import annotations

import base64
import json
from typing import Any

KUEUE_NAMESPACE = "kueue-system"
KUEUE_API = "kueue.x-k8s.io/v1beta2"
CONTROLLER_NAME = "kueue.x-k8s.io/multikueue"
# The key Kueue reads a worker's kubeconfig from (MultiKueueConfigSecretKey).
KUBECONFIG_KEY = "kubeconfig"
WORKER_ACCOUNT = "multikueue-manager"
WORKER_ROLE = "torchfleet-multikueue-worker"
ALL = ["create", "delete", "get", "list", "watch", "update", "patch"]


def worker_rules() -> list[dict[str, Any]]:
    """What the manager's Kueue does on a worker: creates and deletes the
    copies of TrainingJobs and Workloads, watches both, reads the job's status
    (mirrored back), and updates the Workload's (eviction, priority). It
    watches the Jobs of every other integration it has on, too: batch/job,
    which Kueue's Configuration cannot leave out (and the watch of a kind it
    may not read keeps the cluster from connecting)."""
    return [
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch"]},
        {
            "apiGroups": ["torchfleet.dev"],
            "resources": ["trainingjobs"],
            "verbs": ["create", "delete", "get", "list", "watch"],
        },
        {"apiGroups": ["torchfleet.dev"], "resources": ["trainingjobs/status"], "verbs": ["get"]},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ALL},
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "resources": ["workloads/status"],
            "verbs": ["get", "patch", "update"],
        },
    ]


def worker_access(namespace: str = KUEUE_NAMESPACE) -> list[dict[str, Any]]:
    """The worker's ServiceAccount for the manager's Kueue, its ClusterRole and binding."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": WORKER_ACCOUNT, "namespace": namespace},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": WORKER_ROLE},
            "rules": worker_rules(),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": WORKER_ROLE},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": WORKER_ROLE,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": WORKER_ACCOUNT, "namespace": namespace}
            ],
        },
    ]


def worker_kubeconfig(name: str, server: str, ca_pem: bytes, token: str) -> str:
    """A kubeconfig reaching the worker's API server as the manager's ServiceAccount."""
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": name,
                    "cluster": {
                        "server": server,
                        "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                    },
                }
            ],
            "users": [{"name": WORKER_ACCOUNT, "user": {"token": token}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": WORKER_ACCOUNT}}],
            "current-context": name,
        }
    )


def secret_name(worker: str) -> str:
    return f"{worker}-kubeconfig"


def manager_objects(
    check: str, workers: dict[str, str], namespace: str = KUEUE_NAMESPACE
) -> list[dict[str, Any]]:
    """The manager's MultiKueue pieces for ``workers`` (name: kubeconfig):
    a Secret and a MultiKueueCluster per worker, one MultiKueueConfig and the
    AdmissionCheck ``check`` (its config has the same name)."""
    objects: list[dict[str, Any]] = []
    for worker, kubeconfig in workers.items():
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret_name(worker), "namespace": namespace},
                "data": {KUBECONFIG_KEY: base64.b64encode(kubeconfig.encode()).decode()},
            }
        )
        objects.append(
            {
                "apiVersion": KUEUE_API,
                "kind": "MultiKueueCluster",
                "metadata": {"name": worker},
                "spec": {
                    "clusterSource": {
                        "kubeConfig": {"locationType": "Secret", "location": secret_name(worker)}
                    }
                },
            }
        )
    objects.append(
        {
            "apiVersion": KUEUE_API,
            "kind": "MultiKueueConfig",
            "metadata": {"name": check},
            "spec": {"clusters": sorted(workers)},
        }
    )
    objects.append(
        {
            "apiVersion": KUEUE_API,
            "kind": "AdmissionCheck",
            "metadata": {"name": check},
            "spec": {
                "controllerName": CONTROLLER_NAME,
                "parameters": {
                    "apiGroup": "kueue.x-k8s.io",
                    "kind": "MultiKueueConfig",
                    "name": check,
                },
            },
        }
    )
    return objects


def as_list(objects: list[dict[str, Any]]) -> str:
    """One kubectl-applicable document."""
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
