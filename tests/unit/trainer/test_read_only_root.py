"""What torch writes at run time lands on the training pod's scratch volume (an
emptyDir over /tmp, desired/security.py) when the root filesystem is read-only:
TorchInductor's cache, the Triton kernels it compiles and torchelastic's logs
all default to /tmp, or go where the operator's variables point."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from torch._inductor.runtime.cache_dir_utils import default_cache_dir, triton_cache_dir
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

from torchfleet_operator.desired import security

SCRATCH = Path(security.SCRATCH_PATH)


@pytest.fixture
def pod_tmp(monkeypatch: pytest.MonkeyPatch):
    """The pod's environment as to temporary files: no TMPDIR, so /tmp."""
    for name in ("TMPDIR", "TEMP", "TMP", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)


def on_scratch(path: str | Path) -> bool:
    return Path(path).is_relative_to(SCRATCH)


def test_inductors_cache_and_its_triton_kernels_default_to_tmp(pod_tmp) -> None:
    assert on_scratch(default_cache_dir())
    assert on_scratch(triton_cache_dir(0))


def test_the_operators_triton_cache_dir_is_the_one_inductor_uses(
    pod_tmp, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", security.SCRATCH_CACHE_ENV["TRITON_CACHE_DIR"])
    assert triton_cache_dir(0) == security.SCRATCH_CACHE_ENV["TRITON_CACHE_DIR"]
    assert all(on_scratch(path) for path in security.SCRATCH_CACHE_ENV.values())


def test_torchelastics_logs_default_to_tmp(pod_tmp) -> None:
    logs = DefaultLogsSpecs()
    assert on_scratch(logs.root_log_dir)
