"""SnapKV hit rate (docs/method.md §3 / 6 f): does the observation window's vote predict where generated
tokens will look?

For each prompt the Standard model runs with a full cache and a probe policy: at the end of the
prefill the probe computes SnapKV's vote (same window / pooling / budget as `SnapKV`) without
compressing anything; then for every greedily generated token, per layer and head, the prefix
positions (the prompt minus the observation window) whose attention exceeds `threshold` (0.05)
are "important", and hit rate = important positions the vote selected / important positions.
With grouped-query attention the vote selects per KV head, and a query head is scored against
its KV head's selection (rows of the table stay query heads).
Counts are summed over generated tokens and prompts (a micro-average per layer and head).
Prompts of exact lengths: passkey haystacks, windows of a token file at seeded offsets, or seeded
random ids (random-init demos).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from anchormass.cache import new_cache
from anchormass.cache.kv_policies import SnapKV, attention_probs
from anchormass.cache.kv_policies.snapkv import QUERY_STATE
from anchormass.errors import ConfigError
from anchormass.eval.items import Haystack, make_trial
from anchormass.eval.report import annotated_heatmap, markdown, pct, plt, save_figure
from anchormass.eval.scoring import needs_standard, progress
from anchormass.eval.suite import EvalContext, Suite
from anchormass.inference import generate
from anchormass.models.attention_base import repeat_kv


@dataclass
class HitRateProbe(SnapKV):
    """A SnapKV that only watches: it votes at `end_prefill` but keeps every token, then counts,
    for each later query, the important prefix positions and those the vote had selected."""

    name: ClassVar[str] = "hitrate_probe"
    threshold: float = 0.05

    def end_prefill(self, layer) -> None:
        q_obs = layer.state.pop(QUERY_STATE, None)
        length = layer.length
        prefix = length - self.window
        if q_obs is None or prefix <= 0:
            return  # nothing before the window: no prefix to hit
        selected = torch.zeros(layer.batch_size, layer.n_kv_heads, prefix, dtype=torch.bool, device=layer.k.device)
        if length <= self.budget:
            selected[:] = True  # SnapKV would keep the whole prompt
        else:
            chosen = self.select(q_obs, layer.keys())[..., : self.budget - self.window]  # prefix part
            selected.scatter_(2, chosen, True)
        # [B, H, prefix]: each query head sees its KV head's selection
        layer.state["hit_selected"] = repeat_kv(selected, q_obs.shape[1] // layer.n_kv_heads)
        layer.state["hit_hits"] = torch.zeros(layer.batch_size, q_obs.shape[1], dtype=torch.float64,
                                              device=layer.k.device)
        layer.state["hit_important"] = torch.zeros_like(layer.state["hit_hits"])

    def on_attend(self, layer, q: torch.Tensor) -> None:
        if layer.prefilling:
            return super().on_attend(layer, q)
        selected = layer.state.get("hit_selected")
        if selected is None:
            return
        prefix = selected.shape[-1]
        first = layer.length - q.shape[2]
        probs = attention_probs(q, layer.keys(), first_query_slot=first)[..., :prefix]  # [B, H, T, prefix]
        important = probs > self.threshold
        layer.state["hit_hits"] += (important & selected.unsqueeze(2)).sum(dim=(2, 3)).double()
        layer.state["hit_important"] += important.sum(dim=(2, 3)).double()


def hit_counts(model, ids: torch.Tensor, probe: HitRateProbe, new_tokens: int,
               chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """One batch of prompts [B, P]: (hits, important), each [layers, heads] summed over the batch."""
    cache = new_cache(model, batch_size=ids.shape[0], policy=probe)
    logits = generate.prefill(model, ids, cache, chunk).float()
    generate.decode(model, cache, logits, new_tokens)
    if "hit_hits" not in cache.layers[0].state:
        raise ConfigError(f"hitrate: prompts of {ids.shape[1]} tokens leave no prefix before the "
                          f"{probe.window}-token observation window")
    hits = np.stack([lay.state["hit_hits"].sum(0).cpu().numpy() for lay in cache.layers])
    important = np.stack([lay.state["hit_important"].sum(0).cpu().numpy() for lay in cache.layers])
    return hits, important


@dataclass
class PromptSource:
    """Prompts of exact lengths: passkey haystacks (needs a tokenizer), windows of a token file
    at seeded offsets, or seeded random ids (random-init demos)."""

    kind: str  # "passkey" | "tokens" | "random"
    haystack: object | None = None
    tokens: object | None = None  # np.memmap for kind="tokens"
    where: str = ""

    def prompt(self, length: int, seed: int, vocab: int) -> torch.Tensor:
        if self.kind == "passkey":
            depth = (0.1, 0.3, 0.5, 0.7, 0.9)[seed % 5]
            return torch.tensor(self.haystack.build(make_trial(length, depth, seed)), dtype=torch.long)
        gen = torch.Generator().manual_seed(seed)
        if self.kind == "tokens":
            if length > len(self.tokens):
                raise ConfigError(f"a {length}-token prompt does not fit in {self.where} ({len(self.tokens)} tokens)")
            start = int(torch.randint(0, len(self.tokens) - length + 1, (1,), generator=gen))
            return torch.as_tensor(np.asarray(self.tokens[start:start + length], dtype=np.int64))
        return torch.randint(0, vocab, (length,), generator=gen)

    def describe(self) -> str:
        return {"passkey": "passkey haystacks (depths 10-90%)", "random": "random token ids (seeded)",
                "tokens": f"windows of {self.where} at seeded offsets"}[self.kind]


def prompt_source(kind: str | None, ctx: EvalContext, suite: str, data: str | None = None) -> PromptSource:
    """kind None: passkey when a tokenizer is loaded, else random ids. kind "tokens" reads `data`
    (a .bin token file) or `<data_dir>/val.bin`."""
    kind = kind or ("passkey" if ctx.tokenizer is not None else "random")
    if kind == "random":
        return PromptSource("random")
    if kind == "passkey":
        return PromptSource("passkey", Haystack(ctx.need_tokenizer(suite)))
    if kind == "tokens":
        from anchormass.data.token_file import open_tokens

        if data is None and ctx.data_dir is None:
            raise ConfigError(f"{suite}: prompts=tokens needs eval.{suite}.data=<val.bin> or data_dir=<folder>")
        path = Path(str(data)).expanduser() if data else Path(ctx.data_dir) / "val.bin"
        tokens = open_tokens(path)
        if ctx.record_data is not None:
            ctx.record_data(suite, path)
        return PromptSource("tokens", tokens=tokens, where=path.name)
    raise ConfigError(f"{suite}: prompts must be 'passkey', 'tokens' or 'random', got {kind!r}")


class HitRateSuite(Suite):
    name = "hitrate"
    in_all = True

    def applies(self, ctx: EvalContext) -> str | None:
        return needs_standard(ctx, "the SnapKV hit rate is measured")

    def check(self, ctx: EvalContext) -> None:
        probe = HitRateProbe(window=int(self.opt("window", 32)), kernel=int(self.opt("kernel", 7)),
                             pooling=str(self.opt("pooling", "max")), threshold=float(self.opt("threshold", 0.05)))
        self.lengths = [int(x) for x in self.opt("lengths", [2048])]
        self.n_prompts = int(self.opt("n_prompts", 3))
        self.new_tokens = int(self.opt("new_tokens", 16))
        if self.n_prompts < 1 or self.new_tokens < 1:
            raise ConfigError("hitrate: n_prompts and new_tokens must be >= 1")
        # A budget near the prompt length keeps most of the prefix whatever the vote says (at 256
        # of 512 a random pick already hits ~47%): by default it is a small share of each prompt,
        # as in SnapKV's own setting, so the vote has to choose.
        fraction = float(self.opt("budget_fraction", 0.1))
        if not 0 < fraction < 1:
            raise ConfigError(f"hitrate: budget_fraction must be in (0, 1), got {fraction}")
        self.probes = {}
        for length in self.lengths:
            if length <= probe.window:
                raise ConfigError(f"hitrate: length {length} must exceed the observation window ({probe.window})")
            ctx.check_length(self.name, length)
            budget = self.opt("budget") or max(probe.window + 1, round(fraction * length))
            self.probes[length] = probe.bind(int(budget))
        self.source = prompt_source(self.opt("prompts"), ctx, self.name, self.opt("data"))

    def chance(self, length: int) -> float:
        """Expected hit rate of a selection of the same size drawn at random from the prefix."""
        probe = self.probes[length]
        return min(1.0, (probe.budget - probe.window) / (length - probe.window))

    def run(self, ctx: EvalContext) -> dict:
        per_model = {}
        items = []
        for m in ctx.models:
            if m.arch != "standard":
                continue
            hits = important = expected = 0
            cells = [(length, i) for length in self.lengths for i in range(self.n_prompts)]
            for length, i in progress(cells, ctx.progress, f"hitrate {m.label}"):
                ids = self.source.prompt(length, seed=ctx.seed + i, vocab=m.config.vocab_size).to(ctx.device)
                h, n = hit_counts(m.model, ids[None], self.probes[length], self.new_tokens, m.config.prefill_chunk)
                hits, important = hits + h, important + n
                expected = expected + n * self.chance(length)  # a random vote's hits on the same positions
                items.append({"model": m.label, "length": length, "prompt": i, "hits": h.tolist(),
                              "important": n.tolist()})
            rate = np.where(important > 0, hits / np.maximum(important, 1), np.nan)  # [layers, heads]
            chance = np.where(important > 0, expected / np.maximum(important, 1), np.nan)
            # Pooled over layers and heads, per prompt length (how the vote holds up as the prefix grows).
            by_length = {}
            for length in self.lengths:
                cell = [it for it in items if it["model"] == m.label and it["length"] == length]
                h = sum(np.sum(it["hits"]) for it in cell)
                n = sum(np.sum(it["important"]) for it in cell)
                by_length[length] = {"hits": int(h), "important": int(n), "chance": self.chance(length)}
            per_model[m.label] = {"hit_rate": _nullable(rate), "chance": _nullable(chance),
                                  "hits": hits.tolist(), "important": important.tolist(), "by_length": by_length}
        summary = {}
        for lab, r in per_model.items():
            summary.update({f"{lab}/{k}": v for k, v in overview(np.array(r["hit_rate"], dtype=float)).items()
                            if v is not None})
            chance = _mean(np.array(r["chance"], dtype=float))
            if not np.isnan(chance):
                summary[f"{lab}/chance_mean"] = chance
        first = self.probes[self.lengths[0]]
        return {"settings": {**{k: getattr(first, k) for k in ("window", "kernel", "pooling", "threshold")},
                             "budget": {n: p.budget for n, p in self.probes.items()},
                             "lengths": self.lengths, "n_prompts": self.n_prompts, "new_tokens": self.new_tokens,
                             "prompts": self.source.describe(),
                             # What a vote picking prefix positions at random would score, per length.
                             "chance": {n: self.chance(n) for n in self.lengths}},
                "models": per_model, "summary": summary, "items": items}

    def report(self, result: dict) -> str:
        s = result["settings"]
        budgets = ", ".join(f"{int(b)} of {int(n):,}" for n, b in s["budget"].items())
        out = ["## SnapKV hit rate\n",
               f"Share of prefix positions with attention > {s['threshold']} (generated tokens) that the "
               f"observation-window vote selected: window {s['window']}, {s['pooling']}-pool kernel {s['kernel']}, "
               f"budget per head {budgets} tokens; prompts: {s['prompts']}, lengths {s['lengths']}, "
               f"{s['n_prompts']} per length, {s['new_tokens']} greedy tokens each. Cells: hit rate "
               f"(selected / important positions, summed over generated tokens and prompts), then in brackets "
               f"the random baseline: what a selection of the same size drawn at random would hit on the "
               f"same important positions ({_chance(s)} per length).\n"]
        for lab, r in result["models"].items():
            rate, chance = np.array(r["hit_rate"], dtype=float), np.array(r["chance"], dtype=float)
            head = ["layer"] + [f"head {h}" for h in range(rate.shape[1])] + ["mean"]
            hits, important = np.array(r["hits"]), np.array(r["important"])
            rows = [[str(layer)] + [f"{pct(int(h), int(n))} ({_pct(c)})"
                                    for h, n, c in zip(hits[layer], important[layer], chance[layer])]
                    + [f"{_pct(_mean(row))} ({_pct(_mean(chance[layer]))})"] for layer, row in enumerate(rate)]
            o = overview(rate)
            tail = ("no generated token put more than the threshold on any prefix position (attention too flat)"
                    if o["hit_rate_mean"] is None else
                    f"mean {_pct(o['hit_rate_mean'])} (random {_pct(_mean(chance))}), min {_pct(o['hit_rate_min'])}, "
                    f"heads above 80%: {o['heads_over_80pct']:.0%} of the heads with any important position")
            per_len = "; ".join(f"{int(n):,} tokens: {pct(c['hits'], c['important'])} "
                                f"(random {_pct(c['chance'])})"
                                for n, c in r.get("by_length", {}).items())
            out.append(f"### {lab}\n\n{markdown(head, rows)}\n{tail}. Pooled over layers and heads, "
                       f"by prompt length: {per_len}.\n")
        return "\n".join(out)

    def plots(self, result: dict, out_dir: Path) -> list[str]:
        return [heatmap(lab, np.array(r["hit_rate"], dtype=float), out_dir / f"hitrate_{lab}.png")
                for lab, r in result["models"].items()]


def _nullable(x: np.ndarray) -> list[list[float | None]]:
    return [[None if np.isnan(v) else float(v) for v in row] for row in x]


def _pct(x: float) -> str:
    return "-" if x is None or np.isnan(x) else f"{100 * x:.1f}%"


def _chance(settings: dict) -> str:
    return ", ".join(f"{_pct(c)} at {int(n):,}" for n, c in settings["chance"].items())


def _mean(x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return float(x.mean()) if x.size else float("nan")


def overview(rate: np.ndarray) -> dict:
    """Mean / min hit rate and share of heads above 80%, over heads that had any important position
    (NaN cells: no generated token put attention > threshold on the prefix). None when there are none."""
    ok = rate[~np.isnan(rate)]
    if not ok.size:
        return {"hit_rate_mean": None, "hit_rate_min": None, "heads_over_80pct": None, "heads_measured": 0}
    return {"hit_rate_mean": float(ok.mean()), "hit_rate_min": float(ok.min()),
            "heads_over_80pct": float((ok > 0.8).mean()), "heads_measured": int(ok.size)}


def heatmap(label: str, rate: np.ndarray, path: Path) -> str:
    """Layers (rows) x heads (columns), hit rate in [0, 1]."""
    n_layers, n_heads = rate.shape
    fig, ax = plt.subplots(figsize=(0.6 * n_heads + 2.5, 0.4 * n_layers + 1.8))
    im = annotated_heatmap(ax, rate)
    ax.set_xticks(range(n_heads))
    ax.set_yticks(range(n_layers))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(f"SnapKV hit rate: {label}")
    fig.colorbar(im, ax=ax, shrink=0.8)
    return save_figure(fig, path)
