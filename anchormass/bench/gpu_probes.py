"""Measurements shared by the CUDA tests and the GPU acceptance run (scripts/gpu_check.sh):
FlexAttention vs block-wise SDPA differences, and one timed training step.

Every function takes the device and a `compiled` switch, so the same code runs at tiny sizes on
CPU (`gpu_check.sh dry_run=true`, eager FlexAttention, forward only) and at full size on CUDA.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from anchormass.models import build_model
from anchormass.models.accounting import estimate_flops_per_token
from anchormass.models.attention_anchormass import AnchorMassAttention
from anchormass.models.config import ModelConfig
from anchormass.models.kernels import flex
from anchormass.training.loss import chunked_cross_entropy
from anchormass.training.optim import build_optimizer

# Stated bounds on max |flex - block_sdpa| (forward and each gradient), relative to the largest
# magnitude of the block_sdpa tensor. fp32: 1e-4, absolute, on O(1) tensors.
# bf16: both kernels round inputs to 8 significant bits and differ in where they round the
# probabilities (flex: before P @ V), so a few bf16 ulps (2^-8 relative each) of the largest entry.
BOUND = {torch.float32: 1e-4, torch.bfloat16: 4 * 2.0**-8}


def _kernels(cfg: ModelConfig, arch: str, compiled: bool):
    """(flex, block_sdpa) as functions q, k, v -> out for one model's attention (all heads; k, v
    over the KV heads, shared by query groups under grouped-query attention)."""
    gqa = cfg.q_per_kv > 1
    if arch == "standard":
        def causal(b, h, q_idx, kv_idx):
            return kv_idx <= q_idx

        def flex_fn(q, k, v):
            t = q.shape[2]
            mask = create_block_mask(causal, None, None, t, t, device=str(q.device), _compile=compiled)
            return (flex.compiled_flex if compiled else flex_attention)(q, k, v, block_mask=mask, enable_gqa=gqa)

        return flex_fn, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    attn = AnchorMassAttention(cfg.replace(attn_impl="block_sdpa"), layer_idx=0)
    flex_attn = AnchorMassAttention(cfg.replace(attn_impl="flex"), layer_idx=0)
    if not compiled:
        flex_attn.kernel = flex.FlexKernel(cfg, compiled=False)
    return flex_attn.parallel_attention, attn.parallel_attention


def flex_vs_sdpa(cfg: ModelConfig, arch: str, t: int, dtype: torch.dtype, device, grads: bool = True,
                 compiled: bool = True, batch: int = 1, seed: int = 0) -> dict:
    """Max |flex - block_sdpa| of the output and (grads=True) of dq, dk, dv, each also relative to
    the largest |block_sdpa| entry. Inputs are N(0, 1); the upstream gradient is N(0, 1)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    shape, kv_shape = (batch, cfg.n_heads, t, cfg.head_dim), (batch, cfg.kv_heads, t, cfg.head_dim)
    base = [torch.randn(s, generator=g).to(device, dtype) for s in (shape, kv_shape, kv_shape)]
    up = torch.randn(shape, generator=g).to(device, dtype)
    results = []
    for fn in _kernels(cfg, arch, compiled):
        q, k, v = (x.clone().requires_grad_(grads) for x in base)
        with torch.set_grad_enabled(grads):
            out = fn(q, k, v)
            if grads:
                out.backward(up)
        results.append({"out": out.detach(), **({"dq": q.grad, "dk": k.grad, "dv": v.grad} if grads else {})})
        del q, k, v, out
    flex_res, sdpa_res = results
    row = {"arch": arch, "length": t, "dtype": str(dtype).removeprefix("torch."), "bound": BOUND[dtype]}
    for key, want in sdpa_res.items():
        diff = (flex_res[key].float() - want.float()).abs().max().item()
        row[key] = diff
        row[key + "_rel"] = diff / max(want.float().abs().max().item(), 1e-30)
    return row


def within_bound(row: dict) -> bool:
    """fp32: absolute max difference; bf16: relative to the largest reference entry."""
    suffix = "" if row["dtype"] == "float32" else "_rel"
    return all(row[k + suffix] <= row["bound"] for k in ("out", "dq", "dk", "dv") if k in row)


@dataclass
class TrainMeasure:
    loss: float
    step_s: float  # median seconds per optimizer step after warm-up
    tokens_per_s: float
    mfu: float | None  # None without a peak
    peak_bytes: int | None  # CUDA only
    compile_s: float  # the first (compiling) step


def train_steps(cfg: ModelConfig, batch: int, seq: int, device, *, compiled: bool = True, bf16: bool = True,
                steps: int = 3, peak_tflops: float | None = None, seed: int = 0) -> TrainMeasure:
    """Optimizer steps of a fresh model on random tokens: forward, the training loss (chunked CE, as
    in training), backward, AdamW. bf16: autocast over fp32 weights (Lightning's bf16-mixed)."""
    device = torch.device(device)
    torch.manual_seed(seed)
    model = build_model(cfg).to(device).train()
    opt, _ = build_optimizer(model, lr=1e-4, weight_decay=0.1, warmup_steps=1, total_steps=10)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=device)

    def loss_of(x, y):
        return chunked_cross_entropy(model.forward_hidden(x), model.lm_head, y)[0]

    fn = torch.compile(loss_of) if compiled else loss_of

    def step() -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = fn(ids[:, :-1], ids[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    def timed() -> tuple[float, torch.Tensor]:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        loss = step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0, loss

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    compile_s, loss = timed()
    times = []
    for _ in range(max(1, steps)):
        dt, loss = timed()
        times.append(dt)
    step_s = sorted(times)[len(times) // 2]
    tps = batch * seq / step_s
    mfu = None if not peak_tflops else estimate_flops_per_token(cfg, seq) * tps / (peak_tflops * 1e12)
    peak = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
    return TrainMeasure(float(loss), step_s, tps, mfu, peak, compile_s)
