"""Peak dense 16-bit (bf16 / fp16) tensor TFLOP/s per device, for MFU with `trainer.peak_tflops: auto`.

Only GPUs whose figure the vendor publishes (dense, without sparsity); any other device, and a run
that is not in 16-bit precision, has no known peak and logs no MFU (set trainer.peak_tflops=<n>).
"""

from __future__ import annotations

import re

# Checked in order against torch.cuda.get_device_name(): the more specific name first.
PEAK_16BIT_TFLOPS = (
    (r"H100 PCIe", 756.0),
    (r"H100 NVL", 835.0),
    (r"\bG?H[12]00\b", 989.0),  # H100 SXM, H200, GH200
    (r"A100", 312.0),
    (r"L40S", 362.0),
    (r"\bL4\b", 121.0),
)


def known_peak_tflops(device_name: str) -> float | None:
    return next((peak for pattern, peak in PEAK_16BIT_TFLOPS if re.search(pattern, device_name)), None)


def resolve_peak_tflops(setting: float | str | None, trainer) -> float | None:
    """`auto`: the peak of the device this run trains on (None when unknown); a number as given."""
    if setting != "auto":
        return float(setting) if setting else None
    root = trainer.strategy.root_device
    if root.type != "cuda" or "16" not in str(trainer.precision):
        return None
    import torch

    return known_peak_tflops(torch.cuda.get_device_name(root))
