"""A node that goes silent is left behind within its heartbeat, not a timeout.

Three elastic ``torchfleet-train`` launchers on localhost (min 2, max 3), as
in test_elastic.py. At step KILL_AT one node that neither hosts the store nor
logs is SIGSTOPped with its worker: a machine gone silent, whose heartbeats
stop and whose connections are never reset, so the survivors' workers sit in
an all-reduce with it. The collective timeout is set far above the bound this
test asserts, so only lost_peer.py can explain a quick resume: the survivors'
agents see the node dropped from the round (3 heartbeats of 2 s), kill their
stuck workers and meet again at world size 2, and train on. The job is
endless (test_elastic.ENDLESS), so a fast machine cannot finish it before
the node goes silent.

Without lost_peer.py the survivors would wait the whole collective timeout.
The seconds from the stop to the first step at world size 2 are printed.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.trainer.cli_process import TrainerProcess, free_port
from tests.trainer.test_elastic import (
    ENDLESS,
    KILL_AT,
    TIMEOUT,
    elastic_env,
    first_to_log,
    kill_node,
    learnable_tokens,
    overrides,
)
from torchfleet_contract import pod as contract

pytestmark = pytest.mark.trainer

# Far above SILENT_BOUND: a survivor that waited for its collective to time out
# cannot pass.
COLLECTIVE_TIMEOUT = 300
# Heartbeat expiry (6 s) + the round's last call (5 s) + respawning the workers
# and their process group, with slack for this shared 2-core machine.
SILENT_BOUND = 90.0


def test_a_silent_node_is_left_behind_within_its_heartbeat(tmp_path: Path) -> None:
    data = learnable_tokens(tmp_path / "tokens.bin")
    endpoint = f"127.0.0.1:{free_port()}"
    args = overrides(data, tmp_path / "elastic", ENDLESS)
    timeout = {contract.COLLECTIVE_TRAIN_TIMEOUT: str(COLLECTIVE_TIMEOUT)}
    nodes = [
        TrainerProcess(args, elastic_env(endpoint, "silent", i == 0) | timeout) for i in range(3)
    ]
    try:
        logger = first_to_log(nodes, KILL_AT, world_size=3, timeout=TIMEOUT)
        silent = next(n for n in reversed(nodes[1:]) if n is not logger)
        kill_node(silent.proc.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        first_to_log([logger], 1, world_size=2, timeout=SILENT_BOUND)
        resumed_after = time.monotonic() - stopped_at
        assert [n.proc.poll() for n in nodes if n is not silent] == [None, None]
    finally:
        for node in nodes:
            kill_node(node.proc.pid)
    print(f"\nsilent node: survivors stepped at world size 2 after {resumed_after:.1f}s")
    survivors = [n for n in nodes if n is not silent]
    assert any("a peer's heartbeat stopped" in n.stderr for n in survivors), [
        n.stderr[-2000:] for n in survivors
    ]
