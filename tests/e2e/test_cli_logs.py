"""``torchfleet logs`` reads a live pod's log through the API server from a
real kubelet (the real node: containerd, busybox): node rank N's pod of the
job's gang, all of it or followed with ``-f``. ``torchfleet attach`` shows a
rank's log gang after gang while it follows the job to its end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.poll import wait_for
from tests.fixtures.realnode import REAL_NODE_ONLY, busybox_job

TORCHFLEET = Path(sys.executable).parent / "torchfleet"

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, REAL_NODE_ONLY]

# A greeting, then a numbered line each second: a followed log must bring
# lines written after the command started.
GREET_THEN_TICK = """
echo "node $NODE_RANK of $NNODES says hello"
i=0
while true; do i=$((i + 1)); echo "tick $i"; sleep 1; done
"""


def test_logs_reads_the_live_pod_of_each_node_rank_and_follows_it(
    cluster: Any, e2e_namespace: str, real_node: Any, e2e_operator: Any
) -> None:
    namespace = e2e_namespace
    job = busybox_job("talk", GREET_THEN_TICK, "32Mi")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job))
    flags = ["--kubeconfig", cluster.kubeconfig, "-n", namespace]

    def logs(*args: str) -> str:
        out = subprocess.run(
            [str(TORCHFLEET), "logs", "talk", *flags, *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return out.stdout if out.returncode == 0 else ""

    def first_line(*args: str) -> str:
        return logs(*args).partition("\n")[0]

    assert wait_for("node rank 0's greeting", first_line, 180) == "node 0 of 2 says hello"
    assert wait_for("node rank 1's greeting", lambda: first_line("--rank", "1")) == (
        "node 1 of 2 says hello"
    )
    follower = subprocess.Popen(
        [str(TORCHFLEET), "logs", "talk", *flags, "--rank", "1", "-f"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # The ticks written by the time the follower ran: the next one comes later.
        ticks = logs("--rank", "1").count("tick ")
        assert follower.stdout is not None
        assert follower.stdout.readline() == "node 1 of 2 says hello\n"
        for line in follower.stdout:
            if line == f"tick {ticks + 1}\n":
                break
        else:
            raise AssertionError(f"the followed log ended before tick {ticks + 1}")
    finally:
        follower.kill()
        follower.wait()


# Node rank 0 of the first gang fails after its lines; the second gang's succeeds.
# Ten seconds of lines: the window in which the follower (polling once a
# second) must find the first gang's pod, which goes with the gang restart.
FAIL_ONCE = """
echo "gang $TORCHFLEET_RESTART_COUNT, node $NODE_RANK"
i=0
while [ $i -lt 10 ]; do i=$((i + 1)); echo "line $i"; sleep 1; done
if [ "$TORCHFLEET_RESTART_COUNT" = 0 ] && [ "$NODE_RANK" = 0 ]; then exit 3; fi
"""


def test_attach_shows_rank_0s_log_gang_after_gang_until_the_job_succeeds(
    cluster: Any, e2e_namespace: str, real_node: Any, e2e_operator: Any
) -> None:
    namespace = e2e_namespace
    # Made suspended, so that attach follows it from before its first pod.
    job = busybox_job("retry", FAIL_ONCE, "32Mi", suspend=True)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job))
    attach = subprocess.Popen(
        [str(TORCHFLEET), "attach", "retry", "--kubeconfig", cluster.kubeconfig, "-n", namespace],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        cluster.kubectl(
            "patch", "tj", "retry", "-n", namespace, "--type=merge", "-p",
            '{"spec": {"suspend": false}}',
        )  # fmt: skip
        out, err = attach.communicate(timeout=240)
    finally:
        attach.kill()
    assert attach.returncode == 0, out + err
    lines = out.splitlines()
    numbered = [f"line {i}" for i in range(1, 11)]
    first = lines.index("── retry-master-0 (gang 0) ──")
    second = lines.index("── retry-master-0 (gang 1) ──")
    assert lines[first + 1 : second] == ["gang 0, node 0", *numbered], out
    assert lines[second + 1 :] == ["gang 1, node 0", *numbered], out
