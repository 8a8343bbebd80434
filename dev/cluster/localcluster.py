"""A real Kubernetes control plane on loopback, for tests and the demo.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK, built
from Go modules by build.sh, run as local processes with their state under
``.cluster/``. KWOK plays the kubelet for fake GPU nodes; pod and node
behaviour on demand comes from the Stage files in ``stages/``, except for
confirming a pod's deletion, which fake_kubelet.py does (by UID, as a kubelet).

A second cluster can run beside the first (``make test`` runs its e2e tier on
one): ``TORCHFLEET_CLUSTER_DIR`` moves the state (relative to the repository,
default ``.cluster``), ``TORCHFLEET_CLUSTER_PORT_OFFSET`` shifts every port
(each ``TORCHFLEET_*_PORT`` variable, or its default). ``down`` and ``status``
need the same two values as ``up``.

    python dev/cluster/localcluster.py up      # start, or reuse a running one
    python dev/cluster/localcluster.py up --with kueue   # plus Kueue (kueue.py)
    python dev/cluster/localcluster.py down    # stop every component
    python dev/cluster/localcluster.py status

Standard library only, so it runs before the project's venv exists. Start-up
waits on each component's readiness endpoint, never on sleeps.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
TOOLS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "helm",
)
# Started in this order, stopped in reverse. fake-kubelet (fake_kubelet.py)
# confirms pod deletions on KWOK's nodes, as a kubelet does: by UID.
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "fake-kubelet",
)
# Started on demand beside the control plane (``up --with NAME``), each by
# dev/cluster/NAME.py, whose class NAME.capitalize() takes this cluster.
ADDONS = ("kueue",)
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
STATE_DIR = REPO / os.environ.get("TORCHFLEET_CLUSTER_DIR", ".cluster")
PORT_OFFSET = int(os.environ.get("TORCHFLEET_CLUSTER_PORT_OFFSET", "0"))


def kubernetes_version() -> str:
    """TORCHFLEET_KUBERNETES_VERSION, else the default in versions.env."""
    if os.environ.get("TORCHFLEET_KUBERNETES_VERSION"):
        return os.environ["TORCHFLEET_KUBERNETES_VERSION"]
    for line in (HERE / "versions.env").read_text().splitlines():
        if line.startswith("KUBERNETES_VERSION="):
            return line.split("=", 1)[1].strip()
    raise RuntimeError("versions.env has no KUBERNETES_VERSION")


KUBERNETES_VERSION = kubernetes_version()


@dataclass(frozen=True)
class NativeGang:
    """Kubernetes' own gang scheduling (KEP-4671) as a release serves it: the
    feature gates every component that reads them needs, and the API group
    version of its Workload and PodGroup, which is off unless asked for."""

    gates: str
    api: str


# By minor release (read from each release's pkg/features/kube_features.go).
# 1.36: alpha, scheduling.k8s.io/v1alpha2, GangScheduling needs GenericWorkload.
# 1.37: beta, scheduling.k8s.io/v1beta1 (v1alpha2 gone); the GangScheduling
# gate is gone too, GenericWorkload alone enables the scheduler's plugin.
NATIVE_GANG = {
    "1.36": NativeGang("GenericWorkload=true,GangScheduling=true", "scheduling.k8s.io/v1alpha2"),
    "1.37": NativeGang("GenericWorkload=true", "scheduling.k8s.io/v1beta1"),
}


def native_gang(version: str = KUBERNETES_VERSION) -> NativeGang:
    minor = ".".join(version.lstrip("v").split(".")[:2])
    if minor not in NATIVE_GANG:
        supported = ", ".join(sorted(NATIVE_GANG))
        raise ClusterError(f"Kubernetes {version} is not supported here (supported: {supported})")
    return NATIVE_GANG[minor]


def port(variable: str, default: int) -> int:
    """A component's port: ``$variable`` or ``default``, shifted by the offset
    (kueue.py and schedulers.py, loaded beside this file, use it too)."""
    return int(os.environ.get(variable, default)) + PORT_OFFSET


@dataclass(frozen=True)
class Ports:
    etcd_client: int = port("TORCHFLEET_ETCD_PORT", 12379)
    etcd_peer: int = port("TORCHFLEET_ETCD_PEER_PORT", 12380)
    apiserver: int = port("TORCHFLEET_APISERVER_PORT", 16443)
    controller_manager: int = port("TORCHFLEET_KCM_PORT", 10357)
    scheduler: int = port("TORCHFLEET_SCHEDULER_PORT", 10359)
    kwok: int = port("TORCHFLEET_KWOK_PORT", 10347)


class ClusterError(RuntimeError):
    pass


class LocalCluster:
    def __init__(self, root: Path = STATE_DIR, ports: Ports | None = None) -> None:
        self.root = root
        self.ports = ports or Ports()
        self.pki = root / "pki"
        self.logs = root / "logs"
        self.run = root / "run"
        self.bin = root / "bin"
        self.kubeconfig = root / "kubeconfig"
        # The API server's own record of who did what (see AUDIT_POLICY).
        self.audit_log = self.logs / "audit.log"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    # ---- lifecycle -------------------------------------------------------

    def up(self, nodes: int = 4) -> None:
        started = self.root / "kubernetes-version"
        same = started.exists() and started.read_text() == KUBERNETES_VERSION
        if same and self.healthy():
            log(f"reusing the running cluster (KUBECONFIG={self.kubeconfig})")
            return
        self.down(quiet=True)
        started.unlink(missing_ok=True)
        built = build_tools()
        for d in (self.pki, self.logs, self.run, self.bin):
            d.mkdir(parents=True, exist_ok=True)
        self._link_tools(built)
        self._make_pki()
        self._write_kubeconfigs()
        (self.root / "audit-policy.json").write_text(json.dumps(AUDIT_POLICY))
        self.audit_log.unlink(missing_ok=True)
        shutil.rmtree(self.root / "etcd", ignore_errors=True)
        t0 = time.monotonic()
        self._start("etcd", self._etcd_args())
        wait_for(
            lambda: self._http_ok(f"http://127.0.0.1:{self.ports.etcd_client}/health"),
            "etcd /health",
        )
        self._age_etcd()
        self._start("kube-apiserver", self._apiserver_args())
        wait_for(
            lambda: self._https_ok(self.ports.apiserver, "/readyz"), "kube-apiserver /readyz", 120
        )
        self._start("kube-controller-manager", self._controller_manager_args())
        self._start("kube-scheduler", self._scheduler_args())
        wait_for(
            lambda: self._https_ok(self.ports.controller_manager, "/healthz"),
            "controller-manager /healthz",
        )
        wait_for(lambda: self._https_ok(self.ports.scheduler, "/healthz"), "scheduler /healthz")
        self._start("kwok", self._kwok_args())
        wait_for(
            lambda: self._http_ok(f"http://127.0.0.1:{self.ports.kwok}/healthz"), "kwok /healthz"
        )
        ready = self.run / "fake-kubelet.ready"
        ready.unlink(missing_ok=True)
        self._start(
            "fake-kubelet",
            [
                str(HERE / "fake_kubelet.py"),
                f"--root={self.root}",
                f"--port={self.ports.apiserver}",
            ],
            program=sys.executable,
        )
        wait_for(ready.exists, "fake-kubelet's first list of pods")
        self._create_fake_nodes(nodes)
        wait_for(lambda: self._ready_nodes() >= nodes, f"{nodes} fake nodes Ready", 60)
        wait_for(self._default_service_account_exists, "default ServiceAccount", 60)
        # A cluster of another release (TORCHFLEET_KUBERNETES_VERSION) is never reused.
        started.write_text(KUBERNETES_VERSION)
        log(
            f"Kubernetes {KUBERNETES_VERSION} ready in {time.monotonic() - t0:.1f}s: "
            f"export KUBECONFIG={self.kubeconfig}"
        )

    def addon(self, name: str) -> Any:
        """The add-on ``name`` (e.g. Kueue) bound to this cluster."""
        module = load_addon(name)
        return getattr(module, name.capitalize())(self)

    def down(self, quiet: bool = False) -> None:
        # A real node first (dev/realnode): its containers, shims and mounts go
        # with containerd, and stopping only its pid files would orphan them.
        if (self.root / "realnode").exists():
            load_realnode().RealNode(self).down(quiet)
        for addon in ADDONS:
            if self._pid(addon) is not None:
                self.addon(addon).down(quiet)
        # Other add-ons started beside the cluster (schedulers.py), by pid file.
        extras = sorted(p.stem for p in self.run.glob("*.pid") if p.stem not in COMPONENTS)
        for name in [*extras, *reversed(COMPONENTS)]:
            pid = self._pid(name)
            if pid is None:
                continue
            stop_process(pid)
            (self.run / f"{name}.pid").unlink(missing_ok=True)
            if not quiet:
                log(f"stopped {name} (pid {pid})")

    def healthy(self) -> bool:
        if not self.kubeconfig.exists():
            return False
        if any(self._pid(name) is None for name in COMPONENTS):
            return False
        return self._https_ok(self.ports.apiserver, "/readyz")

    def status(self) -> dict[str, object]:
        return {
            "kubeconfig": str(self.kubeconfig),
            "server": self.server,
            "healthy": self.healthy(),
            "pids": {name: self._pid(name) for name in (*COMPONENTS, *ADDONS)},
        }

    # ---- processes -------------------------------------------------------

    def _start(self, name: str, args: list[str], program: str | None = None) -> None:
        logfile = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
        # The cluster's own TMPDIR: it outlives the test session or command that
        # started it, whose TMPDIR may be gone by then (tests/conftest.py).
        tmp = self.root / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            [program or str(self.bin / name), *args],
            stdout=logfile,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.root,
            env={**os.environ, "TMPDIR": str(tmp)},
            start_new_session=True,  # outlives `make cluster-up`; stopped by `down`
        )
        logfile.close()
        (self.run / f"{name}.pid").write_text(str(proc.pid))

    def _pid(self, name: str) -> int | None:
        try:
            pid = int((self.run / f"{name}.pid").read_text())
        except (FileNotFoundError, ValueError):
            return None
        return pid if process_alive(pid) else None

    # ---- component flags -------------------------------------------------

    def _etcd_args(self) -> list[str]:
        client = f"http://127.0.0.1:{self.ports.etcd_client}"
        peer = f"http://127.0.0.1:{self.ports.etcd_peer}"
        return [
            "--name=torchfleet",
            f"--data-dir={self.root / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=torchfleet={peer}",
            # A throwaway test store: durability buys nothing, fsync costs seconds.
            "--unsafe-no-fsync=true",
            "--quota-backend-bytes=4294967296",
            "--log-level=warn",
        ]

    def _apiserver_args(self) -> list[str]:
        p = self.pki
        return [
            f"--etcd-servers=http://127.0.0.1:{self.ports.etcd_client}",
            # Every address of the machine, its own included: there pods on
            # the real node reach it (no kube-proxy; dev/realnode/README.md).
            "--bind-address=0.0.0.0",
            "--advertise-address=127.0.0.1",
            # A loopback address is no endpoint for the kubernetes Service:
            # none is published (1.36 published none for it silently; 1.37
            # refuses to start: "cannot use public IP 127.0.0.1 with endpoint
            # reconciler"). Pods reach the API server as dev/realnode says.
            "--endpoint-reconciler-type=none",
            f"--secure-port={self.ports.apiserver}",
            f"--tls-cert-file={p / 'apiserver.crt'}",
            f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16",
            # RBAC is on so that least-privilege tests mean something.
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
            # Pods on a NotReady node are evicted after 10s instead of 300s, so
            # node-loss tests take seconds. Real clusters keep the default.
            "--default-not-ready-toleration-seconds=10",
            "--default-unreachable-toleration-seconds=10",
            "--profiling=false",
            # As kubeadm sets it: a real node's name (dev/realnode) does not
            # resolve here, its InternalIP does (logs, exec).
            "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
            # Its identity towards a real kubelet, which admits only the CA's.
            f"--kubelet-client-certificate={p / 'admin.crt'}",
            f"--kubelet-client-key={p / 'admin.key'}",
            f"--audit-policy-file={self.root / 'audit-policy.json'}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-maxsize=200",
            "--audit-log-maxbackup=2",
            # Kubernetes' own gang scheduling (NATIVE_GANG): the Workload and
            # PodGroup objects of its scheduling.k8s.io version and the pods'
            # spec.schedulingGroup field. Pods without a schedulingGroup are
            # scheduled as before.
            f"--feature-gates={native_gang().gates}",
            f"--runtime-config={native_gang().api}=true",
            "--v=1",
        ]

    def _component_auth_args(self) -> list[str]:
        kc = str(self.kubeconfig)
        return [
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
        ]

    def _controller_manager_args(self) -> list[str]:
        return [
            *self._component_auth_args(),
            f"--secure-port={self.ports.controller_manager}",
            f"--service-account-private-key-file={self.pki / 'sa.key'}",
            f"--root-ca-file={self.pki / 'ca.crt'}",
            # Every default controller: garbage collector, namespace, node
            # lifecycle, service accounts, endpoints, taint eviction, ...
            "--controllers=*",
            "--node-monitor-grace-period=20s",
            f"--feature-gates={native_gang().gates}",
            "--v=1",
        ]

    def _scheduler_args(self) -> list[str]:
        # With the gates on, the default profile enables the GangScheduling
        # plugin (pkg/scheduler/apis/config/v1/default_plugins.go).
        return [
            *self._component_auth_args(),
            f"--secure-port={self.ports.scheduler}",
            f"--feature-gates={native_gang().gates}",
            "--v=1",
        ]

    def _kwok_args(self) -> list[str]:
        stages = sorted(str(p) for p in (HERE / "stages").glob("*.yaml"))
        return [
            f"--kubeconfig={self.kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
            "--cidr=10.244.0.1/16",
            "--node-ip=10.250.0.1",
            "--node-lease-duration-seconds=40",
            f"--server-address=127.0.0.1:{self.ports.kwok}",
            f"--config={','.join(stages)}",
        ]

    # ---- certificates and kubeconfig -----------------------------------

    def _make_pki(self) -> None:
        p = self.pki
        if (p / "admin.crt").exists():
            self._apiserver_cert()  # the machine's address may be new
            return
        openssl(
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "3650",
            "-keyout",
            p / "ca.key",
            "-out",
            p / "ca.crt",
            "-subj",
            "/CN=torchfleet-local-ca",
        )
        self._apiserver_cert()
        # system:masters is the cluster-admin group; tests and the control
        # plane components use it. Least-privilege tests mint their own tokens.
        self._signed_cert(
            "admin", "/O=system:masters/CN=torchfleet-admin", "extendedKeyUsage=clientAuth"
        )
        openssl("genrsa", "-out", p / "sa.key", "2048")
        openssl("rsa", "-in", p / "sa.key", "-pubout", "-out", p / "sa.pub")

    def _apiserver_cert(self) -> None:
        """The API server's serving certificate, (re)issued when its names
        change: besides the loopback and Service names, the machine's own
        address, where pods on the real node reach it (dev/realnode)."""
        sans = (
            "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,"
            "DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:10.96.0.1"
        )
        with contextlib.suppress(RuntimeError):
            sans += f",IP:{load_realnode().host_ip()}"
        issued = self.pki / "apiserver.sans"
        if issued.exists() and issued.read_text() == sans:
            return
        self._signed_cert("apiserver", "/CN=kube-apiserver", f"subjectAltName={sans}")
        issued.write_text(sans)

    def _signed_cert(self, name: str, subject: str, extension: str) -> None:
        p = self.pki
        openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            p / f"{name}.key",
            "-out",
            p / f"{name}.csr",
            "-subj",
            subject,
        )
        openssl(
            "x509",
            "-req",
            "-in",
            p / f"{name}.csr",
            "-CA",
            p / "ca.crt",
            "-CAkey",
            p / "ca.key",
            "-CAcreateserial",
            "-days",
            "3650",
            "-out",
            p / f"{name}.crt",
            "-extfile",
            "/dev/stdin",
            stdin=extension,
        )

    def _write_kubeconfigs(self) -> None:
        p = self.pki
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "torchfleet",
                    "cluster": {"server": self.server, "certificate-authority": str(p / "ca.crt")},
                }
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {
                        "client-certificate": str(p / "admin.crt"),
                        "client-key": str(p / "admin.key"),
                    },
                }
            ],
            "contexts": [
                {"name": "torchfleet", "context": {"cluster": "torchfleet", "user": "admin"}}
            ],
            "current-context": "torchfleet",
        }
        # JSON is valid YAML, and kubectl and client libraries read either.
        self.kubeconfig.write_text(json.dumps(config, indent=2))

    def _link_tools(self, built: Path) -> None:
        for tool in TOOLS:
            link = self.bin / tool
            link.unlink(missing_ok=True)
            link.symlink_to(built / tool)

    # ---- objects ---------------------------------------------------------

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        out = subprocess.run(
            [str(self.bin / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    def _create_fake_nodes(self, count: int) -> None:
        template = (HERE / "fake-gpu-node.json").read_text()
        items = [json.loads(template.replace("NODE_NAME", f"gpu-node-{i}")) for i in range(count)]
        self.kubectl(
            "apply",
            "-f",
            "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
        )

    def _ready_nodes(self) -> int:
        nodes = json.loads(
            self.kubectl("get", "nodes", "-l", "torchfleet.dev/fake-node=true", "-o", "json")
        )
        return sum(
            1
            for n in nodes["items"]
            for c in n.get("status", {}).get("conditions", [])
            if c["type"] == "Ready" and c["status"] == "True"
        )

    def _default_service_account_exists(self) -> bool:
        try:
            self.kubectl("get", "serviceaccount", "default", "-n", "default")
            return True
        except ClusterError:
            return False

    # ---- probes ----------------------------------------------------------

    def _age_etcd(self) -> None:
        """Moves a new etcd past revision 1 before the API server starts. Its
        watch caches begin at the revision they first list, and one that began
        at 1 still answers a watch from version 1 with a replay where every
        cluster that was not just created answers 410 Gone (the informer's
        relist, tests/cluster/test_pod_informer.py); a cluster is never that young."""
        key = base64.b64encode(b"/torchfleet.dev/local-cluster-created").decode()
        value = base64.b64encode(str(time.time()).encode()).decode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.ports.etcd_client}/v3/kv/put",
            data=json.dumps({"key": key, "value": value}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10):
            pass

    @staticmethod
    def _http_ok(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _https_ok(self, port: int, path: str) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        # Controller-manager and scheduler serve self-signed certs on loopback.
        if port != self.ports.apiserver:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        try:
            with urllib.request.urlopen(
                f"https://127.0.0.1:{port}{path}", timeout=2, context=ctx
            ) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ssl.SSLError):
            return False


# ---- helpers -------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[cluster] {msg}", file=sys.stderr, flush=True)


def build_tools() -> Path:
    out = subprocess.run(
        [str(HERE / "build.sh")],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "KUBERNETES_VERSION": KUBERNETES_VERSION},
    )
    return Path(out.stdout.strip().splitlines()[-1])


def load_addon(name: str) -> ModuleType:
    """dev/cluster/NAME.py, loaded by path as this file is (it may be ``__main__``)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_realnode() -> ModuleType:
    """dev/realnode/realnode.py (a kubelet and containerd joined to a cluster)."""
    if "realnode" not in sys.modules:
        path = REPO / "dev/realnode/realnode.py"
        spec = importlib.util.spec_from_file_location("realnode", path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules["realnode"] = module
        spec.loader.exec_module(module)
    return sys.modules["realnode"]


# What the audit log keeps, at Metadata level (who, verb, object, when; no
# bodies): every write anyone but the control plane's own components makes,
# and every request that touches a Secret. Tests prove from it, as the API
# server saw them, what the operator did and did not do (a standby's writes, a
# Secret read), which no counter inside the operator can show.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "resources": [{"group": "", "resources": ["secrets"]}]},
        # Node and leader-election heartbeats: the bulk of all writes, and
        # nothing a test judges (a Lease's own fields say who holds it).
        {"level": "None", "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}]},
        {
            "level": "None",
            "users": [
                "system:kube-controller-manager",
                "system:kube-scheduler",
                "system:apiserver",
            ],
        },
        {"level": "None", "userGroups": ["system:nodes", "system:serviceaccounts:kube-system"]},
        # Every request of a workload's service account, reads included: what
        # an operator running as its chart's account did (least privilege).
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {
            "level": "Metadata",
            "verbs": ["create", "update", "patch", "delete", "deletecollection"],
        },
        {"level": "None"},
    ],
}


