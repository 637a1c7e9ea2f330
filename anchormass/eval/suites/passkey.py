"""(c) Passkey retrieval (needle in a haystack), docs/method.md §6 c.

Trials: every (length, depth, seed) of the config, identical for both models (items.py builds
the exact-length prompts). Greedy decoding of `max_new_tokens`; the answer is the first digit
run of the NFKC-normalised text. A format-robustness run repeats the trials of one length with
each of the five question phrasings.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from anchormass.errors import ConfigError
from anchormass.eval.items import DEFAULT_DEPTHS, PHRASINGS, build_haystack, run_trials, tally, trial_grid
from anchormass.eval.report import annotated_heatmap, fmt_p, markdown, mcnemar_exact, pct, plt
from anchormass.eval.scoring import OOM
from anchormass.eval.suite import EvalContext, Suite


def paired_exact(records: list[dict], labels: list[str], key=lambda r: True) -> dict:
    """McNemar over trials both models saw (matched by length/depth/seed/phrasing)."""
    ident = lambda r: (r["length"], r["depth"], r["seed"], r["phrasing"])  # noqa: E731
    a = {ident(r): r["exact"] for r in records if r["model"] == labels[0] and key(r)}
    b = {ident(r): r["exact"] for r in records if r["model"] == labels[1] and key(r)}
    common = sorted(set(a) & set(b))
    return mcnemar_exact([a[k] for k in common], [b[k] for k in common])


class PasskeySuite(Suite):
    name = "passkey"
    in_all = True
    needs_tokenizer = True

    def check(self, ctx: EvalContext) -> None:
        super().check(ctx)
        self.lengths = [int(L) for L in self.opt("lengths", [4096, 8192, 16384, 32768])]
        self.depths = [float(d) for d in self.opt("depths", DEFAULT_DEPTHS)]
        self.seeds = [int(s) for s in self.opt("seeds", [0, 1, 2])]
        if not (self.lengths and self.depths and self.seeds) or any(not 0 <= d <= 1 for d in self.depths):
            raise ConfigError("passkey: lengths, depths (in [0, 1]) and seeds must be non-empty")
        rob = self.opt("robustness") or {}
        self.rob_length = rob.get("length")
        self.rob_phrasings = list(rob.get("phrasings", list(PHRASINGS["ja"])))
        self.hay = build_haystack(self, ctx)
        jitter = bool(self.opt("jitter", True))
        trials = trial_grid(self.lengths, self.depths, self.seeds, self.opt("phrasing", "plain"), jitter=jitter)
        if self.rob_length:
            # A robustness trial that is a main one (same length, depth, seed and phrasing) is that trial,
            # needle offset included, so it runs once and the main table keeps its own count.
            main = {(t.length, t.depth, t.seed, t.phrasing): t for t in trials}
            trials += [main.get((t.length, t.depth, t.seed, t.phrasing), t) for p in self.rob_phrasings
                       for t in trial_grid([self.rob_length], self.depths, rob.get("seeds", self.seeds), p,
                                           jitter=jitter)]
        trials = list(dict.fromkeys(trials))
        for L in {t.length for t in trials}:
            ctx.check_length("passkey", L)
        for t in trials:
            self.hay.build(t)  # too short / unknown phrasing -> ConfigError before anything runs
        self.trials = trials

    def run(self, ctx: EvalContext) -> dict:
        records = []
        for m in ctx.models:
            records += run_trials(ctx, m, self.hay, self.trials, max_new_tokens=int(self.opt("max_new_tokens", 8)),
                                  batch_size=int(self.opt("batch_size", 1)), policy=self.opt("policy"),
                                  budget=self.opt("budget"), chunk=self.opt("chunk"))
        labels = [m.label for m in ctx.models]
        main_phr = self.opt("phrasing", "plain")
        # Exactly the main grid: robustness trials at a main length (more seeds) stay out of it.
        depths, seeds = set(self.depths), set(self.seeds)
        main = [r for r in records if r["phrasing"] == main_phr and r["length"] in self.lengths
                and r["depth"] in depths and r["seed"] in seeds]
        by_length = {lab: {L: tally([r for r in main if r["model"] == lab and r["length"] == L])
                           for L in self.lengths} for lab in labels}
        heatmap = {lab: [[tally([r for r in main if r["model"] == lab and r["length"] == L and r["depth"] == d])
                          for d in self.depths] for L in self.lengths] for lab in labels}
        heat_rate = {lab: [[c["exact"] / c["n"] if c["n"] else float("nan") for c in row] for row in grid]
                     for lab, grid in heatmap.items()}
        out = {"labels": labels, "lengths": self.lengths, "depths": self.depths, "seeds": self.seeds,
               "filler": self.hay.filler, "lang": self.hay.lang, "phrasing": main_phr,
               "by_length": by_length, "heatmap": heat_rate,
               "heatmap_n": {lab: [[c["n"] for c in row] for row in grid] for lab, grid in heatmap.items()},
               "items": records}
        if self.rob_length:
            rob_seeds = set((self.opt("robustness") or {}).get("seeds", self.seeds))
            rob = [r for r in records if r["length"] == self.rob_length and r["phrasing"] in self.rob_phrasings
                   and r["seed"] in rob_seeds]
            out["robustness"] = {"length": self.rob_length, "phrasings": self.rob_phrasings,
                                 "by_phrasing": {lab: {p: tally([r for r in rob
                                                                 if r["model"] == lab and r["phrasing"] == p])
                                                       for p in self.rob_phrasings} for lab in labels},
                                 "total": {lab: tally([r for r in rob if r["model"] == lab]) for lab in labels}}
        if ctx.paired:
            out["paired"] = {L: paired_exact(main, labels, key=lambda r, L=L: r["length"] == L)
                             for L in self.lengths}
        # A length that ran out of memory has no score: missing from the summary, not 0.0 exact.
        out["summary"] = {f"{lab}/len{L}/exact": c["exact"] / c["n"] for lab in labels
                          for L, c in by_length[lab].items() if c["n"] and not c["oom"]}
        return out

    def report(self, result: dict) -> str:
        labels = result["labels"]
        head = ["length"] + [f"{lab} exact (digits)" for lab in labels]
        if len(labels) == 2:
            head += [f"correct diff ({labels[1]} − {labels[0]})", "McNemar p"]
        body = []
        for L in result["lengths"]:
            cells = [f"{L:,}"]
            for lab in labels:
                c = result["by_length"][lab][L]
                cells.append(OOM if c["oom"] == c["n"]
                             else f"{pct(c['exact'], c['n'])}, {c['digits_mean']:.2f} digits")
            if len(labels) == 2:
                ca, cb = (result["by_length"][lab][L] for lab in labels)
                cells += [f"{cb['exact'] - ca['exact']:+d}", fmt_p(result["paired"][L]["p"])]
            body.append(cells)
        text = (f"## Passkey retrieval\n\n{markdown(head, body)}\n"
                f"{len(result['depths'])} depths x {len(result['seeds'])} seeds per length; filler: {result['filler']} "
                f"({result['lang']}), phrasing: {result['phrasing']}; exact = first digit run equals the key.\n")
        rob = result.get("robustness")
        if rob:
            head = ["phrasing"] + [f"{lab} exact" for lab in labels]
            body = [[p] + [pct(rob["by_phrasing"][lab][p]["exact"], rob["by_phrasing"][lab][p]["n"])
                           for lab in labels] for p in rob["phrasings"]]
            body.append(["**total**"] + [pct(rob["total"][lab]["exact"], rob["total"][lab]["n"])
                                         for lab in labels])
            text += f"\n### Format robustness at {rob['length']:,} tokens\n\n{markdown(head, body)}"
        return text

    def plots(self, result: dict, out_dir: Path) -> list[str]:
        return [passkey_heatmap(result, out_dir / "passkey_heatmap.png")]


def passkey_heatmap(result: dict, path: Path) -> str:
    """Exact-match rate by length (rows) x needle depth (columns), one panel per model."""
    labels, lengths, depths = result["labels"], result["lengths"], result["depths"]
    fig, axes = plt.subplots(1, len(labels), figsize=(1.2 * len(depths) * len(labels) + 2, 0.5 * len(lengths) + 2),
                             squeeze=False)
    for ax, lab in zip(axes[0], labels):
        im = annotated_heatmap(ax, np.array(result["heatmap"][lab], dtype=float))  # [lengths, depths]
        ax.set_xticks(range(len(depths)), [f"{d:.0%}" for d in depths])
        ax.set_yticks(range(len(lengths)), [f"{L:,}" for L in lengths])
        ax.set_xlabel("needle depth")
        ax.set_ylabel("length (tokens)")
        ax.set_title(f"passkey exact match: {lab}")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name
