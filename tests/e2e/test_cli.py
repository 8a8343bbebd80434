"""``torchfleet run`` as a user runs it, in a terminal (a pseudo-terminal):
real torchrun gangs through the operator on the node agent's nodes. A plain
DDP script (tests/e2e/scripts/ddp_check.py) runs to success and the command
exits 0; a script that raises fails the job after its restarts, and the
command prints each restart's reason above the bar and exits 1 with the
failure's reason."""

from __future__ import annotations

import os
import pty
import re
import select
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.e2e import E2E_SESSION, LOCAL_NODE_LABEL

pytestmark = pytest.mark.e2e

TORCHFLEET = Path(sys.executable).parent / "torchfleet"
DDP_CHECK = Path(__file__).parent / "scripts" / "ddp_check.py"
# rich's live display on a terminal hides the cursor while it draws.
HIDE_CURSOR = "\x1b[?25l"


def in_terminal(argv: list[str], timeout: float) -> tuple[int, str]:
    """Runs ``argv`` on a pseudo-terminal; its exit status and all it wrote."""
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "160", "LINES": "40"}
    pid, fd = pty.fork()
    if pid == 0:  # the child: the terminal is its stdin, stdout and stderr
        os.execve(argv[0], argv, env)
    written = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            written += chunk
        else:
            os.kill(pid, 9)
            raise AssertionError(f"{argv} still ran after {timeout:g}s:\n{written.decode()}")
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), written.decode(errors="replace")


def run(cluster: Any, namespace: str, script: Path, name: str, *flags: str) -> list[str]:
    return [
        str(TORCHFLEET), "run", str(script), "--name", name,
        "--kubeconfig", cluster.kubeconfig, "-n", namespace,
        "--node-selector", f"{LOCAL_NODE_LABEL}={E2E_SESSION}",
        "--toleration", f"{LOCAL_NODE_LABEL}={E2E_SESSION}:NoSchedule",
        *flags,
    ]  # fmt: skip


def plain(text: str) -> str:
    """The terminal's text, a line break for each control sequence (the bar
    is redrawn in place; what is printed above it is a line of its own)."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\r", "\n", text)


def test_a_ddp_script_runs_to_success_and_the_command_exits_0(
    cluster: Any, e2e_namespace: str, node_agent: Any, e2e_operator: Any
) -> None:
    argv = run(cluster, e2e_namespace, DDP_CHECK, "cli-ddp", "--nodes", "2")
    code, written = in_terminal([*argv, "--procs-per-node", "2"], timeout=420)
    assert code == 0, written
    assert HIDE_CURSOR in written, "no live display on the terminal"
    shown = plain(written)
    assert re.search(r"^((Pending|Running) -> )?Succeeded$", shown, re.M), shown
    # The script ran: each of the four ranks printed its report in its pod.
    reports = [
        line
        for pod in ("cli-ddp-master-0", "cli-ddp-worker-0")
        for line in node_agent.logs(e2e_namespace, pod, "trainer")[-1].splitlines()
        if line.startswith('{"rank"')
    ]
    assert len(reports) == 4, reports


def test_a_script_that_raises_exits_1_with_the_reason_after_its_restarts(
    cluster: Any, e2e_namespace: str, node_agent: Any, e2e_operator: Any, tmp_path: Path
) -> None:
    script = tmp_path / "broken.py"
    script.write_text("raise RuntimeError('the data loader found no shards')\n")
    code, written = in_terminal(run(cluster, e2e_namespace, script, "cli-broken"), timeout=420)
    shown = plain(written)
    assert code == 1, shown
    assert "Error: cli-broken failed: BackoffLimitExceeded: pod cli-broken-master-0" in shown
    # Each restart's reason was printed above the bar while the status held it
    # (a gang that came back between two looks leaves "restart N").
    restarts = re.findall(r"^(?:PodFailed: restart|restart) (\d)", shown, re.M)
    assert restarts == ["1", "2", "3"], shown
