"""AnchorMass made from a Standard model's own weights, without training (docs/method.md §6 k).

The two architectures hold the same tensors, so a Standard checkpoint (an imported SmolLM2, say)
becomes an AnchorMass model by its config alone: which KV groups stay global, the group size G,
and whether outlier slots are kept. Which groups are global is a choice of order (AnchorMass makes
query heads [0, n_local) local): the groups of each layer are reordered so the chosen ones come
last (`permute_kv_groups`, exact for the Standard), by index, or by a measured retrieval score:
the attention the answering query of held-out passkey prompts puts on the needle, per layer and KV
group (the idea of DuoAttention and RazorAttention: heads that retrieve keep the full context).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from anchormass.hf.head_order import layer_orders, permute_kv_groups
from anchormass.models import build_model

SELECTIONS = ("retrieval", "index")


@dataclass(frozen=True)
class Variant:
    """One training-free AnchorMass cell: `share` global KV groups per layer chosen by `selection`,
    stage-1 group size `group_size`, outlier slots on or off; `oracle`: the outliers of every group
    that holds a digit of the needle's key are forced onto that digit (an evaluation-only upper bound
    on what a better selection rule could keep, docs/method.md §6 k)."""

    share: int
    selection: str
    group_size: int
    outliers: bool
    oracle: bool = False

    @property
    def label(self) -> str:
        return (f"am/{self.selection}{self.share}/g{self.group_size}" + ("" if self.outliers else "/no-out")
                + ("/oracle" if self.oracle else ""))

    @property
    def bytes_key(self) -> tuple:
        """Variants with one key store the same bytes (the selection only reorders heads)."""
        return self.share, self.group_size, self.outliers, self.oracle


@torch.no_grad()
def retrieval_scores(model, prompts: list[list[int]], spans: list[tuple[int, int]]) -> torch.Tensor:
    """[layer, KV group]: the softmax attention mass the last query of each prompt puts on its
    needle span, averaged over the group's query heads and over prompts. One parallel forward per
    prompt; each layer's post-RoPE q and k are read where the attention kernel receives them."""
    cfg = model.cfg
    seen: dict[int, torch.Tensor] = {}
    originals = {}
    for i, block in enumerate(model.blocks):
        attn = block.attn
        originals[i] = attn.parallel_attention

        def probe(q, k, v, _i=i, _run=attn.parallel_attention):
            seen[_i] = (q[:, :, -1:].float(), k.float())
            return _run(q, k, v)

        attn.parallel_attention = probe
    total = torch.zeros(cfg.n_layers, cfg.kv_heads, dtype=torch.float64)
    try:
        for ids, (lo, hi) in zip(prompts, spans):
            seen.clear()
            model(torch.tensor([ids], dtype=torch.long, device=next(model.parameters()).device))
            for i, (q, k) in seen.items():
                k = k.repeat_interleave(cfg.q_per_kv, dim=1)  # one key per query head
                probs = torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(cfg.head_dim), dim=-1)  # [1, H, 1, T]
                on_needle = probs[0, :, 0, lo:hi].sum(-1)  # [H]
                total[i] += on_needle.view(cfg.kv_heads, cfg.q_per_kv).mean(-1).double().cpu()
    finally:
        for i, block in enumerate(model.blocks):
            block.attn.parallel_attention = originals[i]
    return total / max(1, len(prompts))


def chosen_groups(scores: torch.Tensor, share: int, selection: str) -> list[list[int]]:
    """Per layer, the `share` KV groups that stay global: the highest retrieval scores (ties to the
    lower index), or by index the last `share` groups (the order the model already has)."""
    n_layers, n_kv = scores.shape
    if selection == "index":
        return [list(range(n_kv - share, n_kv))] * n_layers
    order = torch.sort(-scores, dim=1, stable=True).indices
    return [sorted(order[i, :share].tolist()) for i in range(n_layers)]


def build_variant(standard, variant: Variant, groups: list[list[int]]):
    """The AnchorMass model of `variant` on `standard`'s weights, global groups moved last per layer."""
    cfg = standard.cfg
    orders, n_global = layer_orders(groups, cfg.kv_heads, cfg.n_layers)
    am_cfg = cfg.replace(arch="anchormass", name=f"{cfg.name}:{variant.label}",
                         n_local_heads=(cfg.kv_heads - n_global) * cfg.q_per_kv,
                         n_global_heads=n_global * cfg.q_per_kv, group_size=variant.group_size,
                         outliers=variant.outliers)
    model = build_model(am_cfg)
    param = next(standard.parameters())
    model.load_state_dict(permute_kv_groups(standard.state_dict(), cfg, orders))
    return model.to(device=param.device, dtype=param.dtype).eval()
