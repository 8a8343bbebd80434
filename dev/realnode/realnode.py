"""A node with a real kubelet and containerd, joined to a local cluster.

Beside KWOK's and the node agent's nodes, this one runs pods the way users'
clusters do: the kubelet (built from the control plane's module set) talks CRI
to containerd v2, which runs each container with Debian's runc; pods get a
network from the CNI bridge and host-local plugins. Images come from
build.sh's archives (the pause image, a static-busybox base), imported with
``ctr images import``, since there is no registry. The node runs its own
CoreDNS (gotool.sh coredns) on its bridge's address, the kubelet's clusterDNS, so
pods resolve the cluster's names, a headless Service's per-pod names included
(see _start_coredns).

Everything a second cluster on the same machine could meet is derived from the
cluster's folder and port offset: containerd's socket, root and state, runc's
root, the kubelet's root dir and ports, the pods' cgroup root, the CNI bridge
and its subnet. ``down`` stops the kubelet, removes every container (through
runc, under this node's own runc root), stops containerd and its shims, and
unmounts what is left under the node's folder, so no process or mount outlives
the cluster.

The node is tainted ``torchfleet.dev/real-node=true:NoSchedule``: only pods
that ask for it (toleration plus the ``torchfleet.dev/real-node`` label as
nodeSelector) land there. Standard library only, like localcluster.py.

    TORCHFLEET_CLUSTER_DIR=... realnode.py up|down|status

joins (or removes) the real node of the local cluster those variables name
(the cluster must be up; ``localcluster.py down`` stops the node too).

Two settings exist because of these machines, not of Kubernetes: the kubelet
runs with ``failCgroupV1: false`` (they mount cgroup v1), and containerd with
``restrict_oom_score_adj`` where the machine withholds CAP_SYS_RESOURCE (see
_write_containerd_config).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
NODE_NAME = "real-node"
TAINT_KEY = "torchfleet.dev/real-node"
PAUSE_IMAGE = "torchfleet.local/pause:3.10"
BUSYBOX_IMAGE = "torchfleet.local/busybox:1.35"
CRI_NAMESPACE = "k8s.io"
CLUSTER_DOMAIN = "cluster.local"
CAP_SYS_RESOURCE = 24  # linux/capability.h
# The host sysctls a kubelet sets for itself when it starts (without
# protectKernelDefaults, which would instead refuse to start unless they are
# already so). These machines are shared: the last node down puts back
# what the first one up found.
# Machine-wide (tmpfs, gone with the boot that the values belong to): the
# values found before the first of this machine's real nodes started, and the
# nodes running.
SYSCTL_STATE = Path("/run/torchfleet-realnode")
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# What runs for the node, each under the cluster's pid files.
PROCESSES = ("coredns", "containerd", "kubelet")
RUNC = os.environ.get("TORCHFLEET_RUNC") or shutil.which("runc") or "runc"


def _built(*argv: str, env: dict[str, str] | None = None) -> Path:
    """What a build script here printed last: the path of what it built."""
    out = subprocess.run(
        [str(HERE / argv[0]), *argv[1:]], check=True, stdout=subprocess.PIPE, text=True, env=env
    )
    return Path(out.stdout.strip().splitlines()[-1])


def build() -> Path:
    """build.sh's folder: the kubelet of the cluster's release (as localcluster.py
    picks it: TORCHFLEET_KUBERNETES_VERSION, else versions.env)."""
    release = os.environ.get("TORCHFLEET_KUBERNETES_VERSION")
    return _built(
        "build.sh", env={**os.environ, **({"KUBERNETES_VERSION": release} if release else {})}
    )


def build_coredns() -> Path:
    """CoreDNS as `gotool.sh coredns` builds it: only the plugins the node needs."""
    return _built("gotool.sh", "coredns")


class RealNode:
    """The real node of ``cluster`` (a localcluster.LocalCluster)."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.root = Path(cluster.root) / "realnode"
        self.name = NODE_NAME
        self.busybox = BUSYBOX_IMAGE
        self.socket = self.root / "containerd.sock"
        self.runc_root = self.root / "runc"
        offset = cluster.ports.apiserver - 16443
        self.kubelet_port = 10250 + offset
        self.healthz_port = 10248 + offset
        # One name per cluster folder: two clusters never share a bridge,
        # subnet or cgroup.
        tag = hashlib.sha256(str(Path(cluster.root).resolve()).encode()).hexdigest()[:6]
        self.bridge = f"tf{tag}"
        self.cgroup_root = f"/torchfleet-{tag}"
        # 10.200-249.x.0/24: clear of the node agent's 10.160-199.0.0/16.
        self.subnet = f"10.{200 + int(tag, 16) % 50}.{int(tag, 16) // 50 % 256}.0/24"
        # The bridge's own address (the pods' gateway), where the node's
        # CoreDNS listens: see _start_coredns.
        self.gateway = str(ipaddress.ip_network(self.subnet)[1])
        self.node_ip = host_ip()

    # ---- lifecycle -------------------------------------------------------

    def up(self) -> None:
        if self.healthy():
            return
        self.down(quiet=True)
        built = build()
        coredns = build_coredns()
        for d in ("cni/net.d", "cni/ipam", "kubelet", "pod-logs"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self._write_containerd_config(built)
        self._write_cni_config()
        self._write_kubelet_config()
        self._grant_node_identity()
        self._make_cgroup_root()
        t0 = time.monotonic()
        self._start_coredns(coredns)
        config = ["--config", str(self.root / "containerd.toml")]
        self.cluster._start("containerd", config, str(built / "containerd"))
        wait = self._cluster_module().wait_for
        wait(self.socket.exists, "containerd's socket", 60)
        wait(self._dns_answers, f"CoreDNS on {self.gateway}:53", 60)
        for image in ("pause.tar", "busybox.tar"):
            self.ctr(built, "images", "import", "--no-unpack", str(built / image))
        self._start_kubelet(built)
        wait(self._ready_or_dead, f"node {NODE_NAME} Ready", 120)
        if self.cluster._pid("kubelet") is None:
            raise self._cluster_module().ClusterError(
                f"the kubelet exited; see {self.cluster.logs / 'kubelet.log'}"
            )
        _log(f"real node {NODE_NAME} ready in {time.monotonic() - t0:.1f}s")

    def down(self, quiet: bool = False) -> None:
        for name in ("kubelet",):
            self._stop(name, quiet)
        self._remove_containers()
        self._stop("containerd", quiet)
        self._stop("coredns", quiet)
        self._restore_sysctls()
        self._stop_shims()
        self._unmount_all()
        self._remove_cgroup_root()
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        # The Node object too: a cluster that stays up keeps no NotReady node.
        with contextlib.suppress(Exception):
            self.cluster.kubectl(
                "delete",
                "node",
                NODE_NAME,
                "--ignore-not-found",
                "--wait=false",
                "--request-timeout=10s",
            )

    def api_server(self) -> tuple[str, int]:
        """Where this node's pods reach the API server: the node's own
        address, on which the local API server listens (it binds every
        address; its certificate names this one). No kube-proxy runs here:
        its rules would live in the machine's one network namespace, where
        every local cluster's ``kubernetes`` Service is the same 10.96.0.1,
        and the API server advertises no endpoint for it (its own address is
        loopback). So, as in clusters without kube-proxy, a pod that talks to
        the API server is given KUBERNETES_SERVICE_HOST and _PORT, which its
        in-cluster configuration reads; the kubelet's own 10.96.0.1 would go
        nowhere."""
        return self.node_ip, self.cluster.ports.apiserver

    def import_image(self, archive: Path) -> str:
        """Imports an OCI archive (``operator-image.sh``'s) into the node's
        containerd, as build.sh's images are, and returns the image's name."""
        with tarfile.open(archive) as tar:
            index = tar.extractfile("index.json")
            assert index is not None, f"{archive} has no index.json"
            manifests = json.load(index)["manifests"]
        name = str(manifests[0]["annotations"]["org.opencontainers.image.ref.name"])
        self.ctr(build(), "images", "import", "--no-unpack", str(archive))
        return name

    def status(self) -> dict[str, object]:
        return {
            "node": NODE_NAME,
            "ready": self._node_ready(),
            "pids": {n: self.cluster._pid(n) for n in PROCESSES},
            "containerd": str(self.socket),
            "dns": f"{self.gateway}:53",
        }

    def healthy(self) -> bool:
        return all(self.cluster._pid(n) is not None for n in PROCESSES) and self._node_ready()

    # ---- helpers ---------------------------------------------------------

    def _cluster_module(self) -> Any:
        """localcluster.py as the caller loaded it (it may be ``__main__``)."""
        return sys.modules[type(self.cluster).__module__]

    def ctr(self, built: Path, *args: str) -> str:
        out = subprocess.run(
            [str(built / "ctr"), "--address", str(self.socket), "-n", CRI_NAMESPACE, *args],
            check=True,
            capture_output=True,
            text=True,
        )
        return out.stdout

    def _node_ready(self) -> bool:
        try:
            node = json.loads(self.cluster.kubectl("get", "node", NODE_NAME, "-o", "json"))
        except Exception:
            return False
        conditions = node.get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _ready_or_dead(self) -> bool:
        return self.cluster._pid("kubelet") is None or self._node_ready()

    def _start_coredns(self, coredns: Path) -> None:
        """The node's cluster DNS: CoreDNS serving cluster.local from the
        cluster's API (Services, and the per-pod names of headless Services:
        ``<hostname>.<subdomain>.<namespace>.svc``, from EndpointSlices'
        hostnames), and nothing else. A pod's resolv.conf cannot name a port
        and several clusters' nodes share this machine, so each listens on
        port 53 of its own bridge's address, the pods' gateway: the bridge is
        made here, before the CNI bridge plugin (which takes it as it is,
        address included) first needs it."""
        if subprocess.run(["ip", "link", "show", self.bridge], capture_output=True).returncode:
            subprocess.run(["ip", "link", "add", self.bridge, "type", "bridge"], check=True)
        prefix = ipaddress.ip_network(self.subnet).prefixlen
        subprocess.run(
            ["ip", "addr", "replace", f"{self.gateway}/{prefix}", "dev", self.bridge], check=True
        )
        subprocess.run(["ip", "link", "set", self.bridge, "up"], check=True)
        # No upstream: the pods need no other names, and these machines'
        # resolver is not theirs to use. Every other name is NXDOMAIN at once
        # (not REFUSED, which musl's resolver ignores until it times out).
        corefile = f"""{CLUSTER_DOMAIN}:53 {{
    bind {self.gateway}
    errors
    kubernetes {CLUSTER_DOMAIN} {{
        kubeconfig {self.cluster.kubeconfig}
    }}
}}
.:53 {{
    bind {self.gateway}
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
"""
        (self.root / "Corefile").write_text(corefile)
        self.cluster._start("coredns", ["-conf", str(self.root / "Corefile")], str(coredns))

    def _dns_answers(self) -> bool:
        """Whether the node's CoreDNS answers, from the API's data: the
        ``kubernetes`` Service's name resolves (CoreDNS starts serving once
        it has synced with the API server)."""
        if self.cluster._pid("coredns") is None:
            raise self._cluster_module().ClusterError(
                f"CoreDNS exited; see {self.cluster.logs / 'coredns.log'}"
            )
        return bool(dns_query(self.gateway, f"kubernetes.default.svc.{CLUSTER_DOMAIN}"))

    def _cgroup_dirs(self) -> list[Path]:
        """The pods' cgroup root in every cgroup v1 hierarchy (the kubelet
        requires it to exist in each)."""
        base = Path("/sys/fs/cgroup")
        hierarchies = [p for p in base.iterdir() if p.name != "unified" and p.is_dir()]
        return [p / self.cgroup_root.lstrip("/") for p in hierarchies]

    def _make_cgroup_root(self) -> None:
        for d in self._cgroup_dirs():
            d.mkdir(exist_ok=True)
            if d.parent.name == "cpuset":  # v1 cpusets start empty
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (d / f).write_text((d.parent / f).read_text())

    def _remove_cgroup_root(self) -> None:
        """The pods' cgroups, deepest first; a killed container's last
        processes may take a moment to leave theirs (EBUSY until then)."""
        for d in self._cgroup_dirs():
            if not d.exists():
                continue
            for sub in [*sorted((p for p in d.rglob("*") if p.is_dir()), reverse=True), d]:
                deadline = time.monotonic() + 10
                while sub.exists():
                    try:
                        sub.rmdir()
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.1)

    def _start_kubelet(self, built: Path) -> None:
        """Starts the kubelet, having recorded the host's sysctls if it is the
        first real node on this machine, and counts it among those running
        (all under the lock, so no node going down meanwhile misses it)."""
        with _sysctl_lock():
            saved = SYSCTL_STATE / "sysctls.json"
            if not saved.exists():
                values = {k: (Path("/proc/sys") / k).read_text().strip() for k in KUBELET_SYSCTLS}
                saved.write_text(json.dumps(values))
            self.cluster._start("kubelet", self._kubelet_args(), str(built / "kubelet"))
            (SYSCTL_STATE / "nodes" / self.bridge).write_text(str(self.cluster.run / "kubelet.pid"))

    def _restore_sysctls(self) -> None:
        """Puts the recorded values back once no other real node's kubelet
        runs (one still running keeps what it set)."""
        with _sysctl_lock():
            (SYSCTL_STATE / "nodes" / self.bridge).unlink(missing_ok=True)
            for other in (SYSCTL_STATE / "nodes").iterdir():
                if _pid_file_alive(Path(other.read_text())):
                    return
                other.unlink()
            saved = SYSCTL_STATE / "sysctls.json"
            if saved.exists():
                for key, value in json.loads(saved.read_text()).items():
                    (Path("/proc/sys") / key).write_text(value)
                saved.unlink()

    def _stop(self, name: str, quiet: bool) -> None:
        pid = self.cluster._pid(name)
        if pid is None:
            return
        self._cluster_module().stop_process(pid)
        (self.cluster.run / f"{name}.pid").unlink(missing_ok=True)
        if not quiet:
            _log(f"stopped {name} (pid {pid})")

    def _remove_containers(self) -> None:
        """Every container of this node, pause containers included, through
        runc under this node's own runc root (other nodes' containers live
        under theirs)."""
        root = self.runc_root / CRI_NAMESPACE
        if not root.exists():
            return
        listed = subprocess.run(
            [RUNC, "--root", str(root), "list", "-q"], capture_output=True, text=True
        )
        for cid in listed.stdout.split():
            subprocess.run([RUNC, "--root", str(root), "delete", "-f", cid], capture_output=True)

    def _stop_shims(self) -> None:
        """The runc shims containerd started for this node: found by the
        socket address on their command line, stopped by pid."""
        address = str(self.socket).encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"containerd-shim-runc-v2") and address in argv:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(proc.name), signal.SIGKILL)

    def _unmount_all(self) -> None:
        prefix = str(self.root.resolve()) + "/"
        with open("/proc/self/mounts") as f:
            points = [line.split()[1] for line in f]
        for point in sorted((p for p in points if p.startswith(prefix)), reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True)

    # ---- configuration ---------------------------------------------------

    def _write_containerd_config(self, built: Path) -> None:
        r = self.root
        restrict_oom = not _has_capability(CAP_SYS_RESOURCE)
        cri_runtime = '"io.containerd.cri.v1.runtime"'
        config = f"""version = 3
root = "{r}/containerd-root"
state = "{r}/containerd-state"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.nri.v1.nri"]
  disable = true
[plugins."io.containerd.internal.v1.opt"]
  path = "{r}/opt"
[plugins.{cri_runtime}]
  netns_mounts_under_state_dir = true
  # These machines' capability bounding set lacks CAP_SYS_RESOURCE (even
  # PID 1's), and without it no process may lower its oom_score_adj below
  # 0. The kubelet asks -998 for every pod sandbox (-997 for Guaranteed
  # containers); runc's nsexec then fails writing /proc/self/oom_score_adj
  # ("Permission denied"), which runc reports only as "can't get final
  # child's PID from pipe: EOF". Restricted, containerd clamps the request to
  # its own score (0), as it does for rootless runs.
  restrict_oom_score_adj = {str(restrict_oom).lower()}
  enable_cdi = false
[plugins.{cri_runtime}.cni]
  bin_dirs = ["{built}/cni"]
  conf_dir = "{r}/cni/net.d"
[plugins.{cri_runtime}.containerd]
  default_runtime_name = "runc"
[plugins.{cri_runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins.{cri_runtime}.containerd.runtimes.runc.options]
  BinaryName = "{RUNC}"
  Root = "{self.runc_root}"
  SystemdCgroup = false
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{PAUSE_IMAGE}"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""
        (r / "containerd.toml").write_text(config)

    def _write_cni_config(self) -> None:
        config = {
            "cniVersion": "1.0.0",
            "name": self.bridge,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(self.root / "cni/ipam"),
                        "ranges": [[{"subnet": self.subnet}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "loopback"},
            ],
        }
        (self.root / "cni/net.d/10-bridge.conflist").write_text(json.dumps(config, indent=2))

    def _write_kubelet_config(self) -> None:
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # These machines mount cgroup v1 read-write; the kubelet refuses
            # v1 unless told otherwise (KEP-5573).
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            # The API server reaches the kubelet (logs, exec) at the node's
            # address, and the kubelet refuses a loopback one.
            "address": self.node_ip,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            # It listens on a non-loopback address: only clients with a
            # certificate of the cluster's CA (the API server, for logs and
            # exec) get in, and those are trusted as the cluster's admins.
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.cluster.pki / "ca.crt")},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "failSwapOn": False,
            "podLogsDir": str(self.root / "pod-logs"),
            "volumePluginDir": str(self.root / "volume-plugins"),
            "registerWithTaints": [{"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}],
            "podCIDR": self.subnet,
            # Pods (dnsPolicy ClusterFirst) ask the node's CoreDNS
            # (_start_coredns), with the search list
            # <namespace>.svc.cluster.local svc.cluster.local cluster.local.
            # No host resolv.conf: nothing from this machine's is added.
            "clusterDNS": [self.gateway],
            "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": "",
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
            },
            "serializeImagePulls": False,
            "cgroupsPerQOS": True,
            "enforceNodeAllocatable": ["pods"],
            "localStorageCapacityIsolation": False,
        }
        (self.root / "kubelet.json").write_text(json.dumps(config, indent=2))

    def _grant_node_identity(self) -> None:
        """A kubelet's own identity, as kubeadm gives it: a client certificate
        for ``system:node:<name>`` in ``system:nodes``, bound to the built-in
        ``system:node`` role (the cluster authorizes by RBAC alone, without
        the Node authorizer). Its writes are then a node's, which the audit
        policy leaves out, not the admin's."""
        user = f"system:node:{NODE_NAME}"
        pki = self.cluster.pki
        if not (pki / f"{NODE_NAME}.crt").exists():
            subject = f"/O=system:nodes/CN={user}"
            self.cluster._signed_cert(NODE_NAME, subject, "extendedKeyUsage=clientAuth")
        config = json.loads(Path(self.cluster.kubeconfig).read_text())
        config["users"] = [
            {
                "name": NODE_NAME,
                "user": {
                    "client-certificate": str(pki / f"{NODE_NAME}.crt"),
                    "client-key": str(pki / f"{NODE_NAME}.key"),
                },
            }
        ]
        for context in config["contexts"]:
            context["context"]["user"] = NODE_NAME
        (self.root / "kubeconfig").write_text(json.dumps(config, indent=2))
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"torchfleet-{NODE_NAME}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:node",
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
        self.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(binding))

    def _kubelet_args(self) -> list[str]:
        return [
            f"--config={self.root / 'kubelet.json'}",
            f"--kubeconfig={self.root / 'kubeconfig'}",
            f"--root-dir={self.root / 'kubelet'}",
            f"--cert-dir={self.root / 'kubelet/pki'}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={self.node_ip}",
            f"--node-labels={TAINT_KEY}=true",
            "--v=1",
        ]


