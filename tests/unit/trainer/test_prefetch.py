"""The training-batch prefetcher: drawn ahead on another thread, yet the same
batches, in the same order, and the same resume position as the plain sampler."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

from torchfleet_contract.trainer_config import DataConfig
from torchfleet_trainer.data import (
    Batch,
    BatchSampler,
    DeviceBatches,
    Split,
    TrainBatchPrefetcher,
    load_corpus,
)


class WatchedSampler(BatchSampler):
    """Records which batch indices were drawn, and on which thread."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.drawn: list[tuple[int, str]] = []
        self.drew_ahead = threading.Event()

    def batch_at(self, split: Split, index: int, global_batch: int) -> Batch:
        batch = super().batch_at(split, index, global_batch)
        thread = threading.current_thread().name
        self.drawn.append((index, thread))
        if thread != "MainThread":
            self.drew_ahead.set()
        return batch


def samplers() -> tuple[WatchedSampler, BatchSampler]:
    corpus = load_corpus(DataConfig(seq_len=8, synthetic_tokens=5000), 32, seed=1)
    return WatchedSampler(corpus, 8, seed=3), BatchSampler(corpus, 8, seed=3)


@contextlib.contextmanager
def prefetching(sampler: BatchSampler, device: str = "cpu") -> Iterator[TrainBatchPrefetcher]:
    prefetcher = TrainBatchPrefetcher(sampler, torch.device(device))
    try:
        yield prefetcher
    finally:
        prefetcher.close()


def test_the_next_batch_is_drawn_on_another_thread_while_the_step_runs() -> None:
    watched, _ = samplers()
    with prefetching(watched) as prefetcher:
        prefetcher.next(6)
        assert watched.drew_ahead.wait(timeout=30), "nothing drawn ahead"
        assert watched.drawn[0] == (0, "MainThread")
        index, thread = watched.drawn[1]
        assert index == 1 and thread.startswith("batch-prefetch")
        # Handed out one batch: a checkpoint now must resume at the second.
        assert watched.state_dict()["position_train"] == 1
        prefetcher.next(6)
        # Batch 1 came from the prefetch: the main thread drew only batch 0.
        assert [i for i, t in watched.drawn if t == "MainThread"] == [0]


def test_prefetched_batches_equal_the_samplers_also_across_a_resume() -> None:
    watched, plain = samplers()
    with prefetching(watched) as prefetcher:
        for _ in range(3):
            torch.testing.assert_close(prefetcher.next(6), plain.next_batch("train", 6))
        # A resume moves the position under the prefetcher: batch 3 drawn ahead is dropped.
        watched.load_state_dict({"position_train": 1, "position_val": 0})
        plain.load_state_dict({"position_train": 1, "position_val": 0})
        torch.testing.assert_close(prefetcher.next(6), plain.next_batch("train", 6))
        # A different batch size is drawn afresh too.
        torch.testing.assert_close(prefetcher.next(4), plain.next_batch("train", 4))
        assert watched.state_dict() == plain.state_dict()


def test_host_batches_are_pinned_only_for_a_gpu() -> None:
    watched, _ = samplers()
    with prefetching(watched) as prefetcher:
        inputs, targets = prefetcher.next(6)
        assert not prefetcher.pin and not inputs.is_pinned() and not targets.is_pinned()
    with prefetching(watched, "cuda") as for_gpu:
        assert for_gpu.pin


def test_batches_gathered_on_the_device_equal_the_samplers_also_across_a_resume() -> None:
    # On CPU the "device" is the host; the gather path is the one a GPU runs.
    on_device, plain = samplers()
    batches = DeviceBatches(on_device, torch.device("cpu"))
    for rows in (6, 6, 4):
        torch.testing.assert_close(batches.next(rows), plain.next_batch("train", rows))
    on_device.load_state_dict({"position_train": 1, "position_val": 0})
    plain.load_state_dict({"position_train": 1, "position_val": 0})
    torch.testing.assert_close(batches.next(6), plain.next_batch("train", 6))
    assert on_device.state_dict() == plain.state_dict()
    # Held on a GPU only: on a CPU the host's batches already are where the model is.
    assert not DeviceBatches.fits(on_device, torch.device("cpu"))
