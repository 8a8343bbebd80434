"""MFU's peak comes from the device the run is on, at the run's precision."""

from __future__ import annotations

import pytest

from torchfleet_trainer.metrics import device_peak_tflops, mfu_peak_tflops


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


def test_configured_peak_wins_and_cpu_has_none_without_it() -> None:
    assert mfu_peak_tflops(500.0, "NVIDIA H100 80GB HBM3", "bf16") == 500.0
    assert mfu_peak_tflops(None, "NVIDIA H100 80GB HBM3", "bf16") == 989.0
    assert mfu_peak_tflops(None, None, "fp32") is None
    assert mfu_peak_tflops(2.0, None, "fp32") == 2.0
