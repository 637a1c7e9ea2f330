"""(b) Long-sequence perplexity with fixed anchors and paired statistics (docs/method.md §6 b).

Anchors a_i are drawn once, deterministically: the usable range [max(contexts), N - target_len]
of the token file is cut into n equal strata and one position is drawn from each with
`anchor_seed`. They are saved in results.json (and can be pinned with `anchors: [...]`).

Input for context C: tok[a - C : a + target_len]. Target choice (documented; the method leaves it open):
no bos is prepended; the scored targets are the last target_len - 1 tokens tok[a+1 .. a+target_len-1],
each predicted from everything before it. At C = 0 the first window token tok[a] is context only,
so exactly the same 1,023 targets are scored at every C.

mode=parallel runs the model's parallel forward; mode=cached feeds the input through the
inference cache in chunks (the same path as generation; stage 2 may fire for long inputs): the
context is the prompt and ends the prefill, so a Standard KV policy (SnapKV compresses there)
acts as it would before generation.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from anchormass.eval.items import ppl_items
from anchormass.eval.report import fmt_p, markdown, paired_nll_by_length, plt, save_figure
from anchormass.eval.scoring import (
    OOM,
    anchor_nll,
    free_memory,
    is_oom,
    progress,
    session_logprobs,
    target_logprobs,
)
from anchormass.eval.suite import EvalContext, Suite


def cached_target_logprobs(model, ids: torch.Tensor, start: int, chunk: int, policy=None, budget=None) -> torch.Tensor:
    """As target_logprobs, but through the inference cache: the context ids[:, :start+1] is the
    prompt (prefilled in `chunk`s, then the prefill ends, so a policy such as SnapKV compresses
    it), the targets are fed `chunk` tokens at a time. RoPE base from the whole input length."""
    return session_logprobs(model, ids, start, chunk, chunk, policy, budget)[0]


class PplSuite(Suite):
    name = "ppl"
    in_all = True

    def applies(self, ctx: EvalContext) -> str | None:
        if not self.opt("data") and ctx.data_dir is None:
            return "no token file: pass eval.ppl.data=<val.bin> or data_dir=<folder with val.bin>"
        return None

    def check(self, ctx: EvalContext) -> None:
        items = ppl_items(self.cfg, ctx)
        self.contexts, self.target_len, self.tokens, self.anchors = (items.contexts, items.target_len, items.tokens,
                                                                     items.anchors)

    def _score(self, model, ids: torch.Tensor, c: int) -> torch.Tensor:
        if self.opt("mode", "parallel") == "cached":
            return cached_target_logprobs(model, ids, c, int(self.opt("chunk", 1024)),
                                          self.opt("policy"), self.opt("budget"))
        return target_logprobs(model, ids, c)

    def run(self, ctx: EvalContext) -> dict:
        bs = int(self.opt("batch_size", 1))
        nll: dict[str, dict[int, list[float] | str]] = {m.label: {} for m in ctx.models}
        steps = [(m, c) for m in ctx.models for c in self.contexts]
        for m, c in progress(steps, ctx.progress, "ppl"):
            try:
                nll[m.label][c] = anchor_nll(lambda ids, start, model=m.model: self._score(model, ids, start),
                                             self.tokens, self.anchors, c, self.target_len, bs, ctx.device)
            except Exception as err:  # OOM at a length is a result, not a crash
                if not is_oom(err):
                    raise
                nll[m.label][c] = OOM
                free_memory(ctx.device)
        return self._summarise(ctx, nll)

    def _summarise(self, ctx: EvalContext, nll: dict) -> dict:
        labels = [m.label for m in ctx.models]
        rows = []
        for c in self.contexts:
            row = {"context": c, "length": c + self.target_len}
            for lab in labels:
                v = nll[lab][c]
                row[lab] = OOM if v == OOM else {"loss": float(np.mean(v)), "ppl": math.exp(float(np.mean(v)))}
            rows.append(row)
        out = {"anchors": self.anchors, "targets_per_anchor": self.target_len - 1,
               "mode": self.opt("mode", "parallel"), "labels": labels, "rows": rows,
               "items": [{"model": lab, "context": c, "anchor": a,
                          "nll": (OOM if nll[lab][c] == OOM else nll[lab][c][j]),
                          "ppl": (OOM if nll[lab][c] == OOM else math.exp(nll[lab][c][j]))}
                         for lab in labels for c in self.contexts for j, a in enumerate(self.anchors)]}
        if ctx.paired:
            a, b = labels
            ok = [c for c in self.contexts if OOM not in (nll[a][c], nll[b][c])]
            tests = paired_nll_by_length({c: nll[a][c] for c in ok}, {c: nll[b][c] for c in ok})
            # Holm corrects over the lengths both models finished; say how many that was.
            out["holm"] = {"m": len(ok), "contexts": ok,
                           "excluded_oom": [c for c in self.contexts if c not in ok]}
            for row in rows:
                if row["context"] in tests:
                    row["test"] = tests[row["context"]]
        out["summary"] = {f"{lab}/ctx{r['context']}/ppl": r[lab]["ppl"] for r in rows for lab in labels
                          if r[lab] != OOM}
        return out

    def report(self, result: dict) -> str:
        labels = result["labels"]
        head = ["length (prior context)"] + [f"{lab} PPL (loss)" for lab in labels]
        if len(labels) == 2:
            head += [f"ΔPPL ({labels[1]} − {labels[0]})", f"{labels[1]} wins (test)"]
        body = []
        for r in result["rows"]:
            cells = [f"{r['length']:,} (prior {r['context']:,})"]
            cells += [OOM if r[lab] == OOM else f"{r[lab]['ppl']:.2f} ({r[lab]['loss']:.3f})" for lab in labels]
            if len(labels) == 2:
                a, b = r[labels[0]], r[labels[1]]
                cells.append("-" if OOM in (a, b) else f"{b['ppl'] - a['ppl']:+.2f}")
                t = r.get("test")
                cells.append("-" if t is None else f"{t['wins_b']} / {t['n']} (p_Holm={fmt_p(t['p_holm'])})")
            body.append(cells)
        note = (f"{len(result['anchors'])} anchors, "
                f"{result['targets_per_anchor']:,} identical target tokens per anchor "
                f"at every length (no bos; the first window token is context only); mode: {result['mode']}.")
        if len(labels) == 2:
            holm_m = result.get("holm", {}).get("m", len(result["rows"]))
            methods = sorted({r["test"]["wilcoxon_method"] for r in result["rows"] if "test" in r})
            note += (f" Wins: anchors where {labels[1]} has the lower mean NLL; two-sided Wilcoxon "
                     f"signed-rank per length ({', '.join(methods) or '-'}: exact null distribution without "
                     f"tied |d|, sign-flip permutation with ties), Holm step-down across the m = {holm_m} "
                     "lengths both models finished.")
        return f"## Long-sequence perplexity\n\n{markdown(head, body)}\n{note}\n"

    def plots(self, result: dict, out_dir: Path) -> list[str]:
        return [ppl_vs_context(result, out_dir / "ppl_vs_context.png")]

    def scalars(self, result: dict) -> dict[str, float]:
        return {k: float(v) for k, v in result["summary"].items()}


def ppl_vs_context(result: dict, path: Path) -> str:
    """PPL per model vs total length; with two models, B's win count is written at each point."""
    labels = result["labels"]
    xs = [r["length"] for r in result["rows"]]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for lab in labels:
        ax.plot(xs, [np.nan if r[lab] == "OOM" else r[lab]["ppl"] for r in result["rows"]], marker="o", label=lab)
    if len(labels) == 2:
        for r in result["rows"]:
            t = r.get("test")
            if t is not None and r[labels[1]] != "OOM":
                ax.annotate(f"{t['wins_b']}/{t['n']}", (r["length"], r[labels[1]]["ppl"]),
                            textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
        ax.set_title(f"PPL vs context (numbers: {labels[1]} wins per length)")
    else:
        ax.set_title("PPL vs context")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("input length (tokens)")
    ax.set_ylabel("perplexity of the last targets")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
