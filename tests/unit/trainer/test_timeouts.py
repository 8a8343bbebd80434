"""What counts as a lost peer, and the tight timeout's value."""

from __future__ import annotations

import torch.distributed as dist

from torchfleet_trainer.timeouts import STEP_TIME_FACTOR, is_peer_failure, tight_timeout


def test_gloo_timeouts_and_resets_are_peer_failures() -> None:
    # The messages gloo raised here (torch 2.15) for a silent and a killed peer.
    timed_out = "[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv"
    assert is_peer_failure(RuntimeError(timed_out))
    assert is_peer_failure(
        RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer")
    )
    assert is_peer_failure(dist.DistBackendError("NCCL communicator was aborted"))


def test_a_programs_own_error_is_not() -> None:
    assert not is_peer_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_peer_failure(ValueError("timed out"))


def test_the_floor_holds_for_fast_steps_and_slow_steps_raise_it() -> None:
    assert tight_timeout(120.0, 0.5) == 120.0
    assert tight_timeout(120.0, 30.0) == 30.0 * STEP_TIME_FACTOR
