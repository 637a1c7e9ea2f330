"""One report over several training seeds: the same comparison's results.json, one per seed (or
several for one seed, where its suite can merge runs scored in parts on identical items).

    python -m anchormass.eval.aggregate out_dir=runs/x/report/longctx \
        inputs=[runs/x/report/longctx/seed0/results.json,runs/x/report/longctx/seed1/results.json] seeds=[0,1]

A suite may define a classmethod `aggregate(per_seed_results, seeds) -> {"markdown": str,
"plots": callable(out_dir) -> [file names] (optional), "json": ... (optional)}` to summarise its
own results across seeds; every other suite gets the generic table: each summary scalar's mean,
sample standard deviation, n, min and max over the seeds. One seed's run says little about a
difference between two models that is smaller than the spread between seeds; the table shows both.
Writes report.md and results.json into out_dir (the scripts/run_curriculum.py entry folder).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

from anchormass.cli import exit_on_error
from anchormass.errors import ConfigError, DataError
from anchormass.eval import registry
from anchormass.eval.report import scalar_stats
from anchormass.utils import atomic_write_json, atomic_write_text


def _scalar(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def generic_aggregate(name: str, per_seed: list[dict], seeds: list[int]) -> dict:
    """Every summary scalar over the seeds that have it (a finite number), as a Markdown table."""
    keys: list[str] = []
    for res in per_seed:
        keys += [k for k in (res.get("summary") or {}) if k not in keys]
    stats, lines = {}, [f"## {name}", "", "| metric | mean ± std | n | min | max | per seed |",
                        "| --- | ---: | ---: | ---: | ---: | --- |"]
    for k in keys:
        by_seed = {s: r["summary"][k] for s, r in zip(seeds, per_seed) if _scalar((r.get("summary") or {}).get(k))}
        if not by_seed:
            continue
        st = stats[k] = {**scalar_stats(list(by_seed.values())), "per_seed": {str(s): v for s, v in by_seed.items()}}
        std = "-" if st["std"] is None else f"{st['std']:.4g}"
        lines.append(f"| {k} | {st['mean']:.4g} ± {std} | {st['n']} | {st['min']:.4g} | {st['max']:.4g} | "
                     + ", ".join(f"{s}: {v:.4g}" for s, v in by_seed.items()) + " |")
    if not stats:
        lines.append("| (no summary scalars) | | | | | |")
    return {"markdown": "\n".join(lines) + "\n", "json": {"summary": stats}}


def merge_seed_runs(results: list[dict], seeds: list[int]) -> tuple[list[dict], list[int]]:
    """One results dict per distinct seed. Several runs of one seed (a study scored its cells in
    parts, on identical items) are merged by each suite's `merge(results) -> result` classmethod;
    a suite without one cannot say whether two runs of a seed overlap, so that is refused."""
    order = list(dict.fromkeys(seeds))
    if len(order) == len(seeds):
        return results, seeds
    merged = []
    for seed in order:
        runs = [r for r, s in zip(results, seeds) if s == seed]
        if len(runs) == 1:
            merged.append(runs[0])
            continue
        names = list(dict.fromkeys(n for r in runs for n in (r.get("suites") or {})))
        suites = {}
        for name in names:
            hook = getattr(registry.suite_class(name), "merge", None) if name in registry.SUITES else None
            if hook is None:
                raise ConfigError(f"aggregate: seeds must be distinct unless every suite of their runs can merge "
                                  f"one seed's runs ({name} cannot), got {seeds}")
            parts = [r["suites"][name] for r in runs if name in (r.get("suites") or {})]
            suites[name] = hook(parts) if len(parts) > 1 else parts[0]
        merged.append({"suites": suites})
    return merged, order


def aggregate(results: list[dict], seeds: list[int]) -> dict:
    """{"seeds", "suites": {name: {"markdown", "json", "plots"?}}, "missing": {name: reason}}
    for the per-seed results.json contents `results` (in the order of `seeds`; a seed given more
    than once is merged first, see merge_seed_runs)."""
    if len(results) != len(seeds) or not seeds:
        raise ConfigError(f"aggregate: {len(results)} results for {len(seeds)} seeds; give one per seed")
    results, seeds = merge_seed_runs(results, list(seeds))
    names: list[str] = []
    for res in results:
        names += [n for n in (res.get("suites") or {}) if n not in names]
    suites, missing = {}, {}
    for name in names:
        per_seed = [(res.get("suites") or {}).get(name) for res in results]
        absent = [s for s, r in zip(seeds, per_seed) if r is None or "skipped" in r]
        if absent:  # a mean over a different set of seeds per suite would read as comparable when it is not
            missing[name] = f"not run for seed(s) {', '.join(map(str, absent))}"
            continue
        hook = getattr(registry.suite_class(name), "aggregate", None) if name in registry.SUITES else None
        suites[name] = hook(per_seed, seeds) if hook is not None else generic_aggregate(name, per_seed, seeds)
    return {"seeds": list(seeds), "suites": suites, "missing": missing}


def _read(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"aggregate: no results file {path}") from None
    except (OSError, ValueError) as err:
        raise DataError(f"aggregate: cannot read {path}: {err}") from None
    if not isinstance(data, dict):
        raise DataError(f"aggregate: {path} does not hold an evaluation's results (a JSON object)")
    return data


def check_distinct(paths: list[Path]) -> None:
    """Each input is its own file: one given twice (by the same name, a link or another path to it)
    would count one seed's result as two, a spread of zero over "n = 2"."""
    for i, path in enumerate(paths):
        for earlier in paths[:i]:
            try:
                same = path.samefile(earlier)
            except OSError:  # a missing file: _read names it
                same = False
            if same:
                also = "" if str(path) == str(earlier) else f" (as {earlier})"
                raise ConfigError(f"aggregate: {path} is given twice{also}; each seed's results must be its "
                                  f"own run's file")


