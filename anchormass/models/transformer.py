"""The decoder-only language model shared by both architectures (docs/method.md §1).

embedding -> n_layers x [x + attn(norm(x)); x + ffn(norm(x))] -> final norm -> lm_head.
The attention class is picked by `cfg.arch`; everything else is identical, so the two models
have exactly the same parameters. With `cfg.tie_embeddings` the lm_head's weight IS the
embedding matrix (one parameter, counted once); the state dict still names it under both keys,
so an untied checkpoint's keys and a tied one's are the same.

Init: every weight matrix ~ N(0, init_std); the two residual output projections (attention
o_proj, FFN w2) use init_std / sqrt(2 * n_layers) so the residual stream's variance does not
grow with depth (GPT-2 style). Norm weights start at 1; a learned outlier scorer at 0
(attention_anchormass.py says why).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from anchormass.errors import DataError
from anchormass.models.attention_anchormass import OUTLIER_SCORE, AnchorMassAttention
from anchormass.models.attention_standard import StandardAttention
from anchormass.models.config import ModelConfig
from anchormass.models.layers import RMSNorm, SwiGLU
from anchormass.models.rope import ntk_base, positions_for, rope_cos_sin, sequence_cos_sin

ATTENTION = {"standard": StandardAttention, "anchormass": AnchorMassAttention}


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = ATTENTION[cfg.arch](cfg, layer_idx)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ffn = SwiGLU(cfg.d_model, cfg.ffn_dim)

    def forward(self, x, cos, sin, cache=None):
        x = x + self.attn(self.attn_norm(x), cos, sin, cache)
        return x + self.ffn(self.ffn_norm(x))


class LanguageModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std, resid_std = self.cfg.init_std, self.cfg.init_std / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            if name.endswith(OUTLIER_SCORE):
                nn.init.zeros_(p)
            elif p.dim() == 1:
                nn.init.ones_(p)  # RMSNorm weights
            elif name.endswith(("o_proj.weight", "w2.weight")):
                nn.init.normal_(p, 0.0, resid_std)
            else:
                nn.init.normal_(p, 0.0, std)

    def may_start_without(self) -> list[str]:
        """State-dict keys a weights-only start (init_from) may lack, keeping their init: the learned
        outlier scorers, which a Standard or a rule AnchorMass checkpoint does not have."""
        return [name for name, _ in self.named_parameters() if name.endswith(OUTLIER_SCORE)]

    # ---------------------------------------------------------------- forward
    def rope(self, t: int, device: torch.device, cache=None,
             lengths: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [T, D] (or [B, 1, T, D], one base per sequence) for this forward's positions,
        shared by every layer.

        Parallel path: base from each sequence's own length (`lengths`, default T for all), so a
        right-padded sequence is rotated as it would be alone. With a cache: the session base, fixed
        on the first forward (from that chunk's length unless the caller set it from the prompt).
        """
        cfg = self.cfg
        if cache is None:
            if lengths is not None:
                return sequence_cos_sin(lengths, t, cfg.rope_theta, cfg.original_max_len, cfg.head_dim, device)
            start, base = 0, ntk_base(cfg.rope_theta, t, cfg.original_max_len, cfg.head_dim)
        else:
            if cache.rope_base is None:
                cache.rope_base = ntk_base(cfg.rope_theta, t, cfg.original_max_len, cfg.head_dim)
            start, base = cache.seen_tokens, cache.rope_base
        return rope_cos_sin(positions_for(start, t, device), base, cfg.head_dim, device)

    def forward_hidden(self, input_ids: torch.Tensor, cache=None, lengths=None) -> torch.Tensor:
        """Final-normed hidden states [B, T, d_model] (training takes a chunked loss from these).

        `lengths` ([B] ints, parallel path only): sequence b holds lengths[b] real tokens followed by
        right padding. Attention is causal in both models (a real token never sees a later pad, and
        AnchorMass compresses a block only for queries after it), so the one thing padding could
        change is the dynamic-NTK base; with `lengths` each sequence gets its own (docs/method.md §1)
        and its real positions equal a forward of that sequence alone.
        """
        if input_ids.dim() != 2 or input_ids.dtype not in (torch.long, torch.int32):
            raise DataError(f"input_ids must be an integer tensor [batch, seq], got {tuple(input_ids.shape)} "
                            f"{input_ids.dtype}")
        # A decoded token comes from our own sampler; skipping its check saves a device sync per step.
        decoding = cache is not None and input_ids.shape[1] == 1
        if input_ids.numel() and not decoding and not torch.compiler.is_compiling():
            lo, hi = int(input_ids.min()), int(input_ids.max())
            if lo < 0 or hi >= self.cfg.vocab_size:
                raise DataError(f"token id {hi if hi >= self.cfg.vocab_size else lo} is outside the "
                                f"vocabulary [0, {self.cfg.vocab_size})")
        t = input_ids.shape[1]
        lengths = self._check_lengths(lengths, input_ids.shape, cache)
        x = self.embed(input_ids)  # [B, T, d]
        cos, sin = self.rope(t, input_ids.device, cache, lengths)
        recompute = self.cfg.activation_checkpointing and cache is None and torch.is_grad_enabled()
        for block in self.blocks:
            if recompute:  # keep only each block's input; rebuild its activations in backward
                x = checkpoint(block, x, cos, sin, use_reentrant=False)
            else:
                x = block(x, cos, sin, cache)
        if cache is not None:
            cache.advance(t)
        return self.norm(x)

    @staticmethod
    def _check_lengths(lengths, shape, cache) -> list[int] | None:
        """`lengths` as a list of B ints in [1, T], or None (every sequence fills T)."""
        if lengths is None:
            return None
        if cache is not None:
            raise DataError("per-sequence lengths apply to the cache-free forward only: a cache session has one "
                            "length for all its sequences (pass equal-length, unpadded prompts)")
        values = lengths.tolist() if isinstance(lengths, torch.Tensor) else list(lengths)
        b, t = shape
        if len(values) != b or any(isinstance(n, bool) or int(n) != n or not 1 <= n <= t for n in values):
            raise DataError(f"lengths must be {b} integers in [1, {t}] (real tokens per sequence, right "
                            f"padding after them), got {values}")
        return [int(n) for n in values]

    def forward(self, input_ids: torch.Tensor, cache=None, lengths=None) -> torch.Tensor:
        """LongTensor [B, T] -> logits [B, T, vocab]. With `cache`, the chunk is appended to it.
        `lengths`: see `forward_hidden` (right-padded batches on the parallel path)."""
        return self.lm_head(self.forward_hidden(input_ids, cache, lengths))
