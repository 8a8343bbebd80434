"""Pod networking: one Linux bridge on the machine, one network namespace per pod.

Why not 127.0.0.x addresses in the machine's own network namespace: the pods
of a gang run the same program, so two of them on this machine bind the same
ports (the trainer's metrics port, torchrun's store); only a network
namespace per pod lets each bind 0.0.0.0 as it would in a real cluster. Pods
therefore get real addresses on a bridge (like the CNI bridge plugin): every
pod reaches every other pod, and this machine (Prometheus, the operator)
reaches every pod at its pod IP. Loopback inside a pod is the pod's own.
"""

from __future__ import annotations

import hashlib
import ipaddress
import subprocess
import threading
from dataclasses import dataclass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")
    return out


@dataclass(frozen=True)
class PodNetwork:
    netns: str
    ip: str

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.netns}"


class Bridge:
    """The bridge all pods of this agent attach to; the machine is its gateway."""

    def __init__(self, name: str, cidr: str) -> None:
        self.name = name
        self.network = ipaddress.ip_network(cidr)
        self.gateway = str(next(self.network.hosts()))

    def ensure(self) -> None:
        if _ip("link", "show", self.name, check=False).returncode != 0:
            _ip("link", "add", self.name, "type", "bridge")
        addr = f"{self.gateway}/{self.network.prefixlen}"
        if addr not in _ip("-o", "addr", "show", "dev", self.name).stdout:
            _ip("addr", "add", addr, "dev", self.name)
        _ip("link", "set", self.name, "up")

    def remove(self) -> None:
        _ip("link", "del", self.name, check=False)


class AddressPool:
    """Hands out the addresses of one node's pod range (a /24 in the bridge's
    network) in turn, the free one after the last handed out, as the CNI's
    host-local IPAM does: an address just freed is the last to come back, so
    a peer's neighbour cache that still maps it to the old pod's MAC has
    expired before a new pod answers at it."""

    def __init__(self, cidr: str, reserved: set[str]) -> None:
        self._hosts = [str(h) for h in ipaddress.ip_network(cidr).hosts()]
        self._used = set(reserved)
        self._last = -1
        self._lock = threading.Lock()

    def allocate(self) -> str:
        with self._lock:
            count = len(self._hosts)
            for offset in range(1, count + 1):
                index = (self._last + offset) % count
                if self._hosts[index] not in self._used:
                    self._used.add(self._hosts[index])
                    self._last = index
                    return self._hosts[index]
        raise RuntimeError("no free pod address left on this node")

    def release(self, ip: str) -> None:
        with self._lock:
            self._used.discard(ip)


NETNS_PREFIX = "tfpod-"


def netns_name(bridge: str, pod_uid: str) -> str:
    """Named after the agent's bridge too, so agents side by side (tests, the
    demo) clean up only their own namespaces."""
    return f"{NETNS_PREFIX}{bridge}-{pod_uid}"


def find_netns(pod_uid: str) -> str | None:
    """The network namespace of a running pod, whichever agent runs it."""
    out = _ip("netns", "list", check=False).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(NETNS_PREFIX) and name.endswith(f"-{pod_uid}"):
            return name
    return None


def _veth_name(pod_uid: str) -> str:
    # Interface names are limited to 15 characters.
    return "tfv" + hashlib.sha1(pod_uid.encode()).hexdigest()[:11]


def create_pod_network(pod_uid: str, ip: str, bridge: Bridge) -> PodNetwork:
    """A network namespace with loopback and an eth0 on the bridge at ``ip``."""
    net = PodNetwork(netns_name(bridge.name, pod_uid), ip)
    delete_pod_network(net.netns)
    veth = _veth_name(pod_uid)
    _ip("netns", "add", net.netns)
    _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", net.netns)
    _ip("link", "set", veth, "master", bridge.name, "up")
    _ip("-n", net.netns, "link", "set", "lo", "up")
    _ip("-n", net.netns, "addr", "add", f"{ip}/{bridge.network.prefixlen}", "dev", "eth0")
    _ip("-n", net.netns, "link", "set", "eth0", "up")
    _ip("-n", net.netns, "route", "add", "default", "via", bridge.gateway)
    return net


def delete_pod_network(netns: str) -> None:
    """The pod's eth0 first, which takes its veth pair off the bridge at once,
    then the namespace. Deleting the namespace alone frees its devices later,
    in the kernel's own time: until then the old pod's eth0 still answers ARP
    for an address the pool may already have handed to a new pod."""
    _ip("-n", netns, "link", "del", "eth0", check=False)
    _ip("netns", "del", netns, check=False)


def unplug_pod(netns: str) -> None:
    """Takes the pod's eth0 (and its veth pair) away, leaving the namespace and
    every socket in it. As a machine whose network went first: nothing the pod
    sends leaves it (no route), and frames for its address find no port on the
    bridge and are dropped (its neighbours' ARP goes unanswered), so a peer's
    connection neither gets a reset nor a FIN; it waits, as on a dead host."""
    _ip("-n", netns, "link", "del", "eth0", check=False)


def netns_pids(netns: str) -> list[int]:
    """Every process in the network namespace (``ip netns pids``)."""
    out = _ip("netns", "pids", netns, check=False)
    return [int(pid) for pid in out.stdout.split()]


def stale_pod_networks(bridge: Bridge) -> list[str]:
    """Namespaces a previous agent on this bridge left behind (it was killed)."""
    out = _ip("netns", "list", check=False).stdout
    prefix = f"{NETNS_PREFIX}{bridge.name}-"
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]
