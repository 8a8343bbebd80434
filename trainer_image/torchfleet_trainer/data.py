"""Token sources and a resumable, data-parallel batch sampler.

Every batch is drawn nanoGPT-style (random windows of ``seq_len + 1`` tokens)
from a generator seeded by ``(seed, split, batch_index)``. The global batch of
a step is therefore the same whatever the parallel layout, each data-parallel
rank reads only its own slice of it, and a resumed run that restores
``batch_index`` sees exactly the batches it would have seen.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from torchfleet_contract.trainer_config import ConfigError, DataConfig

Split = Literal["train", "val"]


@dataclass
class TokenCorpus:
    """Train and validation token arrays (possibly memory-mapped) and the vocabulary size."""

    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    # For character data: decoded characters, index = token id.
    chars: str | None = None

    def split(self, name: Split) -> np.ndarray:
        return self.train if name == "train" else self.val


def _split_tail(tokens: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    cut = int(len(tokens) * (1.0 - val_fraction))
    return tokens[:cut], tokens[cut:]


def load_char_corpus(path: str | Path, val_fraction: float) -> TokenCorpus:
    """A text file as characters; the vocabulary is its sorted distinct characters."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"data.path: cannot read {path}: {err.strerror}") from None
    chars = "".join(sorted(set(text)))
    lookup = np.zeros(max(map(ord, chars)) + 1, dtype=np.uint16)
    lookup[[ord(c) for c in chars]] = np.arange(len(chars), dtype=np.uint16)
    tokens = lookup[np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)]
    train, val = _split_tail(tokens, val_fraction)
    return TokenCorpus(train, val, len(chars), chars)


def load_token_files(config: DataConfig, vocab_size: int | None) -> TokenCorpus:
    """Memory-mapped ``.bin`` token files: a directory with train.bin/val.bin, or one file."""
    assert config.path is not None
    path = Path(config.path)
    dtype = np.dtype(config.token_dtype)
    train: np.ndarray
    val: np.ndarray
    if path.is_dir():
        files = [path / "train.bin", path / "val.bin"]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ConfigError(f"data.path: missing {', '.join(missing)}")
        train, val = (np.memmap(f, dtype=dtype, mode="r") for f in files)
    elif path.is_file():
        train, val = _split_tail(np.memmap(path, dtype=dtype, mode="r"), config.val_fraction)
    else:
        raise ConfigError(f"data.path: {path} does not exist")
    if vocab_size is None:
        raise ConfigError("model.vocabSize: required with data.kind 'tokens'")
    return TokenCorpus(train, val, vocab_size)


def synthetic_corpus(config: DataConfig, vocab_size: int | None, seed: int) -> TokenCorpus:
    vocab = vocab_size or 256
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, size=config.synthetic_tokens, dtype=np.int64)
    train, val = _split_tail(tokens.astype(np.uint32), max(config.val_fraction, 0.01))
    return TokenCorpus(train, val, vocab)


def load_corpus(
    config: DataConfig, vocab_size: int | None, seed: int, evaluates: bool = True
) -> TokenCorpus:
    """The corpus; its validation split must hold a sequence when ``evaluates``."""
    if config.kind == "char":
        assert config.path is not None
        corpus = load_char_corpus(config.path, config.val_fraction)
        if vocab_size is not None and vocab_size < corpus.vocab_size:
            raise ConfigError(
                f"model.vocabSize: {vocab_size} is smaller than the text's "
                f"{corpus.vocab_size} distinct characters"
            )
    elif config.kind == "tokens":
        corpus = load_token_files(config, vocab_size)
    else:
        corpus = synthetic_corpus(config, vocab_size, seed)
    for name in ("train", "val"):
        if len(corpus.split(name)) <= config.seq_len + 1 and (name == "train" or evaluates):
            raise ConfigError(
                f"data.path: the {name} split has {len(corpus.split(name))} tokens, fewer "
                f"than data.seqLen+1={config.seq_len + 1}"
            )
    return corpus


