"""(a) Efficiency profile (docs/method.md §6 a): KV bytes, peak memory, prefill time, decode throughput.

Per model and length (batch 1, random token ids seeded identically for every model):
`warmup` unmeasured sessions, then `repeats` measured ones; each session is a fresh cache +
chunked prefill (timed; logits of the last position only) + greedy decoding of `decode_tokens`
(timed -> tok/s). Reported: medians; KV bytes = `cache.nbytes` after the prefill (measured,
and again after decoding); peak memory = growth during the first measured session (CUDA:
max_memory_allocated after reset_peak_memory_stats; CPU: peak RSS growth, method stated).
Standard models can also run under each KV policy of `standard_policies` at a stated budget.
Out-of-memory is recorded as "OOM" and longer lengths of that series are not tried.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from anchormass.errors import ConfigError
from anchormass.eval.report import markdown, plt, save_figure
from anchormass.eval.scoring import OOM, free_memory, is_oom, progress
from anchormass.eval.suite import EvalContext, EvalModel, Suite

MIB, GIB = 1024 ** 2, 1024 ** 3


class ProfileSuite(Suite):
    name = "profile"
    in_all = True

    def check(self, ctx: EvalContext) -> None:
        self.lengths = [int(L) for L in self.opt("lengths", [4096, 8192, 16384, 32768, 65536, 131072, 262144])]
        self.repeats = int(self.opt("repeats", 3))
        if not self.lengths or self.repeats < 1 or int(self.opt("decode_tokens", 128)) < 1:
            raise ConfigError("profile: lengths must be non-empty, repeats >= 1, decode_tokens >= 1")
        for L in self.lengths:
            ctx.check_length("profile", L)
        for spec in self.opt("standard_policies") or []:
            if "policy" not in spec:
                raise ConfigError(f"profile.standard_policies entries need a 'policy' (and 'budget'), got {spec}")

    def _series(self, ctx: EvalContext) -> list[tuple[str, EvalModel, object, object]]:
        """(series name, model, policy, budget) for every curve of the chart."""
        out = []
        for m in ctx.models:
            if m.arch == "anchormass":
                pol, bud = self.opt("policy"), self.opt("budget")
                out.append((m.label if pol is None and bud is None else f"{m.label} {pol or ''}@{bud}", m, pol, bud))
            else:
                out.append((m.label, m, None, None))
                for spec in self.opt("standard_policies") or []:
                    out.append((f"{m.label} + {spec['policy']}@{spec.get('budget')}", m,
                                spec["policy"], spec.get("budget")))
        return out

    def _measure(self, ctx: EvalContext, m: EvalModel, policy, budget, length: int) -> dict:
        from anchormass.bench.measure import Timing, peak_memory_growth, time_call
        from anchormass.bench.workloads import decode, prefill, random_ids

        ids = random_ids(m.config.vocab_size, 1, length, ctx.seed, ctx.device)
        chunk = int(self.opt("chunk") or m.config.prefill_chunk)
        n_new = int(self.opt("decode_tokens", 128))
        pre, dec = Timing(), Timing()  # wall and process-CPU seconds per measured session
        state: dict = {}

        def do_prefill():
            state["cache"], state["tok"] = prefill(m.model, ids, policy, budget, chunk)

        def session(measured: bool = True):
            t_pre = time_call(do_prefill, ctx.device)
            state["kv_bytes"] = int(state["cache"].nbytes)
            t_dec = time_call(lambda: decode(m.model, state["cache"], state["tok"], n_new), ctx.device)
            state["kv_bytes_after_decode"] = int(state["cache"].nbytes)
            state["slots"] = [per_seq[0] for per_seq in state["cache"].stats()["slots"]]  # batch 1
            del state["cache"], state["tok"]
            if measured:
                pre.add(t_pre)
                dec.add(t_dec)

        for _ in range(int(self.opt("warmup", 1))):
            session(measured=False)
        peak = peak_memory_growth(session, ctx.device)
        for _ in range(self.repeats - 1):
            session()
        return {"status": "ok", "kv_bytes": state["kv_bytes"], "kv_bytes_after_decode": state["kv_bytes_after_decode"],
                "peak_bytes": int(peak), "prefill_s": pre.median, "prefill_cpu_s": pre.cpu_median,
                "decode_tok_s": n_new / dec.median, "decode_tok_s_cpu": n_new / max(dec.cpu_median, 1e-9),
                "prefill": pre.to_dict(), "decode": dec.to_dict(),
                "slots_layer0": state["slots"][0] if state["slots"] else None}

    def run(self, ctx: EvalContext) -> dict:
        from anchormass.bench.measure import memory_method

        rows = []
        series = self._series(ctx)
        steps = [(s, L) for s in series for L in self.lengths]
        dead: set[str] = set()
        for (name, m, policy, budget), L in progress(steps, ctx.progress, "profile"):
            row = {"series": name, "model": m.label, "policy": policy, "budget": budget, "length": L}
            if name in dead:
                rows.append({**row, "status": OOM, "note": "not run: OOM at a shorter length"})
                continue
            try:
                row.update(self._measure(ctx, m, policy, budget, L))
            except Exception as err:
                if not is_oom(err):
                    raise
                free_memory(ctx.device)
                dead.add(name)
                row.update(status=OOM, kv_bytes=OOM, peak_bytes=OOM, prefill_s=OOM, decode_tok_s=OOM)
            rows.append(row)
        return {"rows": rows, "series": [s[0] for s in series], "lengths": self.lengths,
                "memory_method": memory_method(ctx.device), "repeats": self.repeats,
                "decode_tokens": int(self.opt("decode_tokens", 128)), "items": rows,
                "summary": {f"{r['series']}/len{r['length']}/{k}": r[k] for r in rows if r["status"] == "ok"
                            for k in ("kv_bytes", "prefill_s", "decode_tok_s")}}

    def report(self, result: dict) -> str:
        names = result["series"]
        cell = {(r["series"], r["length"]): r for r in result["rows"]}
        head = (["length"] + [f"{n} KV MiB (peak GiB)" for n in names]
                + [f"prefill s, median ({' vs '.join(names)})", f"decode tok/s ({' vs '.join(names)})"])
        body = []
        for L in result["lengths"]:
            rs = [cell[(n, L)] for n in names]
            kv = [OOM if r["status"] != "ok" else f"{r['kv_bytes'] / MIB:,.2f} ({r['peak_bytes'] / GIB:.2f})"
                  for r in rs]
            pre = " vs ".join(OOM if r["status"] != "ok" else f"{r['prefill_s']:.3f}" for r in rs)
            dec = " vs ".join(OOM if r["status"] != "ok" else f"{r['decode_tok_s']:.1f}" for r in rs)
            body.append([f"{L:,}"] + kv + [pre, dec])
        note = (f"Batch 1; prefill = median wall time of {result['repeats']} after warm-up; decode = "
                f"{result['decode_tokens']} greedy tokens; KV = measured cache.nbytes after prefill; "
                f"peak memory: {result['memory_method']}. results.json also holds process-CPU times "
                "(closer to an idle machine's wall time when the host is shared).")
        return f"## Efficiency profile\n\n{markdown(head, body)}\n{note}\n"

    def plots(self, result: dict, out_dir: Path) -> list[str]:
        return [profile_chart(result, out_dir / "profile.png")]

    def scalars(self, result: dict) -> dict[str, float]:
        return {k: float(v) for k, v in result["summary"].items()}


def _num(v):
    return float(v) if isinstance(v, (int, float)) else np.nan  # "OOM" / None -> gap in the line


def profile_chart(result: dict, path: Path) -> str:
    """KV bytes / peak memory / prefill time / decode tok/s vs length, every model on one chart."""
    panels = [("kv_bytes", "KV cache (MiB)", MIB), ("peak_bytes", "peak memory growth (MiB)", MIB),
              ("prefill_s", "prefill time, median (s)", 1), ("decode_tok_s", "decode (tok/s)", 1)]
    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    series: dict[str, list[dict]] = {}
    for row in result["rows"]:
        series.setdefault(row["series"], []).append(row)
    for ax, (key, title, scale) in zip(axes, panels):
        for name, rows in series.items():
            xs = [r["length"] for r in rows]
            ys = [_num(r.get(key)) / scale for r in rows]
            ax.plot(xs, ys, marker="o", label=name)
            for x, r in zip(xs, rows):
                if r.get("status") not in (None, "ok"):
                    ax.annotate(r["status"], (x, 0), textcoords="offset points", xytext=(0, 4), fontsize=7)
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)  # sizes and rates: the zero line makes growth readable
        ax.set_xlabel("context length (tokens)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return save_figure(fig, path)
