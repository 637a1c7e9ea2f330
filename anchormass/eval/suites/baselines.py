"""Training-free KV compression vs AnchorMass at equal stored KV bytes (docs/method.md §3, §6 f).

For every length and budget level, on identical items:
- AnchorMass with a global slot budget b (when an AnchorMass model is given), and
- the Standard model with each policy (snapkv / h2o / streaming_llm) at the per-head token budget
  whose stored bytes after the last token equal AnchorMass's (the level's target), plus
- the Standard model with its full cache (the ceiling).
Without an AnchorMass model a level is a token count: the target is that many tokens' K+V.

Equal memory means equal *stored* bytes (`cache.stored_nbytes`: the keys, values and masses a
method keeps) after the last token, for every method alike; allocated bytes (`cache.nbytes`:
buffers, spare capacity, per-token bookkeeping) are reported beside them. A Standard token
costs `standard_bytes_per_token` (measured), so the target is T = stored / per-token tokens:
a bounded policy (h2o, streaming_llm) keeps T; SnapKV compresses only the prompt and appends
every later token, so it gets T minus the tokens fed after the prefill. Each row states its
measured ratio to the target and whether it lies within `tolerance` (5%); a policy that cannot
reach the target (prompt shorter than its budget, budget under its minimum) says so there.

Protocol of one session: the prompt is prefilled in chunks (`chunk`, default the model's
prefill_chunk), the prefill ends (SnapKV compresses here), then the continuation is fed
`score_chunk` tokens at a time (default 1: the policies act after every token, as in decoding).
- ppl: the ppl suite's items (anchors, contexts, target_len, same targets at every context);
  prompt = tok[a - C : a + 1], continuation = the remaining target window (teacher-forced).
  RoPE base from the whole input length, as the ppl suite's cached mode does.
- passkey: the passkey suite's prompts (Haystack); greedy decoding of `new_tokens`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from anchormass.cache.kv_policies import POLICIES
from anchormass.errors import ConfigError
from anchormass.eval.items import PplItems, draw_anchors, passkey_setup, ppl_items, score_answer
from anchormass.eval.report import KIB, markdown, plt, save_figure
from anchormass.eval.scoring import (
    Method,
    matched_budget,
    needs_standard,
    prefill_chunk,
    progress,
    session_decode,
    session_logprobs,
    standard_bytes_per_token,
)
from anchormass.eval.suite import EvalContext, Suite

BYTE_FIELDS = ("stored_prefill", "stored_end", "allocated_prefill", "allocated_peak")


@dataclass
class Job:
    """One item of a (task, length) cell; `fed` = tokens fed after the prefill."""

    task: str
    length: int
    item: str
    fed: int
    run: object  # Method -> dict


class BaselinesSuite(Suite):
    name = "baselines"
    in_all = True

    def applies(self, ctx: EvalContext) -> str | None:
        return needs_standard(ctx, "the KV-compression baselines run")

    # --------------------------------------------------------------- config
    def check(self, ctx: EvalContext) -> None:
        self.standard = next(m for m in ctx.models if m.arch == "standard")
        self.anchormass = next((m for m in ctx.models if m.arch == "anchormass"), None)
        self.policies = [str(p) for p in self.opt("policies", list(POLICIES))]
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown:
            raise ConfigError(f"baselines: unknown policies {unknown}; choose from {sorted(POLICIES)}")
        args = self.opt("policy_args", {}) or {}
        try:
            self.policy_objs = {p: POLICIES[p](**dict(args.get(p, {}))) for p in self.policies}
        except TypeError as err:
            raise ConfigError(f"baselines.policy_args: {err}") from None
        key = "slot_budgets" if self.anchormass is not None else "token_budgets"
        self.levels = [int(b) for b in self.opt(key, [32, 64] if self.anchormass is not None else [64, 128])]
        if not self.levels or min(self.levels) < 1:
            raise ConfigError(f"baselines.{key} must be a non-empty list of positive budgets")
        self.chunk = int(self.opt("chunk", 0)) or None
        self.score_chunk = int(self.opt("score_chunk", 1))
        self.tolerance = float(self.opt("tolerance", 0.05))
        if self.score_chunk < 1:
            raise ConfigError("baselines.score_chunk must be >= 1")
        self._check_ppl(ctx)
        self._check_passkey(ctx)
        if self.ppl is None and self.passkey is None:
            raise ConfigError("baselines: nothing to run (give a token file for ppl and/or a tokenizer for passkey)")

    def _check_ppl(self, ctx: EvalContext) -> None:
        """The ppl suite's items (anchors, contexts, targets), or seeded random tokens when no token
        file is configured (random-init demos)."""
        cfg = self.opt("ppl", {"contexts": [192], "target_len": 32, "n_anchors": 2})
        self.ppl, self.ppl_note = None, None
        if not cfg:
            return
        cfg = dict(cfg)
        if cfg.get("data") or ctx.data_dir is not None:
            items = ppl_items(cfg, ctx)  # validates lengths and data, records the file, draws the anchors
            self.ppl_note = "token file " + str(cfg.get("data") or ctx.data_dir)
        else:
            contexts = [int(c) for c in cfg.get("contexts", [192])]
            target_len = int(cfg.get("target_len", 32))
            for c in contexts:
                ctx.check_length(self.name, c + target_len)
            n = max(contexts) + target_len + 64 * int(cfg.get("n_anchors", 2))
            tokens = np.random.default_rng(ctx.seed).integers(0, self.standard.config.vocab_size, n)
            anchors = draw_anchors(n, max(contexts), target_len, int(cfg.get("n_anchors", 2)),
                                   int(cfg.get("anchor_seed", 0)))
            items = PplItems(tokens=tokens, anchors=anchors, contexts=contexts, target_len=target_len)
            self.ppl_note = "seeded random tokens (no token file given)"
        self.ppl = {"tokens": items.tokens, "anchors": items.anchors, "contexts": items.contexts,
                    "target_len": items.target_len}

    def _check_passkey(self, ctx: EvalContext) -> None:
        cfg = self.opt("passkey", {"lengths": [256], "depths": [0.1, 0.5, 0.9], "seeds": [0], "new_tokens": 8})
        self.passkey, self.passkey_note = None, None
        if not cfg:
            return
        if ctx.tokenizer is None:
            self.passkey_note = "skipped: no tokenizer"
            return
        cfg = {"depths": [0.1, 0.5, 0.9], "seeds": [0], **cfg}
        hay, trials, new_tokens = passkey_setup(self.name, cfg, ctx, cfg.get("lengths", [256]))
        self.passkey = {"haystack": hay, "trials": trials, "new_tokens": new_tokens}

    # --------------------------------------------------------------- running
    def _ppl_item(self, method: Method, ids: torch.Tensor, context: int) -> dict:
        chunk = prefill_chunk(self.chunk, method.model)
        lp, kv = session_logprobs(method.model.model, ids, context, chunk, self.score_chunk,
                                  method.policy, method.budget)
        nll = float(-lp.mean())
        return {"nll": nll, "ppl": math.exp(nll), **kv.as_dict()}

    def _passkey_item(self, method: Method, trial) -> dict:
        model = method.model.model
        tok = self.passkey["haystack"].tok
        ids = torch.tensor([self.passkey["haystack"].build(trial)], device=next(model.parameters()).device)
        chunk = prefill_chunk(self.chunk, method.model)
        out, kv = session_decode(model, ids, self.passkey["new_tokens"], chunk, method.policy, method.budget,
                                 vocab_limit=tok.vocab_size)
        text = tok.decode(out[0].tolist())
        return {**score_answer(text, trial.key), "text": text, **kv.as_dict()}

    def _jobs(self, ctx: EvalContext) -> list[Job]:
        jobs = []
        if self.ppl is not None:
            p = self.ppl
            for c in p["contexts"]:
                for a in p["anchors"]:
                    ids = torch.as_tensor(np.asarray(p["tokens"][a - c:a + p["target_len"]], dtype=np.int64),
                                          device=ctx.device)[None]
                    # prompt ids[:c+1]; then ids[c+1 .. T-2] are fed (the last token is only a target)
                    jobs.append(Job("ppl", c + p["target_len"], f"anchor {a}, context {c}", p["target_len"] - 2,
                                    lambda m, ids=ids, c=c: self._ppl_item(m, ids, c)))
        if self.passkey is not None:
            n = self.passkey["new_tokens"]
            for t in self.passkey["trials"]:
                jobs.append(Job("passkey", t.length, f"depth {t.depth}, seed {t.seed}", max(0, n - 1),
                                lambda m, t=t: self._passkey_item(m, t)))
        return jobs

    def run(self, ctx: EvalContext) -> dict:
        self.per_token = standard_bytes_per_token(self.standard.model)
        cells: dict[tuple[str, int], list[Job]] = {}
        for job in self._jobs(ctx):
            cells.setdefault((job.task, job.length), []).append(job)
        items: list[dict] = []
        steps = [(cell, level) for cell in cells for level in self.levels] + [(cell, None) for cell in cells]
        for cell, level in progress(steps, ctx.progress, "baselines"):
            items += self._run_level(cells[cell], level)
        return self._summarise(items)

    def _run_level(self, jobs: list[Job], level: int | None) -> list[dict]:
        """Every method of one level on the cell's items; the target is fixed first (AnchorMass's
        mean stored bytes after the last token, or `level` Standard tokens)."""
        tag = "full" if level is None else f"{'slots' if self.anchormass is not None else 'tokens'}={level}"
        done: list[dict] = []

        def record(method: Method, target: float | None, note: str | None) -> list[dict]:
            rows = [{"task": j.task, "length": j.length, "level": tag, "method": method.name,
                     "model": method.model.label, "budget": method.budget, "item": j.item, "fed": j.fed,
                     "target_stored": target, "note": note, **j.run(method)} for j in jobs]
            done.extend(rows)
            return rows

        if level is None:
            record(Method("full", self.standard), None, None)
            return done
        if self.anchormass is not None:
            am = record(Method("anchormass", self.anchormass, None, level), None, None)
            target = float(np.mean([r["stored_end"] for r in am]))
            for r in am:
                r["target_stored"] = target
        else:
            target = float(level * self.per_token)
        fed = jobs[0].fed  # the same for every item of a cell
        for name, policy in self.policy_objs.items():
            budget, note = matched_budget(policy, target / self.per_token, fed)
            record(Method(name, self.standard, policy, budget), target, note)
        return done

    # --------------------------------------------------------------- results
    def _summarise(self, items: list[dict]) -> dict:
        groups: dict[tuple, list[dict]] = {}
        for it in items:
            groups.setdefault((it["task"], it["length"], it["level"], it["method"]), []).append(it)
        out_rows = []
        for (task, length, level, method), its in groups.items():
            first = its[0]
            row = {"task": task, "length": length, "level": level, "method": method, "budget": first["budget"],
                   "n": len(its), "target_stored": first["target_stored"],
                   "notes": sorted({it["note"] for it in its if it["note"]})}
            row.update({k: float(np.mean([it[k] for it in its])) for k in BYTE_FIELDS})
            if row["target_stored"]:
                row["stored_ratio"] = row["stored_end"] / row["target_stored"]
                row["matched"] = abs(row["stored_ratio"] - 1) <= self.tolerance
            if task == "ppl":
                row["nll"] = float(np.mean([it["nll"] for it in its]))
                row["score"] = math.exp(row["nll"])  # PPL of the mean NLL over items
            else:
                row["score"] = float(np.mean([float(it["exact"]) for it in its]))  # exact-match rate
                row["digits"] = float(np.mean([it["digits"] for it in its]))
            out_rows.append(row)
        # Table order: task, length, then the full cache before the budget levels (as run).
        tasks = {"ppl": 0, "passkey": 1}
        out_rows.sort(key=lambda r: (tasks[r["task"]], r["length"], r["level"] != "full"))
        summary = {f"{r['task']}/L{r['length']}/{r['level']}/{r['method']}": r["score"] for r in out_rows}
        unmatched = [f"{r['task']}/L{r['length']}/{r['level']}/{r['method']}" for r in out_rows
                     if r.get("matched") is False]
        return {"settings": {"policies": {p: o.__dict__ for p, o in self.policy_objs.items()},
                             "levels": self.levels, "level_kind": "slots" if self.anchormass is not None else "tokens",
                             "standard": self.standard.label,
                             "anchormass": None if self.anchormass is None else self.anchormass.label,
                             "standard_bytes_per_token": self.per_token, "score_chunk": self.score_chunk,
                             "tolerance": self.tolerance, "unmatched": unmatched,
                             "ppl": self.ppl_note, "passkey": self.passkey_note or (
                                 None if self.passkey is None else f"{len(self.passkey['trials'])} trials")},
                "rows": out_rows, "summary": summary, "items": items}

    def report(self, result: dict) -> str:
        s = result["settings"]
        head = ["task", "length", "level", "method", "budget", "stored KiB (prefill → end)", "vs target",
                "allocated KiB (prefill / peak)", "score", "n"]
        body = []
        for r in result["rows"]:
            score = (f"PPL {r['score']:.2f}" if r["task"] == "ppl"
                     else f"{r['score']:.0%} exact, {r['digits']:.2f} digits")
            budget = "-" if r["budget"] is None else (f"{r['budget']} slots" if r["method"] == "anchormass"
                                                       else f"{r['budget']} tok/head")
            ratio = "-" if not r.get("target_stored") else (
                f"{r['stored_ratio']:.3f}" + ("" if r["matched"] else " (not matched)"))
            body.append([r["task"], f"{r['length']:,}", r["level"], r["method"], budget,
                         f"{r['stored_prefill'] / KIB:,.1f} → {r['stored_end'] / KIB:,.1f}", ratio,
                         f"{r['allocated_prefill'] / KIB:,.1f} / {r['allocated_peak'] / KIB:,.1f}", score, r["n"]])
        target = ("The target of a level is AnchorMass's mean stored bytes after the last token"
                  if s["anchormass"] else "The target of a level is that many Standard tokens' K+V")
        notes = sorted({f"{r['method']} {r['level']} L={r['length']:,}: {n}"
                        for r in result["rows"] for n in r["notes"]})
        text = (f"## KV compression baselines at equal stored KV bytes\n\n{markdown(head, body)}\n"
                f"Stored = keys, values and masses a method keeps (`cache.stored_nbytes`), at the end of the prefill "
                f"and after the last token; allocated = its buffers (`cache.nbytes`). {target}; a Standard token "
                f"stores {s['standard_bytes_per_token']:,} B (measured); 'vs target' = stored after the last token / "
                f"target, matched within ±{s['tolerance']:.0%}. Means over items. Continuations fed "
                f"{s['score_chunk']} token(s) at a time. ppl items: {s['ppl']}; passkey: {s['passkey']}.\n")
        if notes:
            text += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
        return text

    def plots(self, result: dict, out_dir: Path) -> list[str]:
        return [score_vs_bytes(result, out_dir / "baselines_score_vs_kv_bytes.png")]


def score_vs_bytes(result: dict, path: Path) -> str:
    """One panel per task: score against stored KV KiB after the last token; colour = method,
    marker = length."""
    tasks = [t for t in ("ppl", "passkey") if any(r["task"] == t for r in result["rows"])]
    methods = list(dict.fromkeys(r["method"] for r in result["rows"]))
    colour = {m: f"C{i}" for i, m in enumerate(methods)}
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        rows = [r for r in result["rows"] if r["task"] == task]
        lengths = sorted({r["length"] for r in rows})
        for marker, length in zip("osD^v<>", lengths):
            for method in methods:
                pts = sorted((r["stored_end"] / KIB, r["score"]) for r in rows
                             if r["method"] == method and r["length"] == length)
                if pts:
                    ax.plot(*zip(*pts), color=colour[method], marker="*" if method == "full" else marker,
                            markersize=11 if method == "full" else 6, label=f"{method}, L={length:,}")
        ax.set_xscale("log")
        ax.set_xlabel("stored KV after the last token, measured (KiB)")
        if task == "ppl":
            ax.set_ylabel("perplexity (lower is better)")
        else:
            ax.set_ylabel("passkey exact match")
            ax.set_ylim(-0.05, 1.05)
        ax.set_title(f"{task}: score vs stored KV bytes")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, path)