@dataclass
class BatchSampler:
    """Draws the global batch of each step and hands a data-parallel rank its slice.

    ``position`` counts global micro-batches drawn per split; saving and
    restoring it is all a checkpoint needs for the data to resume exactly.
    """

    corpus: TokenCorpus
    seq_len: int
    seed: int
    dp_rank: int = 0
    dp_degree: int = 1

    def __post_init__(self) -> None:
        self.position: dict[str, int] = {"train": 0, "val": 0}

    def next_batch(self, split: Split, global_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) for this rank: its ``global_batch / dp_degree`` rows."""
        index = self.position[split]
        self.position[split] += 1
        return self.batch_at(split, index, global_batch)

    def batch_at(
        self, split: Split, index: int, global_batch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows of global batch ``index`` of ``split``; moves nothing."""
        return inputs_and_targets(self.windows_at(split, index, global_batch))

    def windows_at(self, split: Split, index: int, global_batch: int) -> torch.Tensor:
        """This rank's windows of ``seq_len + 1`` tokens of global batch ``index``."""
        tokens = self.corpus.split(split)
        mine = self.starts_at(split, index, global_batch)
        windows = np.stack([tokens[s : s + self.seq_len + 1] for s in mine]).astype(np.int64)
        return torch.from_numpy(windows)

    def starts_at(self, split: Split, index: int, global_batch: int) -> np.ndarray:
        """Where this rank's windows of global batch ``index`` start in ``split``."""
        tokens = self.corpus.split(split)
        split_id = 0 if split == "train" else 1
        rng = np.random.default_rng((self.seed, split_id, index))
        starts = rng.integers(0, len(tokens) - self.seq_len - 1, size=global_batch)
        local = global_batch // self.dp_degree
        return starts[self.dp_rank * local : (self.dp_rank + 1) * local]

    def state_dict(self) -> dict[str, int]:
        return {f"position_{k}": v for k, v in self.position.items()}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = {k: int(state[f"position_{k}"]) for k in self.position}


Batch = tuple[torch.Tensor, torch.Tensor]


def inputs_and_targets(windows: torch.Tensor) -> Batch:
    """Windows of ``seq_len + 1`` tokens as (inputs, targets): views, no copy."""
    return windows[:, :-1], windows[:, 1:]


class TrainBatchPrefetcher:
    """Draws the next training batch on a background thread while the step runs.

    On CUDA the batch lands in pinned host memory (PyTorch caches the pinned
    blocks), so the copy to the GPU is asynchronous. The sampler's position
    counts only batches handed out, so a checkpoint resumes exactly; a batch
    drawn ahead for another position (after a resume) is dropped.
    """

    def __init__(self, sampler: BatchSampler, device: torch.device) -> None:
        self.sampler = sampler
        self.pin = device.type == "cuda"
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-prefetch")
        # (index, global rows) of the batch being drawn ahead, and its future.
        self.ahead: tuple[tuple[int, int], Future[Batch]] | None = None

    def next(self, global_batch: int) -> Batch:
        index = self.sampler.position["train"]
        ahead, self.ahead = self.ahead, None
        if ahead is not None and ahead[0] == (index, global_batch):
            batch = ahead[1].result()
        else:
            batch = self._draw(index, global_batch)
        self.sampler.position["train"] = index + 1
        future = self.pool.submit(self._draw, index + 1, global_batch)
        self.ahead = ((index + 1, global_batch), future)
        return batch

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def _draw(self, index: int, global_batch: int) -> Batch:
        inputs, targets = self.sampler.batch_at("train", index, global_batch)
        if not self.pin:
            return inputs, targets
        return _pinned(inputs), _pinned(targets)


def _pinned(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous copy in page-locked memory (one copy, even from a view)."""
    return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True).copy_(tensor)


# The training split is held on a GPU when it takes at most this share of its
# memory (and at most DEVICE_CORPUS_MAX_BYTES): tiny Shakespeare's 1M tokens
# take 4 MB.
DEVICE_CORPUS_MAX_SHARE = 0.05
DEVICE_CORPUS_MAX_BYTES = 2**30


class DeviceBatches:
    """Training batches gathered on the device from a training split held there.

    The same batches as the sampler's, in the same order, with the same resume
    position: the window starts come from the sampler (a few numbers per batch),
    the tokens never cross to the device again. Tokens are kept as int32 (half
    the bytes) and widened per batch.
    """

    def __init__(self, sampler: BatchSampler, device: torch.device) -> None:
        self.sampler = sampler
        self.device = device
        train = np.asarray(sampler.corpus.train)
        self.tokens = torch.from_numpy(train.astype(np.int32)).to(device)
        self.offsets = torch.arange(sampler.seq_len + 1, device=device)

    @staticmethod
    def fits(sampler: BatchSampler, device: torch.device) -> bool:
        """Whether the training split should be held on ``device`` (CUDA only: on a
        CPU the host's batches are already where the model is)."""
        if device.type != "cuda":
            return False
        size = len(sampler.corpus.train) * 4
        total = torch.cuda.get_device_properties(device).total_memory
        return size <= min(DEVICE_CORPUS_MAX_BYTES, DEVICE_CORPUS_MAX_SHARE * total)

    def next(self, global_batch: int) -> Batch:
        index = self.sampler.position["train"]
        self.sampler.position["train"] = index + 1
        starts = torch.from_numpy(self.sampler.starts_at("train", index, global_batch))
        if self.device.type == "cuda":
            # From pageable memory the copy would wait for the device's queue.
            starts = starts.pin_memory()
        starts = starts.to(self.device, non_blocking=True)
        windows = self.tokens[starts[:, None] + self.offsets].long()
        return inputs_and_targets(windows)

    def close(self) -> None:
        """Nothing runs in the background."""
