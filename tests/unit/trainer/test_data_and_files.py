"""Data sources, the resumable sampler, LR schedule, checkpoint directory rules, launch checks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.fixtures.trainer import shakespeare_file
from torchfleet_contract import pod as contract
from torchfleet_contract.trainer_config import ConfigError, DataConfig, TrainConfig, load_config
from torchfleet_trainer.checkpoint import MARKER, latest_complete, prune, step_dir
from torchfleet_trainer.data import BatchSampler, load_char_corpus, load_corpus
from torchfleet_trainer.launcher.launch import launch
from torchfleet_trainer.launcher.outcomes import EXIT_CONFIG
from torchfleet_trainer.schedule import lr_at


def test_char_corpus_splits_90_10_like_nanogpt(tmp_path: Path) -> None:
    path = shakespeare_file()
    if path is None:
        path = tmp_path / "text.txt"
        path.write_text("hello world, " * 1000)
        corpus = load_char_corpus(path, 0.1)
        assert corpus.vocab_size == len(set("hello world, "))
    else:
        corpus = load_char_corpus(path, 0.1)
        assert (corpus.vocab_size, len(corpus.train), len(corpus.val)) == (65, 1003854, 111540)
    assert corpus.chars is not None
    text = path.read_text()
    assert "".join(corpus.chars[t] for t in corpus.train[:50]) == text[:50]


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_memmapped_token_directory(tmp_path: Path, dtype: str) -> None:
    np.arange(1000, dtype=dtype).tofile(tmp_path / "train.bin")
    np.arange(500, dtype=dtype).tofile(tmp_path / "val.bin")
    config = DataConfig(kind="tokens", path=str(tmp_path), token_dtype=dtype, seq_len=8)  # type: ignore[arg-type]
    corpus = load_corpus(config, vocab_size=70000 if dtype == "uint32" else 1000, seed=0)
    assert isinstance(corpus.train, np.memmap)
    assert (len(corpus.train), len(corpus.val), int(corpus.train[999])) == (1000, 500, 999)


def test_token_source_errors_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data\.path: missing .*val\.bin"):
        np.zeros(100, dtype=np.uint16).tofile(tmp_path / "train.bin")
        load_corpus(DataConfig(kind="tokens", path=str(tmp_path)), 10, 0)
    short = tmp_path / "short.txt"
    short.write_text("abc")
    with pytest.raises(ConfigError, match=r"data\.path: the train split has"):
        load_corpus(DataConfig(kind="char", path=str(short), seq_len=8), None, 0)
    with pytest.raises(ConfigError, match=r"model\.vocabSize: 2 is smaller"):
        short.write_text("abcdefgh" * 100)
        load_corpus(DataConfig(kind="char", path=str(short), seq_len=8), 2, 0)


def test_data_parallel_ranks_split_the_same_global_batch_and_resume_exactly() -> None:
    corpus = load_corpus(DataConfig(seq_len=8, synthetic_tokens=5000), 32, seed=1)
    whole = BatchSampler(corpus, 8, seed=3)
    halves = [BatchSampler(corpus, 8, seed=3, dp_rank=r, dp_degree=2) for r in range(2)]
    for _ in range(3):
        inputs, targets = whole.next_batch("train", 6)
        parts = [s.next_batch("train", 6) for s in halves]
        torch.testing.assert_close(torch.cat([p[0] for p in parts]), inputs)
        torch.testing.assert_close(inputs[:, 1:], targets[:, :-1])
    state = whole.state_dict()
    expected = whole.next_batch("train", 6)
    fresh = BatchSampler(corpus, 8, seed=3)
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh.next_batch("train", 6), expected)


def test_lr_warms_up_then_decays_to_min_ratio() -> None:
    config = load_config(
        overrides=["training.steps=100", "schedule.warmupSteps=10", "optimizer.lr=1.0"], env={}
    )
    assert lr_at(1, config) == pytest.approx(0.1)
    assert lr_at(10, config) == pytest.approx(1.0)
    assert lr_at(55, config) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_at(100, config) == pytest.approx(0.1)
    linear = config.model_copy(
        update={"schedule": config.schedule.model_copy(update={"kind": "linear"})}
    )
    assert lr_at(55, linear) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_at(32, linear) == pytest.approx(0.1 + 0.9 * (1 - 22 / 90))


def make_checkpoint(root: Path, step: int, complete: bool) -> Path:
    path = step_dir(root, step)
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(b"x")
    if complete:
        (path / MARKER).write_text(json.dumps({"step": step}))
    return path


def test_only_marked_checkpoints_load_and_the_last_k_are_kept(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        make_checkpoint(tmp_path, step, complete=True)
    make_checkpoint(tmp_path, 50, complete=False)
    (tmp_path / "step-00000035.partial").mkdir()
    (tmp_path / "step-00000060.partial").mkdir()
    assert latest_complete(tmp_path) == (40, step_dir(tmp_path, 40))
    removed = prune(tmp_path, keep_last=2)
    assert sorted(p.name for p in removed) == [
        "step-00000010",
        "step-00000020",
        "step-00000035.partial",
    ]
    # A save possibly still in flight (newer than the newest complete) is left alone.
    assert (tmp_path / "step-00000060.partial").is_dir()
    assert latest_complete(tmp_path / "absent") is None


def test_launch_refuses_degrees_that_do_not_fit_the_pod(capsys: pytest.CaptureFixture[str]) -> None:
    config = TrainConfig.model_validate({"parallel": {"tensor": 2}})
    env = {contract.NNODES: "1", contract.NPROC_PER_NODE: "3"}
    assert launch(config, env=env) == EXIT_CONFIG
    assert "parallel: world size 3 is not divisible" in capsys.readouterr().err
    assert launch(config, env={contract.MASTER_PORT: "http"}) == EXIT_CONFIG
    assert f"{contract.MASTER_PORT} must be an integer" in capsys.readouterr().err


def test_an_empty_validation_split_is_an_error_only_when_evaluating(tmp_path: Path) -> None:
    # A single token file not named .bin passes config validation; loading catches it.
    np.arange(1000, dtype=np.uint16).tofile(tmp_path / "tokens.dat")
    config = DataConfig(kind="tokens", path=str(tmp_path / "tokens.dat"), val_fraction=0, seq_len=8)
    assert len(load_corpus(config, 1000, 0, evaluates=False).val) == 0
    with pytest.raises(ConfigError, match=r"data\.path: the val split has 0 tokens"):
        load_corpus(config, 1000, 0, evaluates=True)
