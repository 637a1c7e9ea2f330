"""Stage 1 (docs/method.md §2.3): compress complete blocks of global-head keys/values into slots.

Shared by the parallel training path and the inference cache, so both make identical
decisions. Everything is vectorised over batch, blocks and groups.

Each group of G consecutive tokens becomes two slots, background first:
  background: value = mass-weighted mean of the background values, key = the *anchor* key
              (the background token with the largest position; averaging RoPE-rotated keys
              would mix phases), mass = sum of background masses;
  outlier:    the single most off-direction token (k, v, mass) if the group emits one,
              else zeros with mass 0 (an absent slot).
The outlier decision is one per (sequence, group), shared by all global heads of the layer.
"Heads" here are the global KV heads: k and v arrive as the attention projects them, so with
grouped-query attention stage 1 compresses (and averages its rule over) n_global_heads / q_per_kv
heads, and the slots serve each KV head's group of query heads.

Conventions this implementation fixes (docs/method.md §2.3 states them too):
  * cos(v, v_bar) of a zero vector (either side) is 0, so an all-zero value never yields NaN.
  * rel[i] = mean_h ( |v[h,i]| / mean_j |v[h,j]| ), with 0/0 := 0 (an all-zero group).
  * argmin ties resolve to the lowest index (torch.argmin returns the first minimum).
  * a group of a single token (G = 1) never emits: an outlier needs a background to differ from.
  * decisions and the anchor choice are discrete and carry no gradient; gradients flow
    through the selected keys/values and the averaged values (and mean keys).

outlier_scorer="learned" (issue 45) replaces the rule's choice: a layer's scorer w [Hg, D]
scores token i as sum_h <w_h, v[h,i]> (values: a key carries its position's RoPE rotation, a
value does not), every group emits its highest-scoring token (lowest index on ties), and the
choice is straight-through: forward the hard one-hot, backward the group's softmax, so the
scorer learns through the background weights and the outlier's k, v and mass. The forward
values are exactly the hard choice's, so the parallel path, the cache and no-grad inference agree.
"""

from __future__ import annotations

import torch

from anchormass.models.config import ModelConfig


