"""Human- and machine-readable output of one bench run: text/Markdown tables, JSON, PNG."""

from __future__ import annotations

import io
import os
from pathlib import Path

from anchormass.bench.targets import cache_rows
from anchormass.utils import atomic_write_bytes, atomic_write_json, atomic_write_text

MiB = 2**20


def _fmt(x, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table whose columns are padded, so it also reads well on a terminal."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows]


def _v(row: dict, key: str, spec: str) -> str:
    return row["status"] if row.get("status") != "ok" else _fmt(row.get(key), spec)


def _times(key: str, spec: str):
    return lambda r, res: " ".join(format(t, spec) for t in r.get(key, []))


def _key(key: str):
    return lambda r, res: r[key]


def _value(key: str, spec: str):
    return lambda r, res: _v(r, key, spec)


_MODEL, _LENGTH, _CACHE = _key("model"), _key("length"), (lambda r, res: _cache_mib(r))
_BUDGET, _SLOTS = (lambda r, res: _budget(r, res)), (lambda r, res: _slots(r))


# Per section: column header -> cell(row, result). One table layout, four measured sections.
COLUMNS = {
    "prefill": {
        "model": _MODEL, "tokens": _LENGTH, "budget": _BUDGET, "median s": _value("median_s", ".3f"),
        "all s": _times("times_s", ".3f"), "CPU median s": _value("cpu_median_s", ".3f"), "cache MiB": _CACHE,
        "slots/layer": _SLOTS},
    "train": {
        "model": _MODEL, "batch x seq": lambda r, res: f"{r['batch']} x {r['length']}",
        "median s": _value("median_s", ".3f"), "all s": _times("times_s", ".3f"),
        "tokens/s": _value("tokens_per_s", ".0f"), "CPU median s": _value("cpu_median_s", ".3f")},
    "decode": {
        "model": _MODEL, "context": _LENGTH, "budget": _BUDGET, "ms/token": _value("ms_per_token", ".2f"),
        "windows": _times("windows_ms_per_token", ".2f"), "CPU ms/token": _value("cpu_ms_per_token", ".2f"),
        "cache MiB": _CACHE, "slots/layer": _SLOTS},
    "memory": {
        "model": _MODEL, "tokens": _LENGTH, "budget": _BUDGET,
        "peak growth MiB": lambda r, res: _mib(r, "peak_bytes", ".1f"), "cache MiB": _CACHE,
        "session s": _value("seconds", ".1f")},
}


def _titles(result: dict) -> dict[str, str]:
    cfg = result["config"]
    return {
        "prefill": f"Prefill (chunk {cfg['chunk']}; median of {cfg['repeats']} interleaved repeats, "
                   f"{cfg['warmup']} warm-up before the first length)",
        "train": "Training step (forward + loss + backward, no optimizer update; tokens/s from the median)",
        "decode": f"Decode (greedy; ms/token = mean over a {_window(result)}-token window, median of "
                  f"{cfg['decode_windows']} windows after one warm-up window)",
        "memory": f"Session peak memory ({result['memory_method']})",
    }


def render(result: dict, target_rows: list[dict]) -> str:
    cfg = result["config"]
    out = [f"# AnchorMass vs Standard benchmark ({cfg['standard']} vs {cfg['anchormass']}, {result['device']}, "
           f"{cfg['dtype']}, torch {result['torch']}, {result['threads']} threads)", ""]
    busy = _busy_note(result)
    out += [busy, ""] if busy else []
    out += ["## Targets (ratios measured side by side in this run)", ""]
    out += markdown_table(["target", "bound", "measured", "result", "same ratio on CPU time"],
                  [[t["what"], t["target"], _fmt(t["measured"], ".3f"), t["status"],
                    _fmt(t.get("measured_cpu_time"), ".3f") if t.get("timed", True) else "-"]
                   for t in target_rows])
    for section, title in _titles(result).items():
        cols = COLUMNS[section]
        out += ["", f"## {title}", ""]
        rows = [[cell(r, result) for cell in cols.values()] for r in result.get(section, [])]
        out += markdown_table(list(cols), rows)
    out += ["", "## Measured cache bytes (cache.nbytes at the end of each session)", ""]
    crow = []
    for model in ("standard", "anchormass"):
        for r in sorted(cache_rows(result, model), key=lambda r: (str(r["budget"]), r["length"], r["section"])):
            crow.append([model, r["section"], r["length"], r["tokens"], _budget(r, result), f"{r['nbytes']:,}"])
    out += markdown_table(["model", "session", "prompt", "tokens seen", "budget", "bytes"], crow)
    out += ["", f"total bench time {result['elapsed_s']:.0f} s wall, {result['cpu_elapsed_s']:.0f} s process CPU; "
            f"load average (1/5/15 min) {result['load_avg_start']} at start, {result['load_avg_end']} at end "
            f"on {os.cpu_count()} CPUs", ""]
    return "\n".join(out)


def _busy_note(result: dict) -> str | None:
    """A warning when other processes competed for the CPUs: then wall-clock ratios are noisy."""
    loads = [x[0] for x in (result.get("load_avg_start"), result.get("load_avg_end")) if x]
    cpus = os.cpu_count() or 1
    if result["device"] != "cpu" or not loads or max(loads) <= 0.75 * cpus:
        return None
    return (f"> NOTE: load average reached {max(loads):.1f} on {cpus} CPUs: other processes competed for the "
            f"cores, so wall-clock times are inflated and noisy; the CPU-time column shows the same ratios "
            f"measured on process CPU time (closest to an idle machine with threads=1).")


def _budget(row: dict, result: dict) -> str:
    """Slots for AnchorMass (the model default when none was given); '-' for the dense Standard cache."""
    if row["model"] != "anchormass":
        return "-"
    if row["budget"] is None:
        return f"{result['models']['anchormass']['slot_budget']} (default)"
    return str(row["budget"])


def _mib(row: dict, key: str, spec: str) -> str:
    return row["status"] if row.get("status") != "ok" else format(row[key] / MiB, spec)


def _cache_mib(row: dict) -> str:
    return format(row["cache"]["nbytes"] / MiB, ".2f") if "cache" in row else row.get("status", "n/a")


def _window(result: dict) -> int:
    return result["models"]["anchormass"]["block_size"]


def _slots(row: dict) -> str:
    slots = row.get("cache", {}).get("slots")
    if not slots or row["model"] != "anchormass":
        return "-"
    return f"{min(_flat(slots))}-{max(_flat(slots))}"


def _flat(x):
    return [v for s in x for v in _flat(s)] if isinstance(x, list) else [x]


def plot(result: dict, path: str | Path) -> Path:
    """Four panels against context length: prefill time, decode ms/token, cache MiB, peak MiB."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("prefill", "median_s", "prefill time (s)", 1.0),
              ("decode", "ms_per_token", "decode ms / token", 1.0),
              ("cache", "nbytes", "cache MiB (measured)", MiB),
              ("memory", "peak_bytes", "session peak growth MiB", MiB)]
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    for ax, (section, key, title, scale) in zip(axes, panels):
        for model, style in (("standard", "o-"), ("anchormass", "s-")):
            if section == "cache":
                pts = sorted({(r["tokens"], r["nbytes"]) for r in cache_rows(result, model)
                              if model == "standard" or r["budget"] == result["config"]["decode_budget"]})
            else:
                pts = sorted((r["length"], r[key]) for r in result[section]
                             if r["model"] == model and r.get("status") == "ok")
            if pts:
                ax.plot([p[0] for p in pts], [p[1] / scale for p in pts], style, label=model)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.1)  # from 0, so ratios read honestly; headroom for flat lines
        ax.set_xlabel("context tokens")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{result['config']['standard']} vs {result['config']['anchormass']} on {result['device']}")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())


def write_all(result: dict, target_rows: list[dict], out_dir: str | Path, stem: str = "bench") -> dict[str, Path]:
    out_dir = Path(out_dir)
    text = render(result, target_rows)
    return {
        "markdown": atomic_write_text(out_dir / f"{stem}.md", text),
        "json": atomic_write_json(out_dir / f"{stem}.json", {**result, "targets": target_rows}),
        "png": plot(result, out_dir / f"{stem}.png"),
    }
