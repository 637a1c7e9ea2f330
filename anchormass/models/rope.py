"""Rotary position embedding with dynamic NTK scaling (docs/method.md §1).

Convention: *rotate-half* (as in GPT-NeoX / LLaMA): dimension i is paired with i + D/2, and
pair i rotates with frequency base^(-2i/D). cos/sin are computed for exactly the positions
being processed and shared by all layers of one forward, so nothing grows with the context.
"""

from __future__ import annotations

import torch


def ntk_base(theta: float, prompt_len: int, original_max_len: int, head_dim: int) -> float:
    """Dynamic-NTK RoPE base for a session whose prompt has `prompt_len` tokens.

    theta while the prompt fits the trained length, else theta * (P / L_orig)^(d / (d - 2)):
    this stretches the lowest frequency so that P positions span the angle range that
    L_orig positions spanned in training.
    """
    if prompt_len <= original_max_len:
        return float(theta)
    return float(theta) * (prompt_len / original_max_len) ** (head_dim / (head_dim - 2))


def rope_cos_sin(positions: torch.Tensor, base: float, head_dim: int,
                 device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [T, head_dim] for absolute `positions` ([T], integer).

    Angles are formed in float64: at 256K positions an fp32 product pos * inv_freq is off by
    up to ~0.02 rad, which would put cached keys and new queries slightly out of phase.
    """
    device = positions.device if device is None else device
    pos = positions.to(device=device, dtype=torch.float64)  # [T]
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float64) / head_dim)  # [D/2]
    ang = pos[:, None] * inv_freq[None, :]  # [T, D/2]
    ang = torch.cat([ang, ang], dim=-1)  # [T, D]: rotate-half layout
    return ang.cos().to(dtype), ang.sin().to(dtype)


def sequence_cos_sin(lengths: list[int], t: int, theta: float, original_max_len: int, head_dim: int,
                     device: torch.device | str,
                     dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin for positions 0 .. t-1 of a right-padded batch whose sequence b has `lengths[b]` real tokens.

    Each sequence gets the base it would get alone, the one a session fixes for a prompt of that
    length (docs/method.md §1), so padding never changes a real token's rotation. One base for the
    whole batch (the common case: equal lengths, or all within the trained length) gives [t, D],
    exactly the unpadded path; otherwise [B, 1, t, D], built from one [t, D] table per distinct base
    (the same numbers a single sequence gets, bit for bit).
    """
    bases = [ntk_base(theta, n, original_max_len, head_dim) for n in lengths]
    positions = positions_for(0, t, device)
    if len(set(bases)) == 1:
        return rope_cos_sin(positions, bases[0], head_dim, device, dtype)
    tables = {b: rope_cos_sin(positions, b, head_dim, device, dtype) for b in dict.fromkeys(bases)}
    cos = torch.stack([tables[b][0] for b in bases])[:, None]  # [B, 1, t, D]
    sin = torch.stack([tables[b][1] for b in bases])[:, None]
    return cos, sin


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, H, T, D] by cos/sin [T, D] (one base for the batch) or [B, 1, T, D] (one per
    sequence); the math runs in fp32, the result keeps x's dtype."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)  # [B, H, T, D]
    return (xf * cos + rotated * sin).to(x.dtype)


def positions_for(start: int, length: int, device: torch.device | str) -> torch.Tensor:
    """Absolute positions start .. start + length - 1 as a LongTensor [length]."""
    return torch.arange(start, start + length, device=device, dtype=torch.long)