def _grouped(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """[B, H, N, D] -> [B, H, N // G, G, D]."""
    b, h, n, d = x.shape
    return x.reshape(b, h, n // group_size, group_size, d)


def outlier_scores(v: torch.Tensor, scorer: torch.Tensor, group_size: int) -> torch.Tensor:
    """The learned scorer's score of every token: v [B, Hg, N, D], scorer [Hg, D] -> [B, N//G, G] fp32."""
    return (_grouped(v, group_size).float() * scorer.float()[None, :, None, None, :]).sum(dim=-1).sum(dim=1)


def _check_scorer(cfg: ModelConfig, scorer: torch.Tensor | None) -> None:
    """A scorer exactly when the config asks for one: a forgotten scorer would silently fall back to the rule."""
    if cfg.outlier_scorer == "learned" and scorer is None:
        raise ValueError("outlier_scorer='learned' needs the layer's scorer (AnchorMassAttention.outlier_score)")
    if cfg.outlier_scorer == "rule" and scorer is not None:
        raise ValueError("outlier_scorer='rule' takes no scorer")


@torch.no_grad()
def group_decisions(v: torch.Tensor, cfg: ModelConfig, mass: torch.Tensor | None = None,
                    forced: torch.Tensor | None = None,
                    scorer: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Outlier decision per group.

    v: [B, Hg, N, D] values (N a multiple of G); mass: [B, N] token masses (default all 1).
    forced: [B, N] bool or None, an evaluation-only oracle (docs/method.md §6 k): a group holding a
    forced token emits its first forced token as the outlier, whatever the rule (or the learned
    scorer) says. scorer: [Hg, D], the layer's learned scorer (exactly when outlier_scorer="learned").
    Returns (outlier_idx [B, N//G] long, index inside its group; emit [B, N//G] bool).
    """
    _check_scorer(cfg, scorer)
    if scorer is None:
        idx, emit = _rule_decisions(v, cfg, mass)
    else:  # the scorer decides which token, not whether: every group emits
        idx = outlier_scores(v, scorer, cfg.group_size).argmax(dim=-1)  # [B, ng]: first maximum on ties
        emit = torch.ones_like(idx, dtype=torch.bool)
    g, b, ng = cfg.group_size, idx.shape[0], idx.shape[1]
    if not cfg.outliers or g < 2:
        emit = torch.zeros_like(emit)
    if forced is not None and g >= 2:
        fg = forced.reshape(b, ng, g)
        has = fg.any(dim=-1)
        idx = torch.where(has, fg.int().argmax(dim=-1), idx)  # argmax: the first forced token
        emit = emit | has
    return idx, emit


def _rule_decisions(v: torch.Tensor, cfg: ModelConfig, mass: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """docs/method.md §2.3's rule: (the token least like the group's mean value, whether it passes the thresholds)."""
    g = cfg.group_size
    vg = _grouped(v, g).float()  # [B, Hg, ng, G, D]
    b, _, ng, _, _ = vg.shape
    m = (torch.ones(b, ng, g, device=v.device) if mass is None
         else mass.float().reshape(b, ng, g))  # [B, ng, G]
    m_h = m[:, None, :, :, None]  # [B, 1, ng, G, 1]
    total = m_h.sum(dim=-2, keepdim=True)  # [B, 1, ng, 1, 1]
    v_bar = (vg * m_h).sum(dim=-2, keepdim=True) / total.clamp_min(1e-30)  # [B, Hg, ng, 1, D]

    norms = vg.norm(dim=-1)  # [B, Hg, ng, G]
    bar_norm = v_bar.norm(dim=-1)  # [B, Hg, ng, 1]
    dots = (vg * v_bar).sum(dim=-1)  # [B, Hg, ng, G]
    denom = norms * bar_norm
    cos = torch.where(denom > 0, dots / denom.clamp_min(1e-30), torch.zeros_like(dots))
    sim = cos.mean(dim=1)  # [B, ng, G]: mean over global heads

    mean_norm = norms.mean(dim=-1, keepdim=True)  # [B, Hg, ng, 1]
    rel_h = torch.where(mean_norm > 0, norms / mean_norm.clamp_min(1e-30), torch.zeros_like(norms))
    rel = rel_h.mean(dim=1)  # [B, ng, G]

    idx = sim.argmin(dim=-1)  # [B, ng]: first minimum on ties
    sim_min = sim.gather(-1, idx[..., None]).squeeze(-1)  # [B, ng]
    emit = (sim_min < cfg.outlier_cos) | (rel.max(dim=-1).values > cfg.outlier_rel_norm)
    return idx, emit


def anchor_index(outlier_idx: torch.Tensor, emit: torch.Tensor, group_size: int) -> torch.Tensor:
    """Where each group's background key comes from (background_key=anchor), as an index inside the
    group: the background token with the largest position, i.e. G-1 unless the outlier sits there.
    outlier_idx, emit: group_decisions' [B, ng]; returns [B, ng] long."""
    return torch.where(emit & (outlier_idx == group_size - 1), group_size - 2, group_size - 1)


def compress_blocks(k: torch.Tensor, v: torch.Tensor, cfg: ModelConfig, mass: torch.Tensor | None = None,
                    forced: torch.Tensor | None = None,
                    scorer: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Compress complete blocks into slots.

    k, v: [B, Hg, nblocks*C, D] global-head keys (post-RoPE) / values; mass: [B, nblocks*C]
    token masses (default 1); forced: the oracle of `group_decisions` (None: the rule or scorer);
    scorer: [Hg, D], the layer's learned scorer when outlier_scorer="learned" (else None).
    Returns slot_k, slot_v [B, Hg, nblocks*2*(C//G), D] and slot_mass [B, nblocks*2*(C//G)] (fp32);
    per group background slot first, then outlier.
    """
    g = cfg.group_size
    b, h, n, d = k.shape
    if n % cfg.block_size:
        raise ValueError(f"compress_blocks: {n} tokens is not a whole number of blocks of {cfg.block_size}")
    ng = n // g
    idx, emit = group_decisions(v, cfg, mass, forced, scorer)  # [B, ng], [B, ng]
    m = (torch.ones(b, ng, g, device=k.device) if mass is None
         else mass.float().reshape(b, ng, g))  # [B, ng, G]

    pos = torch.arange(g, device=k.device)  # [G]
    is_out = emit[..., None] & (pos == idx[..., None])  # [B, ng, G]
    choice = is_out.float()  # [B, ng, G]: one-hot where a group emits, else zeros
    if scorer is not None and torch.is_grad_enabled():
        choice = _straight_through(choice, outlier_scores(v, scorer, g))
    bg_w = m * (1.0 - choice)  # [B, ng, G]: background masses (0 for the outlier)
    bg_mass = bg_w.sum(dim=-1)  # [B, ng]
    out_mass = (m * choice).sum(dim=-1)  # [B, ng]: n[i*] or 0

    kg, vg = _grouped(k, g), _grouped(v, g)  # [B, Hg, ng, G, D]
    # Means in fp32 (weights like 1/7 are inexact in bf16), stored back in the input dtype.
    w = (bg_w / bg_mass.clamp_min(1e-30)[..., None])[:, None, :, :, None]  # [B, 1, ng, G, 1] fp32
    bg_v = (vg.float() * w).sum(dim=-2).to(v.dtype)  # [B, Hg, ng, D]
    if cfg.background_key == "mean":
        bg_k = (kg.float() * w).sum(dim=-2).to(k.dtype)
    else:
        bg_k = _pick(kg, anchor_index(idx, emit, g))

    if scorer is None:
        keep = emit[:, None, :, None].to(k.dtype)  # [B, 1, ng, 1]: zero the absent outlier slots
        out_k = _pick(kg, idx) * keep
        out_v = _pick(vg, idx) * keep.to(v.dtype)
    else:  # sum_i choice_i * x_i: x_{i*} exactly (the other terms are exact zeros), with the scorer's gradient
        c = choice[:, None, :, :, None]  # [B, 1, ng, G, 1]
        out_k = (kg * c.to(k.dtype)).sum(dim=-2)
        out_v = (vg * c.to(v.dtype)).sum(dim=-2)

    slot_k = torch.stack([bg_k, out_k], dim=3).reshape(b, h, 2 * ng, d)  # [B, Hg, 2ng, D]
    slot_v = torch.stack([bg_v, out_v], dim=3).reshape(b, h, 2 * ng, d)
    slot_mass = torch.stack([bg_mass, out_mass], dim=-1).reshape(b, 2 * ng)  # [B, 2ng]
    return slot_k, slot_v, slot_mass


def _straight_through(hard: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Forward: `hard` exactly (soft - soft is an exact zero); backward: the gradient of the group's
    softmax over `scores` (temperature 1). hard, scores: [B, ng, G]."""
    soft = scores.softmax(dim=-1)
    return hard + (soft - soft.detach())


def _pick(xg: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """xg [B, H, ng, G, D], index [B, ng] -> xg[b, h, j, index[b, j]] as [B, H, ng, D]."""
    b, h, ng, _, d = xg.shape
    gather_idx = index[:, None, :, None, None].expand(b, h, ng, 1, d)
    return xg.gather(3, gather_idx).squeeze(3)
