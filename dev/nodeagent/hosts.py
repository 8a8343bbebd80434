"""The per-pod /etc/hosts that stands in for cluster DNS.

A pod with ``spec.hostname`` and ``spec.subdomain`` is reachable, through the
headless Service named by the subdomain, as ``<hostname>.<subdomain>.<ns>.svc``
(plus the cluster domain), and by the shorter forms a pod's DNS search path
allows. Each pod gets its own file, bind-mounted over /etc/hosts inside its
private mount namespace; the machine's real /etc/hosts is never touched.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

CLUSTER_DOMAIN = "cluster.local"


@dataclass(frozen=True)
class PeerAddress:
    """One pod's DNS identity and address."""

    namespace: str
    hostname: str
    subdomain: str | None
    ip: str


def peer_from_pod(pod: Mapping[str, Any]) -> PeerAddress | None:
    """The pod's DNS identity, or None while it has no IP yet or is going away.

    Terminating and finished pods are left out, as cluster DNS leaves them out
    of a headless Service, so a gang restart's new pod owns the name at once.
    """
    status = pod.get("status") or {}
    ip = status.get("podIP")
    meta = pod["metadata"]
    if not ip or meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
        return None
    return peer_at(pod, ip)


def peer_at(pod: Mapping[str, Any], ip: str) -> PeerAddress:
    """The pod's DNS identity at ``ip``."""
    meta = pod["metadata"]
    spec = pod.get("spec") or {}
    return PeerAddress(
        namespace=meta["namespace"],
        hostname=spec.get("hostname") or meta["name"],
        subdomain=spec.get("subdomain") or None,
        ip=ip,
    )


def dns_names(peer: PeerAddress, viewer_namespace: str) -> list[str]:
    """Names a pod in ``viewer_namespace`` may use for ``peer``, longest first."""
    if not peer.subdomain:
        return []
    fqdn = f"{peer.hostname}.{peer.subdomain}.{peer.namespace}.svc.{CLUSTER_DOMAIN}"
    names = [fqdn, f"{peer.hostname}.{peer.subdomain}.{peer.namespace}.svc"]
    names.append(f"{peer.hostname}.{peer.subdomain}.{peer.namespace}")
    if peer.namespace == viewer_namespace:
        # The pod's search path starts with its own <ns>.svc.<domain>.
        names.append(f"{peer.hostname}.{peer.subdomain}")
    return names


def service_names(subdomain: str, namespace: str, viewer_namespace: str) -> list[str]:
    names = [f"{subdomain}.{namespace}.svc.{CLUSTER_DOMAIN}", f"{subdomain}.{namespace}.svc"]
    if namespace == viewer_namespace:
        names.append(subdomain)
    return names


def render_hosts(own: PeerAddress, peers: Iterable[PeerAddress]) -> str:
    """The hosts file for pod ``own``: its own names first, then every peer's
    per-pod names, then each headless Service name with all its pods."""
    lines = [
        "# Written by the torchfleet node agent (dev/nodeagent) for one pod.",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        "\t".join([own.ip, *dns_names(own, own.namespace), own.hostname]),
    ]
    by_service: dict[tuple[str, str], list[str]] = {}
    for peer in sorted(peers, key=lambda p: (p.namespace, p.subdomain or "", p.hostname)):
        if peer == own or not peer.subdomain:
            continue
        lines.append("\t".join([peer.ip, *dns_names(peer, own.namespace)]))
        by_service.setdefault((peer.namespace, peer.subdomain), []).append(peer.ip)
    if own.subdomain:
        by_service.setdefault((own.namespace, own.subdomain), []).append(own.ip)
    for (namespace, subdomain), ips in sorted(by_service.items()):
        for ip in sorted(set(ips)):
            lines.append("\t".join([ip, *service_names(subdomain, namespace, own.namespace)]))
    return "\n".join(lines) + "\n"
