"""tieEmbeddings survives meta-device init in every layout that allows it.

``to_empty()`` used to hand the output projection and the token embedding
tensors of their own (DDP and single-process layouts), so a tied model trained
two matrices. Two gloo ranks build each layout with meta-device init forced
on CPU, check the two are one parameter with one storage, train two steps
and check again. Tensor and pipeline parallelism refuse tying in the config
(tests/unit/trainer/test_config.py).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from tests.fixtures.trainer import REPO_ROOT, run_in_own_session

pytestmark = pytest.mark.trainer

LAYOUTS = {
    "single": [],
    "fsdp": ["parallel.dataParallelShard=2"],
    "ddp": ["parallel.dataParallelReplicate=2"],
}
# The GPT above untied: 2 blocks x (6 matrices + 2 norm gains), the token and
# position embeddings, the final norm gain and the output matrix.
UNTIED_PARAMETERS = 20


@pytest.fixture(scope="module")
def tie_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("tie") / "results.json"
    worker = REPO_ROOT / "tests" / "trainer" / "tie_worker.py"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(worker),
        str(out),
        json.dumps(LAYOUTS),
    ]
    code, stdout, stderr = run_in_own_session(cmd, timeout=300)
    assert code == 0, f"stdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-5000:]}"
    return dict(json.loads(out.read_text()))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_tie_survives_meta_init_and_training(tie_results: dict[str, Any], layout: str) -> None:
    facts = tie_results[layout]
    for when in ("before", "after"):
        tie = facts[when]
        assert tie["same_parameter"] and tie["same_storage"] and tie["equal"], (when, tie)
        assert tie["parameters"] == UNTIED_PARAMETERS - 1, (when, tie)
    assert facts["trained"] and facts["losses_finite"], facts
