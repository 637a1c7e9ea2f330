"""Training-free KV compression vs AnchorMass at equal KV bytes (SPEC 3 / 6 f).

For every length and budget level, on identical items:
- AnchorMass with a global slot budget b (when an AnchorMass model is given), and
- the Standard model with each policy (snapkv / h2o / streaming_llm) at the per-head token budget
  whose K+V bytes equal the AnchorMass cache's measured bytes after the prefill
  (budget = AnchorMass nbytes // Standard K+V bytes per token, both measured), plus
- the Standard model with its full cache (the ceiling).
Without an AnchorMass model the levels are plain token budgets (`token_budgets`).

Protocol of one session: the prompt is prefilled in chunks (`chunk`, default the model's
prefill_chunk), the prefill ends (SnapKV compresses here), then the continuation is fed
`score_chunk` tokens at a time (default 1: the policies act after every token, as in decoding).
- ppl: the ppl suite's items (anchors, contexts, target_len, same targets at every context);
  prompt = tok[a - C : a + 1], continuation = the remaining target window (teacher-forced).
  RoPE base from the whole input length, as the ppl suite's cached mode does.
- passkey: the passkey suite's prompts (Haystack); greedy decoding of `new_tokens`.
`kv_bytes` is the largest `cache.nbytes` measured after the prefill ended (so SnapKV, which only
compresses the prompt, is charged for the tokens it appends afterwards).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from anchormass.cache import new_cache
from anchormass.cache.kv_policies import POLICIES
from anchormass.errors import ConfigError
from anchormass.eval import tables
from anchormass.eval.common import gather_logprobs, progress
from anchormass.eval.suite import EvalContext, EvalModel, Suite
from anchormass.inference import generate  # the module
from anchormass.models.rope import ntk_base

MIB = 1024 ** 2


# ------------------------------------------------------------------------- sessions
def new_session(model, batch_size: int, total_len: int, policy=None, budget=None):
    """A cache whose RoPE base is fixed from `total_len` (the prompt, or the whole scored input)."""
    cfg = model.cfg
    cache = new_cache(model, batch_size=batch_size, policy=policy, budget=budget)
    cache.rope_base = ntk_base(cfg.rope_theta, total_len, cfg.original_max_len, cfg.head_dim)
    return cache


def prefill(model, ids: torch.Tensor, cache, chunk: int) -> torch.Tensor:
    """The engine's chunked prefill (RoPE base, end_prefill included); last-position logits [B, V] fp32."""
    return generate.prefill(model, ids, cache, chunk).float()


@torch.no_grad()
def greedy(model, cache, logits: torch.Tensor, n_tokens: int, meter: "list[int] | None" = None,
           vocab_limit: int | None = None) -> torch.Tensor:
    """Greedy decoding from the last prompt logits [B, V]; returns the n_tokens ids [B, n].
    vocab_limit: only ids below it are candidates (a tokenizer smaller than the model's vocab)."""
    out = []
    for i in range(n_tokens):
        token = logits[:, :vocab_limit].argmax(-1, keepdim=True)  # [B, 1]
        out.append(token)
        if i + 1 < n_tokens:
            logits = model(token, cache=cache)[:, -1].float()
            if meter is not None:
                meter.append(cache.nbytes)
    return torch.cat(out, dim=1)


@torch.no_grad()
def session_logprobs(model, ids: torch.Tensor, start: int, chunk: int, score_chunk: int,
                     policy=None, budget=None) -> tuple[torch.Tensor, int]:
    """log p(ids[t+1] | ids[:t+1]) for t = start .. T-2, [B, T-1-start], with the prompt ids[:, :start+1]
    prefilled (then end_prefill) and the rest fed score_chunk tokens at a time. Also returns the
    largest nbytes measured after the prefill."""
    total = ids.shape[1]
    cache = new_session(model, ids.shape[0], total, policy, budget)
    last = prefill(model, ids[:, : start + 1], cache, chunk)  # row `start`
    out = [gather_logprobs(last[:, None], ids[:, start + 1:start + 2])]
    peak = cache.nbytes
    for s in range(start + 1, total - 1, score_chunk):
        e = min(total - 1, s + score_chunk)
        logits = model(ids[:, s:e], cache=cache)  # rows s .. e-1 predict ids[s+1 .. e]
        out.append(gather_logprobs(logits, ids[:, s + 1:e + 1]))
        peak = max(peak, cache.nbytes)
    return torch.cat(out, dim=1), peak


