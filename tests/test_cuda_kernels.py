"""On CUDA: compiled FlexAttention vs block-wise SDPA (forward and q/k/v gradients, fp32 and bf16,
lengths on and off the 64-token block, up to 32K), and the parallel == chunked prefill + decode
invariant in fp32 with the CUDA kernels. Skipped without CUDA; scripts/gpu_check.sh runs them.

With ANCHORMASS_GPU_RECORD=<file>, each kernel comparison appends its max differences as one JSON
line, which the acceptance run prints in its table.
"""

import json
import os

import pytest
import torch

from anchormass.bench.gpu_probes import flex_vs_sdpa, within_bound
from anchormass.models import load_model_config

pytestmark = pytest.mark.cuda

LENGTHS = [1000, 4096, 32768]  # 1000 is off the 64-token block grid, 4096 and 32768 on it


def _record(row: dict) -> None:
    path = os.environ.get("ANCHORMASS_GPU_RECORD")
    if path:
        with open(path, "a", encoding="utf-8") as fh:  # one line per test; a partial file is still readable
            fh.write(json.dumps(row) + "\n")


@pytest.fixture(autouse=True)
def _exact_fp32():
    # fp32 comparisons mean fp32: TF32 matmuls would round inputs to 10 bits.
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("t", LENGTHS)
@pytest.mark.parametrize("arch", ["anchormass", "standard"])
def test_flex_matches_block_sdpa(arch, t, dtype):
    cfg = load_model_config(f"{arch}_158m")
    row = flex_vs_sdpa(cfg, arch, t, dtype, "cuda", grads=True, compiled=True)
    _record(row)
    assert within_bound(row), row


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("arch", ["anchormass", "standard"])
def test_flex_matches_block_sdpa_with_gqa(arch, dtype):
    """The 158M shape with 12 query heads over 4 KV heads (groups of 3; 6 + 6 AnchorMass heads)."""
    cfg = load_model_config(f"{arch}_158m").replace(n_kv_heads=4)
    row = flex_vs_sdpa(cfg, arch, 4096, dtype, "cuda", grads=True, compiled=True)
    _record({**row, "arch": f"{arch}_gqa"})
    assert within_bound(row), row


@pytest.mark.parametrize("t, chunk", [(333, 64), (1500, 1024), (3000, 1024)])
@pytest.mark.parametrize("name", ["anchormass_158m", "standard_158m"])
@torch.no_grad()
def test_parallel_equals_incremental_on_cuda(name, t, chunk):
    from test_equivalence import TOL, incremental_logits

    from anchormass.models import build_model

    torch.manual_seed(0)
    m = build_model(name).to("cuda").eval()
    ids = torch.randint(0, m.cfg.vocab_size, (2, t), device="cuda")
    want = m(ids)  # the parallel path: FlexAttention on CUDA for AnchorMass
    got, _ = incremental_logits(m, ids, chunk, (2 * t) // 3)
    diff = (got - want).abs().max().item()
    _record({"check": "parallel_vs_incremental", "model": name, "length": t, "chunk": chunk, "max_diff": diff})
    assert diff <= TOL
