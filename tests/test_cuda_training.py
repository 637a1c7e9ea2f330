"""On CUDA: a bf16-mixed, torch.compile'd training step of both 158M models at 1K and 4K gives a
finite loss, and FlexAttention's block masks are built once per length, not per layer or step.
Skipped without CUDA; scripts/gpu_check.sh runs them (and prints the recorded throughput).
"""

import math
from dataclasses import asdict

import pytest
from test_cuda_kernels import _record

from anchormass.bench.gpu_probes import train_steps
from anchormass.models import load_model_config
from anchormass.models.kernels import flex

pytestmark = pytest.mark.cuda
PEAK_TFLOPS = 989.0  # H100/H200 SXM dense bf16 (configs/trainer/gpu.yaml), for the recorded MFU


@pytest.mark.parametrize("seq, batch", [(1024, 16), (4096, 4)])
@pytest.mark.parametrize("name", ["anchormass_158m", "standard_158m"])
def test_compiled_bf16_training_step(name, seq, batch, monkeypatch):
    builds = []
    real = flex.create_block_mask

    def counting(*args, **kw):
        builds.append(args[3:5])
        return real(*args, **kw)

    monkeypatch.setattr(flex, "create_block_mask", counting)
    monkeypatch.setattr(flex, "_BLOCK_MASKS", type(flex._BLOCK_MASKS)())
    cfg = load_model_config(name)
    m = train_steps(cfg, batch, seq, "cuda", compiled=True, bf16=True, steps=3, peak_tflops=PEAK_TFLOPS)
    _record({"check": "train", "model": cfg.arch, "batch": batch, "length": seq, **asdict(m)})
    assert math.isfinite(m.loss) and m.loss > 0
    # 14 layers x 4 steps: AnchorMass needs one local and one global mask for this length, built once.
    assert len(builds) == (2 if cfg.arch == "anchormass" else 0), builds
