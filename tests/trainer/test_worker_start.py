"""What a new round's workers wait for in the launcher, and how they are found.

The agent forks every worker from the launcher's warm forkserver (worker.py):
a worker names itself after its rank, since its command line and environ are
the forkserver's; and the agent's log of a failed worker must not import
torch._dynamo into the launcher before the next round can start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.fixtures.trainer import REPO_ROOT
from torchfleet_trainer.launcher import procname

pytestmark = pytest.mark.trainer

# The agent's log of a worker that failed, as MultiprocessContext writes it.
LOG_A_FAILED_WORKER = """
import json, sys
from torchfleet_trainer.launcher import launch
from torch.distributed.elastic.multiprocessing import api
launch.format_agent_tracebacks_plainly()
try:
    raise RuntimeError("worker 0 exited 202")
except RuntimeError:
    api.logger.exception("failed (exitcode: 202) local_rank: 0")
print(json.dumps({"dynamo": "torch._dynamo" in sys.modules}))
"""


def test_the_agents_log_of_a_failed_worker_keeps_its_traceback_without_importing_dynamo() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LOG_A_FAILED_WORKER],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"dynamo": False}
    assert "failed (exitcode: 202) local_rank: 0" in done.stderr
    assert "Traceback (most recent call last):" in done.stderr
    assert "RuntimeError: worker 0 exited 202" in done.stderr


def test_a_worker_is_found_by_the_rank_it_named_itself_after() -> None:
    named = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from torchfleet_trainer.launcher import procname\n"
            "assert procname.name_this_process(12345)\n"
            "print('named', flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    try:
        assert named.stdout is not None and named.stdout.readline() == "named\n"
        assert procname.rank_of(named.pid) == 12345
        # Any other process has no rank, nor has one that is gone (below).
        assert procname.rank_of(os.getpid()) is None
    finally:
        named.kill()
        named.wait()
    assert procname.rank_of(named.pid) is None