def host_ip() -> str:
    """The address this machine's default route leaves from (a UDP connect
    sends nothing; it only picks the route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.1", 9))  # TEST-NET-3: via the default route
        except OSError as e:
            raise RuntimeError(f"the real node needs a non-loopback IPv4 address: {e}") from e
        return str(probe.getsockname()[0])


def dns_query(server: str, name: str, timeout: float = 1.0) -> list[str]:
    """The IPv4 addresses ``server`` (port 53, UDP) gives for ``name``; empty
    when it answers none or not at all."""
    query_id = os.getpid() & 0xFFFF
    question = b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split("."))
    # Header: id, flags (recursion desired), 1 question; then QTYPE A, QCLASS IN.
    packet = struct.pack(">HHHHHH", query_id, 0x0100, 1, 0, 0, 0) + question + b"\0\0\1\0\1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.sendto(packet, (server, 53))
            reply = sock.recv(4096)
        except OSError:
            return []
    reply_id, flags, _, answers, _, _ = struct.unpack(">HHHHHH", reply[:12])
    if reply_id != query_id or flags & 0xF:  # another reply, or an error rcode
        return []
    offset = 12 + len(question) + 5
    addresses = []
    for _ in range(answers):
        # The answer's name: a pointer to the question (2 bytes) or labels.
        while reply[offset] and reply[offset] < 0xC0:
            offset += reply[offset] + 1
        offset += 2 if reply[offset] >= 0xC0 else 1
        rtype, _, _, length = struct.unpack(">HHIH", reply[offset : offset + 10])
        offset += 10
        if rtype == 1 and length == 4:
            addresses.append(socket.inet_ntoa(reply[offset : offset + 4]))
        offset += length
    return addresses


@contextlib.contextmanager
def _sysctl_lock() -> Iterator[None]:
    (SYSCTL_STATE / "nodes").mkdir(parents=True, exist_ok=True)
    with open(SYSCTL_STATE / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _pid_file_alive(path: Path) -> bool:
    try:
        os.kill(int(path.read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


def _has_capability(bit: int) -> bool:
    """Whether this process's effective capability set holds ``bit``."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> bit & 1)
    return False


def _log(msg: str) -> None:
    print(f"[realnode] {msg}", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["up", "down", "status", "build"])
    args = parser.parse_args()
    sys.path.insert(0, str(HERE.parent / "cluster"))
    import localcluster  # dev/cluster/, put on the path just above

    node = RealNode(localcluster.LocalCluster())
    try:
        if args.command == "up":
            if not node.cluster.healthy():
                raise localcluster.ClusterError("the local cluster is not up (make cluster-up)")
            node.up()
        elif args.command == "down":
            node.down()
        elif args.command == "build":
            print(build())
        else:
            print(json.dumps(node.status(), indent=2))
    except (localcluster.ClusterError, subprocess.CalledProcessError) as e:
        _log(f"error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
