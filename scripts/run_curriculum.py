"""Run a whole training curriculum for both models, then the comparison report.

    python scripts/run_curriculum.py                      # the miniature (configs/curriculum/mini.yaml)
    python scripts/run_curriculum.py curriculum=full_158m trainer=ddp trainer.devices=8

Options: curriculum=<name|path.yaml>, models=<a,b>, runs_root=<dir> (default runs), evaluate=false,
parallel=<n> (models trained side by side; default from the curriculum file).
Every other `key=value` goes to each train.py call. Rerunning the same command resumes.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from anchormass.cli import exit_on_error  # noqa: E402
from anchormass.utils import atomic_write_json  # noqa: E402
from anchormass.errors import ConfigError, DataError  # noqa: E402
from anchormass.training.curriculum import REPO_ROOT, StageRun, datasets, execute, load_curriculum, plan  # noqa: E402

OPTIONS = ("curriculum", "models", "runs_root", "evaluate", "parallel")


def parse(argv: list[str]) -> tuple[dict, list[str]]:
    opts, extra = {}, []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq:
            raise ConfigError(f"arguments are key=value, got {arg!r}")
        (opts.__setitem__(key, value) if key in OPTIONS else extra.append(arg))
    return opts, extra


def prepare_data(cfg) -> None:
    """Prepare each dataset the curriculum reads whose folder is missing (the demo ones: seconds)."""
    for args, folder in datasets(cfg):
        if (folder / "meta.json").is_file():
            continue
        print(f"preparing {folder} ({' '.join(args)}) ...", flush=True)
        rc = subprocess.call([sys.executable, str(REPO_ROOT / "scripts" / "prepare_data.py"), *args], cwd=REPO_ROOT)
        if rc != 0:
            raise DataError(f"preparing {folder} failed (exit {rc})")


def evaluate(cfg, runs: list[StageRun], root: Path) -> list[str]:
    """The closing comparison: models[0] vs models[1] at each listed stage, via evaluate.py."""
    if not (REPO_ROOT / "evaluate.py").is_file():
        print("evaluate.py not found: skipping the comparison report")
        return []
    reports = []
    by_key = {(r.model, r.stage): r for r in runs}
    for entry in cfg.get("evaluate") or []:
        a, b = (by_key[(str(m), entry.stage)] for m in cfg.models[:2])
        out = root / str(cfg.name) / "report" / str(entry.name)
        cmd = [sys.executable, str(REPO_ROOT / "evaluate.py"), f"ckpt={a.last_ckpt}", f"compare_ckpt={b.last_ckpt}",
               f"out_dir={out}", "overwrite=true", *list(entry.get("overrides") or [])]
        print(f"[report] {entry.name}: {' '.join(cmd[2:])}", flush=True)
        rc = subprocess.call(cmd, cwd=REPO_ROOT)
        if rc != 0:
            raise SystemExit(rc)
        reports.append(str(out / "report.md"))
    return reports


@exit_on_error
def main(argv: list[str]) -> None:
    t0 = time.perf_counter()
    opts, extra = parse(argv)
    cfg = load_curriculum(opts.get("curriculum", "mini"))
    if "models" in opts:
        cfg.models = opts["models"].split(",")
    root = Path(opts.get("runs_root", "runs"))
    parallel = str(opts.get("parallel", cfg.get("parallel", 1)))
    if not parallel.isdigit():
        raise ConfigError(f"parallel must be a whole number of models, got {parallel!r}")
    parallel = int(parallel)
    do_eval = opts.get("evaluate", "true").lower() != "false"
    if do_eval and cfg.get("evaluate") and len(cfg.models) < 2:  # refuse now, not after the training
        raise ConfigError(f"the closing comparison needs two models, got models={','.join(map(str, cfg.models))}; "
                          f"pass models=a,b or evaluate=false")
    prepare_data(cfg)
    runs = plan(cfg, root, extra)
    summary = execute(runs, log=lambda msg: print(msg, flush=True), parallel=parallel)
    reports = evaluate(cfg, runs, root) if do_eval else []
    wall = time.perf_counter() - t0
    atomic_write_json(root / str(cfg.name) / "curriculum.json",
               {"curriculum": str(cfg.name), "wall_time_s": round(wall, 1), "stages": summary, "reports": reports}, sort_keys=True, indent=2)
    print(f"\n{'model':<20} {'stage':<14} {'step':>6} {'train loss':>11} {'val loss':>9}")
    for row in summary:
        fmt = lambda x: f"{x:.4f}" if isinstance(x, float) else "-"  # noqa: E731
        print(f"{row['model']:<20} {row['stage']:<14} {row['global_step'] or 0:>6} "
              f"{fmt(row['train_loss']):>11} {fmt(row['val_loss']):>9}")
    print(f"curriculum {cfg.name}: {wall:.0f} s; summary {root / str(cfg.name) / 'curriculum.json'}")
    for r in reports:
        print(f"report: {r}")


if __name__ == "__main__":
    main(sys.argv[1:])