def write_aggregate(result_paths: list[Path], seeds: list[int], out_dir: Path, note: str | None = None) -> Path:
    """Aggregate the per-seed results.json files into out_dir/report.md and results.json.
    `note`: a line under the title (the curriculum says which run is which: two variants of one
    preset carry the same model name in the per-seed reports)."""
    paths = [Path(p) for p in result_paths]
    check_distinct(paths)
    agg = aggregate([_read(p) for p in paths], list(seeds))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = ["# AnchorMass evaluation over training seeds", "", *([f"- {note}"] if note else []),
             f"- seeds: {', '.join(map(str, agg['seeds']))} (n = {len(agg['seeds'])}); std is the sample "
             f"standard deviation over the seeds", ""]
    reports = [_shown(p.with_name(p.name.replace("results.json", "report.md")), out_dir) for p in paths]
    lines += [f"- seed {s}: [{r}]({r})" for s, r in zip(seeds, reports)]
    lines.append("")
    lines += [f"- suite `{name}` left out: {reason}" for name, reason in agg["missing"].items()]
    sections, plain = [], {}
    for name, res in agg["suites"].items():
        plots = list(res["plots"](out_dir)) if callable(res.get("plots")) else []
        sections.append(res["markdown"] + "".join(f"\n![{p}]({p})\n" for p in plots))
        plain[name] = {"json": res.get("json"), "plots": plots}
    atomic_write_json(out_dir / "results.json", {"seeds": agg["seeds"], "inputs": [str(p) for p in paths],
                                                 "missing": agg["missing"], "suites": plain}, indent=2)
    atomic_write_text(out_dir / "report.md", "\n".join(lines) + "\n" + "\n".join(sections))
    return out_dir


def _shown(path: Path, base: Path) -> str:
    """`path` relative to the report's folder (`../seed0/report.md` from a sibling folder), so the
    links work from the report and survive moving the tree they are in."""
    return os.path.relpath(path.resolve(), base.resolve())


def _parse_args(argv: list[str]) -> dict:
    """key=value arguments; lists as [a,b]. Only out_dir, inputs and seeds."""
    known, out = ("out_dir", "inputs", "seeds"), {}
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq or key not in known:
            raise ConfigError(f"aggregate: expected {'=..., '.join(known)}=..., got {arg!r}")
        out[key] = [v.strip() for v in value.strip("[]").split(",") if v.strip()] if key != "out_dir" else value
    missing = [k for k in known if not out.get(k)]
    if missing:
        raise ConfigError(f"aggregate: missing {', '.join(missing)} (usage: out_dir=<dir> inputs=[a,b] seeds=[0,1])")
    try:
        out["seeds"] = [int(s) for s in out["seeds"]]
    except ValueError:
        raise ConfigError(f"aggregate: seeds must be integers, got {out['seeds']}") from None
    return out


@exit_on_error
def main(argv: list[str]) -> None:
    args = _parse_args(argv)
    out = write_aggregate(args["inputs"], args["seeds"], Path(args["out_dir"]))
    print(f"report: {out / 'report.md'}")


if __name__ == "__main__":
    main(sys.argv[1:])
