"""Kueue beside the local control plane: out of cluster, started on demand.

Kueue (default version pinned in ``kueue/versions.env``, another supported one
by ``TORCHFLEET_KUEUE_VERSION`` or ``Kueue(version=...)``: each has a wrapper
module in ``kueue/gomod/<version>/``) is built from its Go module by
``kueue/build.sh``, which also copies its CRDs and webhook manifests from
the same module into the cache. Here it runs as a local process against the
local apiserver, as a real install would run in a pod:

* its CRDs are applied from the module (server-side: the Workload CRD is
  larger than client-side apply's annotation limit); where Kueue's own
  kustomization converts a CRD's versions through its webhook (0.15+: v1beta1
  <-> v1beta2 for Workload, ClusterQueue, LocalQueue, Cohort,
  MultiKueueCluster), that conversion points at the local webhook server;
* it serves its webhooks on 127.0.0.1 with a certificate signed by the
  cluster's CA; the Mutating/ValidatingWebhookConfigurations from the module
  are registered with ``clientConfig.url`` pointing there (no Service), and
  only the webhooks for Kueue's own objects: a webhook for pods or Jobs would
  put every pod of the cluster behind this process;
* its Configuration: no internal certificate management, no leader election,
  ``manageJobsWithoutQueueName: false``, TrainingJob declared an external
  framework (torchfleet's operator is its job integration) and, for
  MultiKueue (multikueue.py connects a manager to its workers), a framework
  of the generic MultiKueue adapter; the visibility server and provisioning
  off (a fixed port, an API the local cluster lacks). A running Kueue of
  another Configuration is restarted with this one.

Ports come from ``TORCHFLEET_KUEUE_{WEBHOOK,HEALTH,METRICS}_PORT`` (shifted
like the cluster's, localcluster.port). Readiness is Kueue's own ``/readyz``
(true once the webhook server serves). Logs go to the cluster's
``logs/kueue.log`` (``.cluster/`` by default). Standard library only, like
localcluster.py.

    python dev/cluster/localcluster.py up --with kueue
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
NAME = "kueue"
NAMESPACE = "kueue-system"
KUEUE_GROUP = "kueue.x-k8s.io"
# Kueue integrates TrainingJob through torchfleet's operator, as an external framework.
EXTERNAL_FRAMEWORKS = ("TrainingJob.v1alpha1.torchfleet.dev",)
# Off: the visibility API server binds a fixed port (8082) and needs an
# APIService; ProvisioningRequest checks need an API the cluster lacks. 0.17
# has no ProvisioningACC gate (an unknown gate stops Kueue at start): it checks
# for the ProvisioningRequest API instead. MultiKueue stays on in 0.17 (on by
# default, as MultiKueueAdaptersForCustomJobs): it acts only on Workloads of a
# ClusterQueue whose admission check is MultiKueue's; 0.10 has no generic
# adapter for TrainingJob, so it stays off there.
FEATURE_GATES = {
    "v0.10.6": "VisibilityOnDemand=false,MultiKueue=false,ProvisioningACC=false",
    "v0.17.0": "VisibilityOnDemand=false",
}
# Releases whose MultiKueue copies a TrainingJob to a worker cluster (the
# generic adapter for custom jobs, configured by multiKueue.externalFrameworks).
MULTIKUEUE_ADAPTER = {"v0.17.0"}
# The Configuration API each release reads (0.17 reads v1beta1 too, converting).
CONFIG_API = {
    "v0.10.6": "config.kueue.x-k8s.io/v1beta1",
    "v0.17.0": "config.kueue.x-k8s.io/v1beta2",
}
# Releases that read the metrics certificate from /etc/kueue/metrics/certs.
METRICS_CERTS_FROM_ETC = {"v0.17.0"}
WEBHOOK_CONFIG_NAMES = {
    "MutatingWebhookConfiguration": "kueue-mutating-webhook-configuration",
    "ValidatingWebhookConfiguration": "kueue-validating-webhook-configuration",
}


def _port(variable: str, default: int) -> int:
    from localcluster import port  # beside this file, loaded first

    return int(port(variable, default))


@dataclass(frozen=True)
class KueuePorts:
    webhook: int = field(default_factory=lambda: _port("TORCHFLEET_KUEUE_WEBHOOK_PORT", 19443))
    health: int = field(default_factory=lambda: _port("TORCHFLEET_KUEUE_HEALTH_PORT", 18081))
    metrics: int = field(default_factory=lambda: _port("TORCHFLEET_KUEUE_METRICS_PORT", 18080))


def pinned_version() -> str:
    """TORCHFLEET_KUEUE_VERSION, else the default in kueue/versions.env."""
    if os.environ.get("TORCHFLEET_KUEUE_VERSION"):
        return os.environ["TORCHFLEET_KUEUE_VERSION"]
    for line in (HERE / "kueue" / "versions.env").read_text().splitlines():
        if line.startswith("KUEUE_VERSION="):
            return line.split("=", 1)[1].strip()
    raise RuntimeError("kueue/versions.env has no KUEUE_VERSION")


def supported_versions() -> list[str]:
    """The versions with a wrapper module, oldest first."""
    found = [p.name for p in (HERE / "kueue" / "gomod").iterdir() if p.is_dir()]
    return sorted(found, key=lambda v: tuple(int(x) for x in v.lstrip("v").split(".")))


def build(version: str) -> Path:
    """The cache folder with bin/kueue, crds/, webhooks.yaml and conversion/
    for ``version`` (built when missing)."""
    out = subprocess.run(
        [str(HERE / "kueue" / "build.sh")],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "KUEUE_VERSION": version},
    )
    return Path(out.stdout.strip().splitlines()[-1])


class Kueue:
    def __init__(
        self, cluster: Any, ports: KueuePorts | None = None, version: str | None = None
    ) -> None:
        self.cluster = cluster  # a localcluster.LocalCluster
        self.version = version or pinned_version()
        if self.version not in FEATURE_GATES:
            raise ValueError(
                f"Kueue {self.version} is not supported here (supported: {sorted(FEATURE_GATES)})"
            )
        # localcluster's helpers, from the module object the cluster came from
        # (``__main__`` when run as a script, ``localcluster`` under pytest).
        self.lc: ModuleType = sys.modules[type(cluster).__module__]
        self.ports = ports or KueuePorts()
        self.root = cluster.root / NAME
        self.certs = self.root / "certs"
        self.config_file = self.root / "config.json"

    # ---- lifecycle -------------------------------------------------------

    def up(self) -> None:
        """Starts Kueue (or keeps a healthy one) against the running cluster."""
        log, wait_for = self.lc.log, self.lc.wait_for
        built = build(self.version)
        if (
            self.healthy()
            and self.running_version() == self.version
            and self._config_text() == self._running_config()
        ):
            log(f"reusing the running kueue {self.version}")
        else:
            self.down(quiet=True)
            previous = self.running_version()
            if previous and previous != self.version:
                # Another release's objects (stored as v1beta2 by 0.15+) cannot
                # be served by 0.10's CRDs: start from none.
                self._remove_crds(built / "crds")
            self.root.mkdir(parents=True, exist_ok=True)
            link = self.cluster.bin / NAME
            link.unlink(missing_ok=True)
            link.symlink_to(built / "bin" / NAME)
            self._install_crds(built / "crds")
            self._point_conversion(built / "conversion")
            self._make_serving_cert()
            self._write_config()
            self.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(_namespace()))
            self._launch()
            (self.root / "version").write_text(self.version)
            wait_for(self._ready, "kueue /readyz", 120)
        # Registered only once Kueue serves them: a webhook with failurePolicy
        # Fail and nobody behind it would refuse every Kueue object.
        self._register_webhooks(built / "webhooks.yaml")
        wait_for(self._webhooks_answer, "kueue webhooks answering through the apiserver", 60)
        log(f"kueue {self.version} ready (webhook 127.0.0.1:{self.ports.webhook})")

    def down(self, quiet: bool = False) -> None:
        pid = self.cluster._pid(NAME)
        if pid is not None:
            # Unregister first, so the apiserver stops calling a webhook that is going away.
            if self.cluster._https_ok(self.cluster.ports.apiserver, "/readyz"):
                for kind, name in WEBHOOK_CONFIG_NAMES.items():
                    self.cluster.kubectl("delete", kind, name, "--ignore-not-found")
            self.lc.stop_process(pid)
            if not quiet:
                self.lc.log(f"stopped {NAME} (pid {pid})")
        (self.cluster.run / f"{NAME}.pid").unlink(missing_ok=True)

    def healthy(self) -> bool:
        return self.cluster._pid(NAME) is not None and self._ready()

    def running_version(self) -> str | None:
        marker = self.root / "version"
        return marker.read_text().strip() if marker.exists() else None

    # ---- pieces ----------------------------------------------------------

    def _launch(self) -> None:
        if self.version not in METRICS_CERTS_FROM_ETC:
            self.cluster._start(NAME, self._args())
            return
        # Kueue 0.17 without internal cert management reads its metrics
        # server's certificate from the fixed path /etc/kueue/metrics/certs
        # (cmd/kueue/main.go) and exits without it. Rather than write to the
        # machine's /etc, Kueue runs in a mount namespace of its own where /etc
        # is an overlay (on a private tmpfs) holding the serving certificate.
        private = self.root / "private"
        private.mkdir(exist_ok=True)
        script = (
            'set -e; p="$1"; certs="$2"; shift 2; '
            'mount -t tmpfs tmpfs "$p"; mkdir "$p/upper" "$p/work"; '
            'mount -t overlay overlay -o "lowerdir=/etc,upperdir=$p/upper,workdir=$p/work" /etc; '
            "mkdir -p /etc/kueue/metrics/certs; "
            'cp "$certs/tls.crt" "$certs/tls.key" /etc/kueue/metrics/certs/; '
            'exec "$@"'
        )
        unshare = ["-m", "--propagation", "private"]
        if os.geteuid() != 0:
            unshare.append("--map-root-user")
        self.cluster._start(
            NAME,
            [
                *unshare,
                "sh",
                "-c",
                script,
                "kueue-in-namespace",
                str(private),
                str(self.certs),
                str(self.cluster.bin / NAME),
                *self._args(),
            ],
            program=shutil.which("unshare") or "unshare",
        )

    def _args(self) -> list[str]:
        return [
            f"--config={self.config_file}",
            f"--kubeconfig={self.cluster.kubeconfig}",
            f"--feature-gates={FEATURE_GATES[self.version]}",
            "--zap-log-level=2",
        ]

    def _install_crds(self, crds: Path) -> None:
        files = sorted(crds.glob("*.yaml"))
        args = [arg for f in files for arg in ("-f", str(f))]
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", *args)
        names = [f.stem.split("_", 1)[1] + "." + KUEUE_GROUP for f in files]

        def established() -> bool:
            listed = json.loads(self.cluster.kubectl("get", "crd", *names, "-o", "json"))
            return all(
                any(
                    c["type"] == "Established" and c["status"] == "True"
                    for c in (crd.get("status") or {}).get("conditions") or []
                )
                for crd in listed["items"]
            )

        self.lc.wait_for(established, "kueue CRDs Established", 60)

    def _remove_crds(self, crds: Path) -> None:
        names = [f.stem.split("_", 1)[1] + "." + KUEUE_GROUP for f in sorted(crds.glob("*.yaml"))]
        self.cluster.kubectl("delete", "crd", *names, "--ignore-not-found", "--wait=true")

    def _point_conversion(self, patches: Path) -> None:
        """The CRDs Kueue converts between versions call the local webhook
        server (Kueue's manifests name an in-cluster Service)."""
        ca = base64.b64encode((self.cluster.pki / "ca.crt").read_bytes()).decode()
        for patch in sorted(patches.glob("webhook_in_*.yaml")):
            crd = json_documents(
                self.cluster.kubectl("create", "--dry-run=client", "-o", "json", "-f", str(patch))
            )[0]
            webhook = crd["spec"]["conversion"]["webhook"]
            path = (webhook["clientConfig"].get("service") or {}).get("path", "/convert")
            conversion = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{self.ports.webhook}{path}",
                        "caBundle": ca,
                    },
                    "conversionReviewVersions": webhook["conversionReviewVersions"],
                },
            }
            self.cluster.kubectl(
                "patch",
                "crd",
                crd["metadata"]["name"],
                "--type=merge",
                "-p",
                json.dumps({"spec": {"conversion": conversion}}),
            )

    def _make_serving_cert(self) -> None:
        self.certs.mkdir(parents=True, exist_ok=True)
        pki = self.cluster.pki
        if not (pki / "kueue-webhook.crt").exists():
            self.cluster._signed_cert(
                "kueue-webhook",
                "/CN=kueue-webhook",
                "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth",
            )
        # controller-runtime's webhook server reads tls.crt / tls.key from certDir.
        shutil.copyfile(pki / "kueue-webhook.crt", self.certs / "tls.crt")
        shutil.copyfile(pki / "kueue-webhook.key", self.certs / "tls.key")

    def _running_config(self) -> str | None:
        return self.config_file.read_text() if self.config_file.exists() else None

    def _write_config(self) -> None:
        self.config_file.write_text(self._config_text())

    def _config_text(self) -> str:
        config: dict[str, Any] = {
            "apiVersion": CONFIG_API[self.version],
            "kind": "Configuration",
            "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.ports.health}"},
            "metrics": {"bindAddress": f"127.0.0.1:{self.ports.metrics}"},
            "webhook": {
                "port": self.ports.webhook,
                "host": "127.0.0.1",
                "certDir": str(self.certs),
            },
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "manageJobsWithoutQueueName": False,
            "integrations": {
                # Kueue insists on one built-in framework; batch/job manages only
                # Jobs that carry a queue name, and its webhook is not registered.
                "frameworks": ["batch/job"],
                "externalFrameworks": list(EXTERNAL_FRAMEWORKS),
            },
        }
        if self.version in MULTIKUEUE_ADAPTER:
            config["multiKueue"] = {
                "externalFrameworks": [{"name": name} for name in EXTERNAL_FRAMEWORKS],
                # Remote objects whose manager-side Workload is gone go soon.
                "gcInterval": "30s",
                # A job on a worker that stopped answering is dispatched again
                # after 20 s, not Kueue's 15 minutes (tests wait on it).
                "workerLostTimeout": "20s",
            }
        # JSON is YAML: Kueue reads either.
        return json.dumps(config, indent=2)

    def _register_webhooks(self, manifests: Path) -> None:
        converted = self.cluster.kubectl(
            "create", "--dry-run=client", "-o", "json", "-f", str(manifests)
        )
        ca = base64.b64encode((self.cluster.pki / "ca.crt").read_bytes()).decode()
        objects = [
            local_webhook_configuration(obj, self.ports.webhook, ca)
            for obj in json_documents(converted)
        ]
        self.cluster.kubectl(
            "apply",
            "-f",
            "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
        )

    def _ready(self) -> bool:
        return self.cluster._http_ok(f"http://127.0.0.1:{self.ports.health}/readyz")

    def _webhooks_answer(self) -> bool:
        """A server-side dry run of a ResourceFlavor goes through Kueue's webhooks."""
        flavor = {
            "apiVersion": f"{KUEUE_GROUP}/v1beta1",
            "kind": "ResourceFlavor",
            "metadata": {"name": "torchfleet-webhook-probe"},
        }
        try:
            self.cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(flavor))
        except self.lc.ClusterError:
            return False
        return True


def local_webhook_configuration(obj: dict[str, Any], port: int, ca_bundle: str) -> dict[str, Any]:
    """Kueue's webhook configuration, kept to its own objects and pointed at 127.0.0.1."""
    webhooks = []
    for hook in obj.get("webhooks") or []:
        groups = {g for rule in hook.get("rules") or [] for g in rule.get("apiGroups") or []}
        if groups != {KUEUE_GROUP}:
            continue
        path = (hook["clientConfig"].get("service") or {}).get("path", "/")
        hook = {
            **hook,
            "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle},
        }
        webhooks.append(hook)
    kind = obj["kind"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": kind,
        "metadata": {
            "name": WEBHOOK_CONFIG_NAMES[kind],
            "labels": {"app.kubernetes.io/name": NAME},
        },
        "webhooks": webhooks,
    }


def json_documents(text: str) -> list[dict[str, Any]]:
    """kubectl prints one JSON object per input document, back to back."""
    decoder = json.JSONDecoder()
    found, at = [], 0
    while at < len(text):
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            break
        obj, at = decoder.raw_decode(text, at)
        found.extend(obj.get("items", [obj]) if obj.get("kind") == "List" else [obj])
    return found


def _namespace() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
