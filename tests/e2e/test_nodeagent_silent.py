"""A node of the agent dying silently, as a machine does (its
``torchfleet.dev/silent-death`` annotation): a peer's open connection to a pod
there gets no reset and no FIN, only silence; the node's Lease is no longer
renewed; its pod's processes are gone while the pod object still says
Running; a deletion is never confirmed, a force-deletion frees what the pod
held on this machine; and the node boots again empty: a pod that died there
and still exists is marked Failed, and new pods run.
"""

from __future__ import annotations

import subprocess
from datetime import datetime
from typing import Any

import pytest

from tests.e2e.test_nodeagent import get_pod, python_pod, wait_phase
from tests.fixtures.e2e import E2E_NODES, LOCAL_PLACEMENT, silent_node
from tests.fixtures.e2e import apply_objects as apply
from tests.fixtures.poll import wait_for

from nodeagent import network, procs  # isort: skip  (dev/ is put on the path by the fixtures)

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

PORT = 7000
# How long the client waits without an echo before it calls its peer silent.
SILENCE_SECONDS = 3

ECHO_SERVER = f"""
    import socket
    server = socket.create_server(("0.0.0.0", {PORT}))
    print("listening", flush=True)
    conn, _ = server.accept()
    while data := conn.recv(64):
        conn.sendall(data)
"""

# Exit 0 and "silent": no echo for SILENCE_SECONDS while the connection stayed
# open; exit 1 with "closed" (a FIN) or "error ..." (a reset): what a killed
# process on a live machine gives its peers.
PINGING_CLIENT = f"""
    import socket, sys, time
    deadline = time.monotonic() + 30
    while True:
        try:
            sock = socket.create_connection((sys.argv[1], {PORT}), timeout=1)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    sock.settimeout(0.2)
    last = None
    while last is None or time.monotonic() - last < {SILENCE_SECONDS}:
        try:
            sock.sendall(b"x")
            if not sock.recv(64):
                print("closed", flush=True)
                sys.exit(1)
            if last is None:
                print("echoed", flush=True)
            last = time.monotonic()
        except TimeoutError:
            pass
        except OSError as error:
            print("error", error, flush=True)
            sys.exit(1)
        time.sleep(0.1)
    print("silent", flush=True)
"""


def on_node(pod: dict[str, Any], node: str) -> dict[str, Any]:
    selector = {**LOCAL_PLACEMENT["nodeSelector"], "kubernetes.io/hostname": node}
    pod["spec"]["nodeSelector"] = selector
    return pod


def lease_renewed(cluster: Any, node: str) -> datetime:
    lease = cluster.get_json("lease", node, "-n", "kube-node-lease")
    return datetime.fromisoformat(lease["spec"]["renewTime"].replace("Z", "+00:00"))


def pod_exists(cluster: Any, namespace: str, name: str) -> bool:
    found = cluster.kubectl("get", "pod", name, "-n", namespace, check=False)
    return found.returncode == 0


def log_of(agent: Any, namespace: str, pod: str) -> str:
    return "".join(agent.logs(namespace, pod, "main"))


def test_a_silent_node_leaves_its_peers_waiting_and_its_pods_unconfirmed(
    cluster, namespace, node_agent
):
    live, dying = E2E_NODES
    sleeper = python_pod("sleeper", "import time; time.sleep(600)")
    apply(cluster, namespace, on_node(python_pod("server", ECHO_SERVER), dying))
    apply(cluster, namespace, on_node(sleeper, dying))
    sleeper_uid = wait_phase(cluster, namespace, "sleeper", {"Running"})["metadata"]["uid"]
    server = wait_phase(cluster, namespace, "server", {"Running"})
    server_uid, server_ip = server["metadata"]["uid"], server["status"]["podIP"]
    client = python_pod("client", PINGING_CLIENT, container={"args": [server_ip]})
    apply(cluster, namespace, on_node(client, live))
    wait_for("the client's first echo", lambda: "echoed" in log_of(node_agent, namespace, "client"))
    netns = network.find_netns(server_uid)
    assert netns is not None and procs.pod_processes(server_uid)

    with silent_node(cluster, dying):
        wait_for(
            "the dead node's pods' processes killed",
            lambda: not procs.pod_processes(server_uid) + procs.pod_processes(sleeper_uid),
        )
        died_at = datetime.now().astimezone()
        # Its network went first: the pod's eth0 is gone, the namespace kept.
        links = subprocess.run(["ip", "-n", netns, "-o", "link"], capture_output=True, text=True)
        assert links.returncode == 0 and "eth0" not in links.stdout, links

        ended = wait_phase(cluster, namespace, "client", {"Succeeded", "Failed"}, timeout=30)
        client_log = log_of(node_agent, namespace, "client")
        assert ended["status"]["phase"] == "Succeeded", client_log
        assert client_log.endswith("silent\n"), client_log

        # A heartbeat of the live node after the death, none of the dead one's.
        wait_for(
            "the live node's next heartbeat",
            lambda: lease_renewed(cluster, live) > died_at,
            timeout=30,
        )
        assert lease_renewed(cluster, dying) < died_at
        # Nothing reported: the API still has the pod Running.
        still = get_pod(cluster, namespace, "server")
        assert still["status"]["phase"] == "Running", still["status"]
        assert "running" in still["status"]["containerStatuses"][0]["state"], still["status"]

        # Deleted with the live node's pod: that one goes, the dead one stays.
        cluster.kubectl("delete", "pod", "server", "client", "-n", namespace, "--wait=false")
        wait_for("the live pod removed", lambda: not pod_exists(cluster, namespace, "client"))
        assert get_pod(cluster, namespace, "server")["metadata"]["deletionTimestamp"]
        cluster.kubectl("delete", "pod", "server", "-n", namespace, "--grace-period=0", "--force")
        wait_for("the dead pod's network freed", lambda: network.find_netns(server_uid) is None)

    # Booted again (the fixture waited for Ready): what died there is Failed,
    # and it runs pods as before.
    rebooted = wait_phase(cluster, namespace, "sleeper", {"Failed"}, timeout=30)["status"]
    assert rebooted["reason"] == "NodeRestarted", rebooted
    apply(cluster, namespace, on_node(python_pod("after", "print('up again')"), dying))
    after = wait_phase(cluster, namespace, "after", {"Succeeded", "Failed"})
    assert after["status"]["phase"] == "Succeeded", after["status"]