def openssl(*args: object, stdin: str | None = None) -> None:
    subprocess.run(
        ["openssl", *map(str, args)], check=True, input=stdin, text=True, capture_output=True
    )


def wait_for(ready: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.05
    while not ready():
        if time.monotonic() > deadline:
            raise ClusterError(
                f"timed out after {timeout:.0f}s waiting for {what}; see {STATE_DIR / 'logs'}/"
            )
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours is not alive.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def stop_process(pid: int, grace: float = 10.0) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if process_alive(pid):
        os.killpg(pid, signal.SIGKILL)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["up", "down", "status", "build"])
    parser.add_argument("--nodes", type=int, default=4, help="fake GPU nodes to create (default 4)")
    parser.add_argument(
        "--with",
        dest="extras",
        action="append",
        default=[],
        help="also start these beside the cluster (repeatable or comma-separated): "
        "kueue, coscheduling, volcano",
    )
    args = parser.parse_args()
    cluster = LocalCluster()
    try:
        if args.command == "up":
            cluster.up(nodes=args.nodes)
            extras = [n.strip() for arg in args.extras for n in arg.split(",") if n.strip()]
            for addon in (n for n in extras if n in ADDONS):
                cluster.addon(addon).up()
            gang = ",".join(n for n in extras if n not in ADDONS)
            if gang:
                import schedulers  # beside this file; only when asked

                schedulers.start(cluster, schedulers.parse_names(gang))
        elif args.command == "down":
            cluster.down()
        elif args.command == "build":
            print(build_tools())
        else:
            print(json.dumps(cluster.status(), indent=2))
    except (ClusterError, subprocess.CalledProcessError) as e:
        log(f"error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
