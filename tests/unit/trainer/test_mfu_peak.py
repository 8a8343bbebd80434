"""MFU's peak comes from the device the run is on, at the run's precision."""

from __future__ import annotations

import json

import pytest

from tests.trainer.user_models import TINY_LLAMA
from torchfleet_contract.trainer_config import load_config
from torchfleet_trainer.metrics import device_peak_tflops, mfu_peak_tflops, no_peak_message
from torchfleet_trainer.train import Trainer, build_runtime


@pytest.mark.parametrize(
    ("device_name", "precision", "peak"),
    [
        # What torch.cuda.get_device_name() reports on each.
        ("NVIDIA H100 80GB HBM3", "bf16", 989.0),
        ("NVIDIA H100 80GB HBM3", "fp32", 67.0),
        ("NVIDIA H200", "bf16", 989.0),
        ("NVIDIA H100 PCIe", "bf16", 756.0),
        ("NVIDIA H100 NVL", "fp32", 60.0),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA A100-PCIE-40GB", "fp32", 19.5),
    ],
)
def test_known_devices_have_their_dense_peak(device_name, precision, peak) -> None:
    assert device_peak_tflops(device_name, precision) == peak


def test_an_unknown_device_has_no_peak_rather_than_another_devices() -> None:
    assert device_peak_tflops("NVIDIA GeForce RTX 4090", "bf16") is None
    assert mfu_peak_tflops(None, "NVIDIA GeForce RTX 4090", "bf16") is None


def test_an_unknown_device_is_named_with_the_setting_that_fixes_it() -> None:
    message = no_peak_message("NVIDIA B200")
    assert "'NVIDIA B200' is not in torchfleet_trainer.metrics.DEVICE_PEAKS" in message
    assert "H100" in message and "metrics.peakTflops" in message and "--peak-tflops" in message


def test_configured_peak_wins_and_cpu_has_none_without_it() -> None:
    assert mfu_peak_tflops(500.0, "NVIDIA H100 80GB HBM3", "bf16") == 500.0
    assert mfu_peak_tflops(None, "NVIDIA H100 80GB HBM3", "bf16") == 989.0
    assert mfu_peak_tflops(None, None, "fp32") is None
    assert mfu_peak_tflops(2.0, None, "fp32") == 2.0


def test_a_small_models_mfu_is_logged_to_significant_digits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The step event once rounded MFU to 4 decimals: 0.0 for a small model, which
    reads as "nothing measured". A CPU run against a declared 1,000 TFLOP/s peak
    has an MFU around 1e-7."""
    overrides = [*TINY_LLAMA, "training.steps=2", "training.logInterval=1"]
    overrides += ["training.evalInterval=0", "checkpoint.enabled=false", "metrics.enabled=false"]
    overrides += ["tensorboard.enabled=false", "metrics.peakTflops=1000"]
    config = load_config(overrides=overrides, env={})
    Trainer(config, build_runtime(config, distributed=False)).run()
    steps = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    mfus = [event["mfu"] for event in steps if event["event"] == "step"]
    assert len(mfus) == 2 and all(0 < mfu < 1e-3 for mfu in mfus), mfus
    # Four significant digits, not a value rounded away.
    assert all(len(f"{mfu:.10e}".split("e")[0].rstrip("0").replace(".", "")) <= 4 for mfu in mfus)
