"""The node agent: a kubelet stand-in that runs pods as local processes.

Threads: two keep caches from a list+watch (every pod; the agent's own Node
objects, for their CPU throttle and silent-death annotations), one renews the
nodes' Leases and status, one provisions volumes, and the main loop
reconciles: it starts pods bound to its nodes, polls their processes, applies
the nodes' CPU throttle to their cgroups, kills the nodes asked to die,
writes their status back, refreshes each pod's /etc/hosts, and stops and
removes pods being deleted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from . import logserver, network, runtime
from . import node as nodes
from .cgroups import THROTTLE_ANNOTATION, CgroupRoot, parse_throttle
from .hosts import PeerAddress, peer_at, peer_from_pod, render_hosts
from .kube import Kube
from .pod import NodeContext, PodRunner
from .storage import Provisioner

log = logging.getLogger("nodeagent")

LOOP_SECONDS = 0.2
HEARTBEAT_SECONDS = 10
PROVISION_SECONDS = 1
LEASE_SECONDS = 40
DEFAULT_GRACE_SECONDS = 30


@dataclass
class AgentConfig:
    kubeconfig: str
    node_names: list[str]
    state_dir: Path
    bridge: str = "tfleet0"
    cidr: str = "10.253.0.0/16"
    session: str = nodes.DEFAULT_SESSION  # the value of the nodes' local-node label
    cpu: str = str((os.cpu_count() or 1) * 8)
    memory: str = "64Gi"
    # The node's "image": what a container's PATH finds first.
    bin_dir: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)


def base_env(config: AgentConfig) -> dict[str, str]:
    """What the node's runtime puts in every container before the pod's env."""
    path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    if config.bin_dir:
        path = f"{config.bin_dir}:{path}"
    return {
        "PATH": path,
        "HOME": "/root",
        "LANG": "C.UTF-8",
        # gloo picks the pod's own interface, not the loopback.
        "GLOO_SOCKET_IFNAME": "eth0",
        **config.extra_env,
    }


class Mirror:
    """One kind of object as the API server last listed and watched it."""

    def __init__(self, key: Callable[[Mapping[str, Any]], str]) -> None:
        self.key = key
        self.objects: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.synced = threading.Event()

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self.lock:
            return dict(self.objects)

    def replace(self, items: list[dict[str, Any]]) -> None:
        with self.lock:
            self.objects = {self.key(item): item for item in items}
        self.synced.set()

    def apply(self, event: Mapping[str, Any]) -> None:
        kind = event["type"]
        item = event["raw_object"]
        if kind == "ERROR":
            raise RuntimeError(f"watch error: {item.get('message')}")
        if kind == "BOOKMARK":
            return
        with self.lock:
            if kind == "DELETED":
                self.objects.pop(self.key(item), None)
            else:
                self.objects[self.key(item)] = item


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.kube = Kube(config.kubeconfig)
        self.bridge = network.Bridge(config.bridge, config.cidr)
        self.cgroups = CgroupRoot.discover(config.session)
        self.contexts = {
            name: self._node_context(index, name) for index, name in enumerate(config.node_names)
        }
        self.pods = Mirror(lambda pod: str(pod["metadata"]["uid"]))
        self.nodes = Mirror(lambda node: str(node["metadata"]["name"]))
        # The CPU throttle each node's annotation last asked for (1.0: none).
        self.throttles: dict[str, float] = {}
        self.bad_throttles: dict[str, str] = {}
        # Nodes dead by their silent-death annotation (no heartbeat), and the
        # pods that died with them: never ticked, reported or confirmed deleted.
        self.dead_nodes: frozenset[str] = frozenset()
        self.bad_deaths: dict[str, str] = {}
        self.silent: set[str] = set()
        self.stopping = threading.Event()
        self._heartbeat_soon = threading.Event()
        self.runners: dict[str, PodRunner] = {}
        self.reported: dict[str, str] = {}
        self.finishing: dict[str, threading.Thread] = {}
        self.handled: set[str] = set()
        self.created_mountpoints: set[str] = set()
        first = next(iter(self.contexts.values()))
        self.provisioner = Provisioner(self.kube, first.claim_dir)

    def _node_context(self, index: int, name: str) -> NodeContext:
        network_base = self.bridge.network.network_address
        pod_range = f"{network_base + (index + 1) * 256}/24"
        return NodeContext(
            node_name=name,
            host_ip=self.bridge.gateway,
            state_dir=self.config.state_dir,
            bridge=self.bridge,
            addresses=network.AddressPool(pod_range, reserved=set()),
            base_env=base_env(self.config),
            read_config=self.kube.read_config_map,
            read_secret=self.kube.read_secret,
            cgroups=self.cgroups.node(name),
        )

    def pod_range(self, name: str) -> str:
        network_base = self.bridge.network.network_address
        index = self.config.node_names.index(name)
        return f"{network_base + (index + 1) * 256}/24"

    # ---- start and stop -------------------------------------------------------------

    def start(self) -> None:
        for stale in network.stale_pod_networks(self.bridge):
            network.delete_pod_network(stale)
        self.bridge.ensure()
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        for context in self.contexts.values():
            context.cgroups.remove_stale()
        self.logs_port = logserver.serve(self.config.state_dir, self.bridge.gateway)
        self.node_uids = {}
        for name in self.config.node_names:
            self.node_uids[name] = self.kube.register_node(
                nodes.node_manifest(name, self.pod_range(name), self.config.session)
            )
        self._heartbeat()
        self.provisioner.ensure_storage_class()
        selector = f"{nodes.LOCAL_NODE_LABEL}={self.config.session}"
        mirrors: list[tuple[str, Mirror, Callable[[], Any], Callable[[str], Any]]] = [
            (
                "pods",
                self.pods,
                self.kube.list_pods,
                lambda version: self.kube.watch_pods(version, timeout_seconds=120),
            ),
            (
                "nodes",
                self.nodes,
                lambda: self.kube.list_nodes(selector),
                lambda version: self.kube.watch_nodes(selector, version, timeout_seconds=120),
            ),
        ]
        for name, mirror, list_objects, watch_objects in mirrors:
            threading.Thread(
                target=self._keep_mirrored,
                args=(name, mirror, list_objects, watch_objects),
                name=f"watch-{name}",
                daemon=True,
            ).start()
        threading.Thread(target=self._heartbeats, name="heartbeat", daemon=True).start()
        threading.Thread(target=self._provision, name="storage", daemon=True).start()
        if not self.pods.synced.wait(60):
            raise RuntimeError("could not list pods from the API server within 60s")
        log.info(
            "nodes %s ready; state in %s", ", ".join(self.config.node_names), self.config.state_dir
        )

    def shutdown(self, delete_nodes: bool) -> None:
        """Stops every pod (they would not survive the agent anyway), frees the
        network, and with ``delete_nodes`` removes the Node objects so the
        scheduler stops placing pods where nothing runs them."""
        self.stopping.set()
        self._heartbeat_soon.set()
        for runner in list(self.runners.values()):
            runner.stop(grace_seconds=5)
            runner.teardown()
            if delete_nodes:
                meta = runner.pod["metadata"]
                self._quietly(self.kube.delete_pod_now, meta["namespace"], meta["name"], runner.uid)
        for thread in self.finishing.values():
            thread.join(timeout=40)
        if delete_nodes:
            for name in self.config.node_names:
                self._quietly(self.kube.delete_node, name)
            self._quietly(self.provisioner.remove)
        for stale in network.stale_pod_networks(self.bridge):
            network.delete_pod_network(stale)
        self.bridge.remove()
        self.cgroups.remove_all()
        # Not one that a pod of another agent on this machine (another test
        # session, a demo) has a volume mounted on: removing it would take
        # that volume away from under the pod.
        in_use = runtime.mount_points_in_use(self.created_mountpoints)
        for path in sorted(self.created_mountpoints - in_use, key=len, reverse=True):
            with contextlib.suppress(OSError):
                # A file it created to bind one over (a termination message path).
                os.unlink(path) if os.path.isfile(path) else os.rmdir(path)

    @staticmethod
    def _quietly(call: Any, *args: Any) -> None:
        try:
            call(*args)
        except Exception as error:  # best effort on the way out
            log.warning("on shutdown: %s", error)

    # ---- the caches ---------------------------------------------------------------------

    def _keep_mirrored(
        self,
        name: str,
        mirror: Mirror,
        list_objects: Callable[[], tuple[list[dict[str, Any]], str]],
        watch_objects: Callable[[str], Iterator[dict[str, Any]]],
    ) -> None:
        while not self.stopping.is_set():
            try:
                items, version = list_objects()
                mirror.replace(items)
                for event in watch_objects(version):
                    mirror.apply(event)
                    if self.stopping.is_set():
                        return
            except Exception as error:
                # A 410 Gone or a dropped connection: list afresh.
                log.info("%s watch restarting: %s", name, error)
                time.sleep(0.5)

    # ---- heartbeats ------------------------------------------------------------------

    def _heartbeats(self) -> None:
        while not self.stopping.is_set():
            # A node booted again posts Ready at once, not up to 10 s later.
            self._heartbeat_soon.wait(HEARTBEAT_SECONDS)
            self._heartbeat_soon.clear()
            if self.stopping.is_set():
                return
            try:
                self._heartbeat()
            except Exception as error:
                log.warning("heartbeat failed: %s", error)

    def _provision(self) -> None:
        while not self.stopping.wait(PROVISION_SECONDS):
            try:
                self.provisioner.provision_pending()
            except Exception as error:
                log.warning("provisioning failed: %s", error)

    def _heartbeat(self) -> None:
        for name in self.config.node_names:
            if name in self.dead_nodes:
                continue
            lease = nodes.lease_manifest(name, self.node_uids[name], LEASE_SECONDS)
            self.kube.renew_lease(lease, nodes.lease_renewal())
            status = nodes.node_status(
                name, self.bridge.gateway, self.config.cpu, self.config.memory, self.logs_port
            )
            self.kube.patch_node_status(name, status)

    # ---- the reconcile loop ---------------------------------------------------------

    def run_forever(self) -> None:
        while not self.stopping.is_set():
            try:
                self.reconcile()
            except Exception:
                log.exception("reconcile pass failed")
            self.stopping.wait(LOOP_SECONDS)

    def reconcile(self) -> None:
        pods = self.pods.snapshot()
        self._read_throttles()
        self._read_deaths()
        mine = {
            uid: pod
            for uid, pod in pods.items()
            if (pod.get("spec") or {}).get("nodeName") in self.contexts
        }
        for uid, pod in mine.items():
            alive = pod["spec"]["nodeName"] not in self.dead_nodes
            if alive and uid not in self.runners and uid not in self.handled:
                self._admit(pod, pods)
        for uid, runner in list(self.runners.items()):
            current = mine.get(uid)
            if uid in self.silent:
                if runner.node.node_name in self.dead_nodes:
                    self._forget_when_gone(runner, current)
                else:
                    self._fail_after_boot(runner, current)
                continue
            if current is None or current["metadata"].get("deletionTimestamp"):
                self._finish(runner, current)
                continue
            runner.update_pod(current)
            runner.set_cpu_throttle(self.throttles.get(runner.node.node_name, 1.0))
            runner.tick()
            self._report(runner)
        self._refresh_hosts(pods)

    def _read_throttles(self) -> None:
        """Each node's CPU throttle from its annotation; a bad value is an error
        in the log (once per value) and throttles nothing."""
        for name, node in self.nodes.snapshot().items():
            value = (node["metadata"].get("annotations") or {}).get(THROTTLE_ANNOTATION)
            try:
                factor = parse_throttle(value)
            except ValueError as error:
                if self.bad_throttles.get(name) != value:
                    log.error("node %s: %s; its pods are not throttled", name, error)
                    self.bad_throttles[name] = str(value)
                factor = 1.0
            else:
                self.bad_throttles.pop(name, None)
            if self.throttles.get(name, 1.0) != factor:
                log.info("node %s: CPU throttle %s", name, factor)
            self.throttles[name] = factor

    def _read_deaths(self) -> None:
        """Kills the nodes newly annotated to die, and boots again those whose
        annotation went; a bad value is an error in the log (once per value)."""
        dead = set(self.dead_nodes)
        for name, node in self.nodes.snapshot().items():
            if name not in self.contexts:
                continue
            try:
                wanted = nodes.silent_death_requested(node)
            except ValueError as error:
                value = str(error)
                if self.bad_deaths.get(name) != value:
                    log.error("node %s: %s; it stays up", name, error)
                    self.bad_deaths[name] = value
                wanted = False
            else:
                self.bad_deaths.pop(name, None)
            if wanted and name not in dead:
                dead.add(name)
                self.dead_nodes = frozenset(dead)  # its heartbeats stop first
                self._die(name)
            elif not wanted and name in dead:
                dead.discard(name)
                self.dead_nodes = frozenset(dead)
                self._heartbeat_soon.set()
                log.warning("node %s is back (empty)", name)

    def _die(self, name: str) -> None:
        """The node dies as a machine does: each pod's network, then its
        processes (pod.py, ``die_silently``); from now on the agent says
        nothing about them (a deletion stays unconfirmed until someone
        force-deletes the pod) and starts nothing there."""
        for uid, runner in self.runners.items():
            if runner.node.node_name == name and uid not in self.silent:
                runner.die_silently()
                self.silent.add(uid)
        log.warning("node %s died silently (no heartbeat, pods' network and processes gone)", name)

    def _forget_when_gone(self, runner: PodRunner, pod: dict[str, Any] | None) -> None:
        """A dead node's pod: its leftovers (network namespace, cgroups, address)
        go when its API object does, as a machine's do when it is replaced."""
        if pod is None:
            self._forget(runner)
            log.info("pod %s of a dead node is gone from the API", runner.key)

    def _fail_after_boot(self, runner: PodRunner, pod: dict[str, Any] | None) -> None:
        """A pod that died with its node, the node booted again: marked Failed,
        as a kubelet that finds it gone does (tried again next pass if the API
        refuses), then forgotten."""
        if pod is not None:
            meta = pod["metadata"]
            failed = {
                "phase": "Failed",
                "reason": "NodeRestarted",
                "message": f"node {runner.node.node_name} died with this pod on it",
            }
            try:
                self.kube.patch_pod_status(meta["namespace"], meta["name"], failed)
            except ApiException as error:
                if error.status != 404:
                    log.warning("pod %s: not marked Failed yet: %s", runner.key, error)
                    return
        self._forget(runner)

    def _forget(self, runner: PodRunner) -> None:
        runner.stop(0)
        runner.teardown()
        del self.runners[runner.uid]
        self.silent.discard(runner.uid)

    def _admit(self, pod: dict[str, Any], pods: Mapping[str, dict[str, Any]]) -> None:
        """Starts a pod new to this node; a pod that is already terminal,
        being deleted, or was running under an earlier agent is not started."""
        uid = pod["metadata"]["uid"]
        meta = pod["metadata"]
        status = pod.get("status") or {}
        self.handled.add(uid)
        if meta.get("deletionTimestamp"):
            self.kube.delete_pod_now(meta["namespace"], meta["name"], uid)
            return
        if status.get("phase") in ("Succeeded", "Failed"):
            return
        if status.get("containerStatuses"):
            # Its processes died with the agent that ran them.
            self.kube.patch_pod_status(
                meta["namespace"],
                meta["name"],
                {
                    "phase": "Failed",
                    "reason": "NodeAgentRestarted",
                    "message": "the node agent that ran this pod was restarted",
                },
            )
            return
        node_name = pod["spec"]["nodeName"]
        runner = PodRunner(pod, self.contexts[node_name])
        runner.cpu_throttle = self.throttles.get(node_name, 1.0)
        self.runners[uid] = runner
        peers = self._peers(pods)
        runner.start(lambda ip: render_hosts(peer_at(pod, ip), peers))
        if runner.sandbox:
            self.created_mountpoints.update(runner.sandbox.created_mountpoints)
        log.info("pod %s started at %s", runner.key, runner.net.ip if runner.net else "-")
        self._report(runner)

    def _report(self, runner: PodRunner) -> None:
        """Patches the pod's status when it changed since the last report."""
        status = runner.status()
        signature = json.dumps(_without_times(status), sort_keys=True)
        if self.reported.get(runner.uid) == signature:
            return
        meta = runner.pod["metadata"]
        try:
            self.kube.patch_pod_status(meta["namespace"], meta["name"], status)
        except ApiException as error:
            if error.status == 404:
                return
            raise
        self.reported[runner.uid] = signature
        if runner.terminal and runner.net is not None:
            runner.teardown()

    def _finish(self, runner: PodRunner, pod: dict[str, Any] | None) -> None:
        """Stops a deleted pod's processes in the background (the grace period
        can be long), then removes the pod object for good."""
        if runner.uid in self.finishing:
            thread = self.finishing[runner.uid]
            if not thread.is_alive():
                del self.finishing[runner.uid]
                del self.runners[runner.uid]
            return
        grace = 0.0 if pod is None else _grace_seconds(pod)

        def finish() -> None:
            runner.stop(grace)
            runner.teardown()
            meta = runner.pod["metadata"]
            if pod is not None:
                # As the kubelet's status manager: how the containers ended
                # (exit codes, termination messages) first, then the removal.
                with contextlib.suppress(ApiException):
                    self.kube.patch_pod_status(meta["namespace"], meta["name"], runner.status())
                self.kube.delete_pod_now(meta["namespace"], meta["name"], runner.uid)
            log.info("pod %s stopped and removed", runner.key)

        thread = threading.Thread(target=finish, name=f"finish-{runner.key}", daemon=True)
        self.finishing[runner.uid] = thread
        thread.start()

    # ---- DNS -------------------------------------------------------------------------

    def _peers(self, pods: Mapping[str, dict[str, Any]]) -> list[PeerAddress]:
        """Every addressable pod: ours from what we know (we may not have seen
        our own status patch come back yet), others from the API."""
        peers: dict[str, PeerAddress] = {}
        for uid, pod in pods.items():
            peer = peer_from_pod(pod)
            if peer is not None and uid not in self.runners:
                peers[uid] = peer
        for uid, runner in self.runners.items():
            if runner.net is None or runner.terminal or uid in self.finishing:
                continue
            peers[uid] = peer_at(runner.pod, runner.net.ip)
        return list(peers.values())

    def _refresh_hosts(self, pods: Mapping[str, dict[str, Any]]) -> None:
        peers = self._peers(pods)
        for uid, runner in self.runners.items():
            if runner.sandbox is None or runner.net is None or uid in self.silent:
                continue
            own = peer_at(runner.pod, runner.net.ip)
            runner.sandbox.write_hosts(render_hosts(own, peers))


def _grace_seconds(pod: Mapping[str, Any]) -> float:
    meta = pod["metadata"]
    if meta.get("deletionGracePeriodSeconds") is not None:
        return float(meta["deletionGracePeriodSeconds"])
    spec_grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    return float(spec_grace if spec_grace is not None else DEFAULT_GRACE_SECONDS)


def _without_times(status: Mapping[str, Any]) -> dict[str, Any]:
    conditions = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"}
        for c in status.get("conditions") or []
    ]
    return {**status, "conditions": conditions}
