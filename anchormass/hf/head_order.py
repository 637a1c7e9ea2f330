"""Reorder whole KV groups within each layer, so that chosen groups become AnchorMass's global heads.

AnchorMass makes query heads [0, n_local) local and the rest global (docs/method.md §2), and with
grouped-query attention both are whole KV groups. Which heads of an imported model are global is
therefore a question of order: moving a group's q rows, its k / v rows and its o_proj columns
together leaves a Standard model's function unchanged (attention sums over heads), and puts the
chosen groups last. `global_groups` names them per layer by their index in the source.
"""

from __future__ import annotations

import torch

from anchormass.errors import ConfigError
from anchormass.models.config import ModelConfig


def layer_orders(global_groups, n_kv: int, n_layers: int) -> tuple[list[list[int]], int]:
    """(each layer's new order of KV groups, the number of global groups): the local groups as they
    were, then the global ones as listed. `global_groups`: one list of group indices for every layer,
    or one list per layer, each of the same length (AnchorMass has one n_global_heads)."""
    if not isinstance(global_groups, (list, tuple)) or not global_groups:
        raise ConfigError(f"global_groups must be a non-empty list of KV group indices, got {global_groups!r}")
    per_layer = (list(global_groups) if all(isinstance(g, (list, tuple)) for g in global_groups)
                 else [list(global_groups)] * n_layers)
    if len(per_layer) != n_layers:
        raise ConfigError(f"global_groups has {len(per_layer)} lists, the model {n_layers} layers")
    orders = []
    for layer, chosen in enumerate(per_layer):
        ok = (all(isinstance(g, int) and not isinstance(g, bool) and 0 <= g < n_kv for g in chosen)
              and len(set(chosen)) == len(chosen) and len(chosen) == len(per_layer[0]) and chosen)
        if not ok:
            raise ConfigError(f"global_groups (layer {layer}): {chosen!r} must be {len(per_layer[0]) or 'some'} "
                              f"distinct KV group indices in [0, {n_kv}), as many in every layer")
        orders.append([g for g in range(n_kv) if g not in chosen] + list(chosen))
    return orders, len(per_layer[0])


def permute_kv_groups(state: dict[str, torch.Tensor], cfg: ModelConfig,
                      orders: list[list[int]]) -> dict[str, torch.Tensor]:
    """A copy of our model's `state` with layer i's KV groups in the order `orders[i]`."""
    out = dict(state)
    rows_q, rows_kv = cfg.q_per_kv * cfg.head_dim, cfg.head_dim  # rows per group in q / in k, v
    for i, order in enumerate(orders):
        idx = torch.tensor(order)
        attn = f"blocks.{i}.attn."
        for proj, rows in (("q_proj", rows_q), ("k_proj", rows_kv), ("v_proj", rows_kv)):
            w = state[f"{attn}{proj}.weight"]  # [groups * rows, d]
            out[f"{attn}{proj}.weight"] = w.view(cfg.kv_heads, rows, -1)[idx].reshape_as(w).contiguous()
        o = state[f"{attn}o_proj.weight"]  # [d, groups * rows_q]
        out[f"{attn}o_proj.weight"] = o.view(o.shape[0], cfg.kv_heads, rows_q)[:, idx].reshape_as(o).contiguous()
    return out
