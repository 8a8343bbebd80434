"""How a worker forked from the launcher's warm forkserver (worker.py) is
found: it names itself after its rank, since its command line and environ are
the forkserver's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.fixtures.trainer import REPO_ROOT
from torchfleet_trainer import procname

pytestmark = pytest.mark.trainer


def test_a_worker_is_found_by_the_rank_it_named_itself_after() -> None:
    named = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from torchfleet_trainer import procname\n"
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
