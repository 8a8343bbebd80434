"""The node agent's pod network: addresses handed out in turn, and a pod's
interface gone from the bridge as soon as its network is deleted (real
namespaces and veths on a bridge of the test's own; root, as the agent)."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from tests.fixtures import e2e  # noqa: F401  (puts dev/ on the path)

from nodeagent import network  # isort: skip


def test_addresses_come_in_turn_and_a_freed_one_comes_back_last():
    pool = network.AddressPool("10.250.1.0/29", reserved={"10.250.1.2"})
    first, second = pool.allocate(), pool.allocate()
    assert (first, second) == ("10.250.1.1", "10.250.1.3")  # .2 was reserved
    pool.release(first)
    assert [pool.allocate() for _ in range(3)] == ["10.250.1.4", "10.250.1.5", "10.250.1.6"]
    assert pool.allocate() == "10.250.1.1"  # wrapped round to the freed one
    with pytest.raises(RuntimeError, match="no free pod address"):
        pool.allocate()


@pytest.fixture
def bridge() -> Iterator[network.Bridge]:
    made = network.Bridge(f"tfnet{os.getpid() % 100000}", "10.231.0.0/16")
    made.ensure()
    try:
        yield made
    finally:
        made.remove()


def on_bridge(bridge: network.Bridge) -> list[str]:
    out = subprocess.run(
        ["ip", "-o", "link", "show", "master", bridge.name],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


def test_a_deleted_pod_network_leaves_nothing_on_the_bridge(bridge: network.Bridge):
    # Several in a row: the namespace alone went in the kernel's own time,
    # so its eth0 still answered for the address right after every delete.
    for _ in range(10):
        uid = str(uuid.uuid4())
        net = network.create_pod_network(uid, "10.231.1.1", bridge)
        try:
            assert on_bridge(bridge) == [network._veth_name(uid)]
        finally:
            network.delete_pod_network(net.netns)
        assert on_bridge(bridge) == []