@torch.no_grad()
def kv_bytes_per_token(model) -> float:
    """Measured K+V bytes one token costs in a Standard cache (all layers), from an exactly-sized cache."""
    from anchormass.cache.standard_cache import StandardCache

    p = next(model.parameters())
    n = 8
    cache = StandardCache(model.cfg, 1, device=p.device, dtype=p.dtype, decode_reserve=0)
    prefill(model, torch.zeros(1, n, dtype=torch.long, device=p.device), cache, n)
    return cache.nbytes / n


# ------------------------------------------------------------------------- prompts
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
            from anchormass.eval.haystack import make_trial

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
        from anchormass.eval.haystack import Haystack

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


# ------------------------------------------------------------------------- the suite
def needs_standard(ctx: EvalContext, what: str) -> str | None:
    """Suite.applies for suites that study the Standard model's cache."""
    if any(m.arch == "standard" for m in ctx.models):
        return None
    return f"{what} on a Standard model (arch=standard); none given"


@dataclass
class Method:
    """One column of the comparison: a model plus a cache setting."""

    name: str  # "anchormass" | "full" | a kv policy name
    model: EvalModel
    policy: object = None
    budget: int | None = None


class BaselinesSuite(Suite):
    name = "baselines"

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
        if self.score_chunk < 1:
            raise ConfigError("baselines.score_chunk must be >= 1")
        self._check_ppl(ctx)
        self._check_passkey(ctx)
        if self.ppl is None and self.passkey is None:
            raise ConfigError("baselines: nothing to run (give a token file for ppl and/or a tokenizer for passkey)")

    def _check_ppl(self, ctx: EvalContext) -> None:
        """Items from the ppl suite itself (anchors, contexts, targets), or seeded random tokens
        when no token file is configured (random-init demos)."""
        from anchormass.eval.ppl import PplSuite, draw_anchors

        cfg = self.opt("ppl", {"contexts": [192], "target_len": 32, "n_anchors": 2})
        self.ppl, self.ppl_note = None, None
        if not cfg:
            return
        cfg = dict(cfg)
        inner = PplSuite(cfg)
        if cfg.get("data") or ctx.data_dir is not None:
            inner.check(ctx)  # validates lengths and data, records the file, draws the anchors
            tokens, self.ppl_note = inner.tokens, "token file " + str(cfg.get("data") or ctx.data_dir)
        else:
            inner.contexts = [int(c) for c in cfg.get("contexts", [192])]
            inner.target_len = int(cfg.get("target_len", 32))
            for c in inner.contexts:
                ctx.check_length(self.name, c + inner.target_len)
            n = max(inner.contexts) + inner.target_len + 64 * int(cfg.get("n_anchors", 2))
            tokens = np.random.default_rng(ctx.seed).integers(0, self.standard.config.vocab_size, n)
            inner.anchors = draw_anchors(n, max(inner.contexts), inner.target_len, int(cfg.get("n_anchors", 2)),
                                         int(cfg.get("anchor_seed", 0)))
            self.ppl_note = "seeded random tokens (no token file given)"
        self.ppl = {"tokens": tokens, "anchors": inner.anchors, "contexts": inner.contexts,
                    "target_len": inner.target_len}

    def _check_passkey(self, ctx: EvalContext) -> None:
        cfg = self.opt("passkey", {"lengths": [256], "depths": [0.1, 0.5, 0.9], "seeds": [0], "new_tokens": 8})
        self.passkey, self.passkey_note = None, None
        if not cfg:
            return
        if ctx.tokenizer is None:
            self.passkey_note = "skipped: no tokenizer"
            return
        from anchormass.eval.haystack import make_trial
        from anchormass.eval.passkey import build_haystack

        cfg = dict(cfg)
        options = Suite(cfg)  # the passkey suite's haystack options (filler, lang, filler_path, bos)
        options.name = self.name
        hay = build_haystack(options, ctx)
        trials = [make_trial(int(n), float(d), int(s)) for n in cfg.get("lengths", [256])
                  for d in cfg.get("depths", [0.1, 0.5, 0.9]) for s in cfg.get("seeds", [0])]
        for t in trials:
            ctx.check_length(self.name, t.length)
            hay.build(t)  # too-short lengths fail here, before anything runs
        self.passkey = {"haystack": hay, "trials": trials, "new_tokens": int(cfg.get("new_tokens", 8))}

    # --------------------------------------------------------------- running
    def _chunk(self, m: EvalModel) -> int:
        return self.chunk or m.config.prefill_chunk

    def _ppl_item(self, method: Method, ids: torch.Tensor, context: int) -> dict:
        lp, peak = session_logprobs(method.model.model, ids, context, self._chunk(method.model), self.score_chunk,
                                    method.policy, method.budget)
        nll = float(-lp.mean())
        return {"nll": nll, "ppl": math.exp(nll), "kv_bytes": int(peak)}

    def _passkey_item(self, method: Method, trial) -> dict:
        from anchormass.eval.answers import score_answer

        model = method.model.model
        ids = torch.tensor([self.passkey["haystack"].build(trial)], device=next(model.parameters()).device)
        cache = new_session(model, 1, ids.shape[1], method.policy, method.budget)
        logits = prefill(model, ids, cache, self._chunk(method.model))
        meter = [cache.nbytes]
        tok = self.passkey["haystack"].tok
        out = greedy(model, cache, logits, self.passkey["new_tokens"], meter, vocab_limit=tok.vocab_size)
        text = tok.decode(out[0].tolist())
        return {**score_answer(text, trial.key), "text": text, "kv_bytes": int(max(meter))}

    def run(self, ctx: EvalContext) -> dict:
        per_token = kv_bytes_per_token(self.standard.model)
        items: list[dict] = []
        jobs = []  # (task, length, item id, runner)
        if self.ppl is not None:
            p = self.ppl
            for c in p["contexts"]:
                for a in p["anchors"]:
                    ids = torch.as_tensor(np.asarray(p["tokens"][a - c:a + p["target_len"]], dtype=np.int64),
                                          device=ctx.device)[None]
                    jobs.append(("ppl", c + p["target_len"], f"anchor {a}, context {c}",
                                 lambda m, ids=ids, c=c: self._ppl_item(m, ids, c)))
        if self.passkey is not None:
            for t in self.passkey["trials"]:
                jobs.append(("passkey", t.length, f"depth {t.depth}, seed {t.seed}",
                             lambda m, t=t: self._passkey_item(m, t)))

        # Levels are matched per (task, length): the mean AnchorMass bytes over that cell's items.
        cells: dict[tuple[str, int], list] = {}
        for job in jobs:
            cells.setdefault(job[:2], []).append(job)
        steps = [(cell, level) for cell in cells for level in self.levels] + [(cell, None) for cell in cells]
        for (task, length), level in progress(steps, ctx.progress, "baselines"):
            cell_jobs = cells[task, length]
            tag = "full" if level is None else f"{'slots' if self.anchormass is not None else 'tokens'}={level}"

            def record(method: Method) -> list[dict]:
                done = []
                for _, _, item_id, fn in cell_jobs:
                    done.append({"task": task, "length": length, "level": tag, "method": method.name,
                                 "model": method.model.label, "budget": method.budget, "item": item_id,
                                 **fn(method)})
                items.extend(done)
                return done

            if level is None:
                record(Method("full", self.standard))
                continue
            budget = level
            if self.anchormass is not None:
                am = record(Method("anchormass", self.anchormass, None, level))
                budget = max(1, int(np.mean([r["kv_bytes"] for r in am]) // per_token))
            for name, policy in self.policy_objs.items():
                record(Method(name, self.standard, policy, budget))
        return self._summarise(items, per_token)

    # --------------------------------------------------------------- results
    def _summarise(self, items: list[dict], per_token: float) -> dict:
        rows: dict[tuple, dict] = {}
        for it in items:
            key = (it["task"], it["length"], it["level"], it["method"])
            row = rows.setdefault(key, {"task": it["task"], "length": it["length"], "level": it["level"],
                                        "method": it["method"], "budget": it["budget"], "_s": [], "_b": [],
                                        "_d": []})
            row["_s"].append(it["nll"] if it["task"] == "ppl" else float(it["exact"]))
            row["_b"].append(it["kv_bytes"])
            if it["task"] == "passkey":
                row["_d"].append(it["digits"])
        out_rows = []
        for row in rows.values():
            s, b, d = row.pop("_s"), row.pop("_b"), row.pop("_d")
            row["n"] = len(s)
            row["kv_bytes"] = float(np.mean(b))
            if row["task"] == "ppl":
                row["nll"] = float(np.mean(s))
                row["score"] = math.exp(row["nll"])  # PPL of the mean NLL over items
            else:
                row["score"] = float(np.mean(s))  # exact-match rate
                row["digits"] = float(np.mean(d))
            out_rows.append(row)
        # Table order: task, length, then the full cache before the budget levels (as run).
        tasks = {"ppl": 0, "passkey": 1}
        out_rows.sort(key=lambda r: (tasks[r["task"]], r["length"], r["level"] != "full"))
        summary = {f"{r['task']}/L{r['length']}/{r['level']}/{r['method']}": r["score"] for r in out_rows}
        return {"settings": {"policies": {p: o.__dict__ for p, o in self.policy_objs.items()},
                             "levels": self.levels, "level_kind": "slots" if self.anchormass is not None else "tokens",
                             "standard": self.standard.label,
                             "anchormass": None if self.anchormass is None else self.anchormass.label,
                             "standard_kv_bytes_per_token": per_token, "score_chunk": self.score_chunk,
                             "ppl": self.ppl_note, "passkey": self.passkey_note or (
                                 None if self.passkey is None else f"{len(self.passkey['trials'])} trials")},
                "rows": out_rows, "summary": summary, "items": items}

    def report(self, result: dict) -> str:
        s = result["settings"]
        head = ["task", "length", "level", "method", "budget", "KV MiB (measured)", "score", "n"]
        body = []
        for r in result["rows"]:
            score = f"PPL {r['score']:.2f}" if r["task"] == "ppl" else f"{r['score']:.0%} exact, {r['digits']:.2f} digits"
            budget = "-" if r["budget"] is None else (f"{r['budget']} slots" if r["method"] == "anchormass"
                                                       else f"{r['budget']} tok/head")
            body.append([r["task"], f"{r['length']:,}", r["level"], r["method"], budget,
                         f"{r['kv_bytes'] / MIB:.3f}", score, r["n"]])
        match = ("Standard budgets = AnchorMass nbytes after prefill // Standard K+V bytes per token "
                 f"({s['standard_kv_bytes_per_token']:.0f} B, measured)" if s["anchormass"] else
                 "levels are Standard token budgets per head (no AnchorMass model given)")
        return (f"## KV compression baselines at equal KV bytes\n\n{tables.markdown(head, body)}\n"
                f"{match}. KV MiB = largest `cache.nbytes` after the prefill, mean over items. "
                f"Continuations fed {s['score_chunk']} token(s) at a time. ppl items: {s['ppl']}; "
                f"passkey: {s['passkey']}.\n")

    def plots(self, result: dict, out_dir: Path) -> list[str]:
        return [score_vs_bytes(result, out_dir / "baselines_score_vs_kv_bytes.png")]


def score_vs_bytes(result: dict, path: Path) -> str:
    """One panel per task: score against measured KV MiB; colour = method, marker = length."""
    from anchormass.eval.plots import _save, plt

    tasks = [t for t in ("ppl", "passkey") if any(r["task"] == t for r in result["rows"])]
    methods = list(dict.fromkeys(r["method"] for r in result["rows"]))
    colour = {m: f"C{i}" for i, m in enumerate(methods)}
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        rows = [r for r in result["rows"] if r["task"] == task]
        lengths = sorted({r["length"] for r in rows})
        for marker, length in zip("osD^v<>", lengths):
            for method in methods:
                pts = sorted((r["kv_bytes"] / MIB, r["score"]) for r in rows
                             if r["method"] == method and r["length"] == length)
                if pts:
                    ax.plot(*zip(*pts), color=colour[method], marker="*" if method == "full" else marker,
                            markersize=11 if method == "full" else 6, label=f"{method}, L={length:,}")
        ax.set_xscale("log")
        ax.set_xlabel("KV cache, measured (MiB)")
        if task == "ppl":
            ax.set_ylabel("perplexity (lower is better)")
        else:
            ax.set_ylabel("passkey exact match")
            ax.set_ylim(-0.05, 1.05)
        ax.set_title(f"{task}: score vs KV bytes")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


__all__ = ["BaselinesSuite", "prefill", "greedy", "session_logprobs", "new_session", "prompt_source",
           "PromptSource", "kv_bytes_per_token", "needs_standard"]
