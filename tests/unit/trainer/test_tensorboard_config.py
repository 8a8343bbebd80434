"""Where the TensorBoard curves go, and which steps a (resumed) run's writer purges."""

from __future__ import annotations

from pathlib import Path

from torchfleet_contract.trainer_config import ResolvedDegrees, load_config
from torchfleet_trainer import tensorboard as tb


def test_dir_defaults_to_the_checkpoint_dir_and_is_none_without_either(tmp_path: Path) -> None:
    default = load_config(env={})
    assert tb.resolve_dir(default, str(tmp_path)) == tmp_path / "tensorboard"
    assert tb.resolve_dir(default, None) is None, "no checkpoint dir, no dir: no TensorBoard"
    configured = load_config(overrides=[f"tensorboard.dir={tmp_path / 'tb'}"], env={})
    assert tb.resolve_dir(configured, None) == tmp_path / "tb"
    assert tb.resolve_dir(configured, str(tmp_path)) == tmp_path / "tb"
    disabled = load_config(overrides=["tensorboard.enabled=false"], env={})
    assert tb.resolve_dir(disabled, str(tmp_path)) is None
    assert tb.TensorBoardLog.open(None, start_step=0) is None


def test_a_resumed_run_purges_the_steps_it_trains_again_a_fresh_one_everything() -> None:
    assert tb.purge_step(0) == 0
    assert tb.purge_step(50) == 51


def test_config_summary_names_the_layout() -> None:
    config = load_config(env={})
    degrees = ResolvedDegrees(dp_replicate=2, dp_shard=2, tp=2, pp=1)
    text = tb.config_summary(config, degrees, world_size=8)
    assert text.startswith("**Parallel layout:** world size 8 = pp 1 x dp_replicate 2")
    assert '    "tensorboard": {' in text
    assert "single process (world size 1)" in tb.config_summary(config, None, 1)
