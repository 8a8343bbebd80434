"""Meta-device init, forced on CPU, in the layouts GPUs use it in.

Two gloo ranks run tests/trainer/meta_init_worker.py over each layout.

* tieEmbeddings survives: ``to_empty()`` used to hand the output projection
  and the token embedding tensors of their own (DDP and single-process), so a
  tied model trained two matrices. Tensor and pipeline parallelism refuse
  tying in the config (tests/unit/trainer/test_config.py).
* A user model without ``init_weights`` (only reset_parameters-able layers
  and a causal-mask buffer) materialises to exactly its direct build with the
  same seed, also when FSDP shards it (each rank keeps its shard of the whole
  tensors, instead of drawing every shard from the same stream).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest

from tests.fixtures.trainer import REPO_ROOT, run_in_own_session, trainer_env

pytestmark = pytest.mark.trainer

LAYOUTS: dict[str, dict[str, Any]] = {
    "single_tie": {"check": "tie", "overrides": []},
    "fsdp_tie": {"check": "tie", "overrides": ["parallel.dataParallelShard=2"]},
    "ddp_tie": {"check": "tie", "overrides": ["parallel.dataParallelReplicate=2"]},
    "single_user_model": {"check": "direct", "overrides": []},
    "fsdp_user_model": {"check": "direct", "overrides": ["parallel.dataParallelShard=2"]},
    "ddp_user_model": {"check": "direct", "overrides": ["parallel.dataParallelReplicate=2"]},
}
# The tied GPT untied: 2 blocks x (6 matrices + 2 norm gains), the token and
# position embeddings, the final norm gain and the output matrix.
UNTIED_PARAMETERS = 20


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("meta_init") / "results.json"
    worker = REPO_ROOT / "tests" / "trainer" / "meta_init_worker.py"
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
    env = trainer_env()
    # The worker imports the user model from tests/.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    code, stdout, stderr = run_in_own_session(cmd, timeout=300, env=env)
    assert code == 0, f"stdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-5000:]}"
    return dict(json.loads(out.read_text()))


@pytest.mark.parametrize("layout", sorted(k for k, v in LAYOUTS.items() if v["check"] == "tie"))
def test_tie_survives_meta_init_and_training(results: dict[str, Any], layout: str) -> None:
    facts = results[layout]
    for when in ("before", "after"):
        tie = facts[when]
        assert tie["same_parameter"] and tie["same_storage"] and tie["equal"], (when, tie)
        assert tie["parameters"] == UNTIED_PARAMETERS - 1, (when, tie)
    assert facts["trained"] and facts["losses_finite"], facts


@pytest.mark.parametrize("layout", sorted(k for k, v in LAYOUTS.items() if v["check"] == "direct"))
def test_user_model_equals_its_direct_build(results: dict[str, Any], layout: str) -> None:
    facts = results[layout]
    assert facts["names"] == facts["expected_names"]
    assert "mask" in facts["names"]
    assert facts["differing"] == [], facts["differing"]
