"""The one entry point of the evaluation library: `run_evaluation(cfg) -> Path`.

Used by `evaluate.py`, by the training callbacks and by the curriculum's final report. Everything
that can be checked (models, tokenizer, data files, lengths) is checked before any suite runs;
outputs are written into a staging folder that is renamed into place only when the whole run
succeeded, so a failed run leaves no half-written results behind.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

from anchormass.dir_lock import DirLock
from anchormass.errors import ConfigError, DataError
from anchormass.eval import registry
from anchormass.eval.loading import load_models, load_tokenizer, resolve_device, resolve_dtype, tokenizer_path
from anchormass.eval.suite import EvalContext, EvalModel, Suite
from anchormass.own_files import (
    foreign,
    is_removable_staging,
    make_staging,
    publish_staging,
    recorded,
    remove_own_folder,
    remove_staging,
)
from anchormass.utils import atomic_write_json, atomic_write_text, code_version, git_state, sha256_file

RESULTS = "results.json"  # what makes a folder an evaluation's output (named in its record)


def to_plain(cfg: Any) -> dict:
    """DictConfig (resolved) or mapping -> plain dict."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)
    return dict(cfg)


def suite_list(cfg: dict) -> tuple[list[str], bool]:
    """(names, is_all). `suite` may be a name, 'all', a comma list or a list."""
    spec = cfg.get("suite") or "all"
    names = spec if isinstance(spec, list) else [s.strip() for s in str(spec).split(",") if s.strip()]
    if names == ["all"]:
        return list(cfg.get("all_suites") or registry.all_suites()), True
    for n in names:
        registry.suite_class(n)  # unknown / missing -> ConfigError now
    return names, False


def _out_path(cfg: dict, names: list[str]) -> Path:
    if cfg.get("out_dir"):
        out = Path(str(cfg["out_dir"])).expanduser()
        # `.` / `..` have no name of their own to put the staging folder and the lock beside
        return Path(os.path.abspath(out)) if out.name in ("", "..") else out
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / "eval" / f"{stamp}-{'+'.join(names) if len(names) < 3 else 'all'}"


def claim_out_dir(out: Path) -> DirLock:
    """The out_dir belongs to one evaluation at a time (its staging folder too): a second one is
    refused in one line naming the first, before any model is loaded."""
    return DirLock(out.parent / f".{out.name}.lock", what=f"evaluation out_dir {out}").acquire()


def _check_out_dir(cfg: dict, out: Path) -> Path:
    """Refuse, before anything loads, an out_dir the run could not publish to without deleting
    what is not its own: `overwrite=true` replaces only an earlier evaluation's output, in full."""
    if out.is_symlink():
        raise ConfigError(f"out_dir {out} is a symbolic link; give the folder itself")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out_dir {out} exists and is not a folder")
    if out.exists() and any(out.iterdir()):
        if not cfg.get("overwrite", False):
            raise ConfigError(f"out_dir {out} already exists and is not empty (pass overwrite=true)")
        if RESULTS not in recorded(out):
            raise ConfigError(f"out_dir {out} is not the output of an evaluation (overwrite=true replaces only "
                              f"those, and deletes nothing else; one from before such records: delete it "
                              f"yourself); choose another out_dir")
        others = foreign(out)
        if others:
            raise ConfigError(f"out_dir {out} holds files no evaluation wrote ({', '.join(others[:3])}"
                              f"{', ...' if len(others) > 3 else ''}); move them, or choose another out_dir")
    staging = _staging(out)
    if staging.exists() and not is_removable_staging(staging):
        raise ConfigError(f"{staging} is in the way of out_dir {out} and is not a staging folder of ours; move it")
    return out


def _data_dir(cfg: dict, tok_path: Path | None) -> Path | None:
    """`data_dir=`, else the tokenizer's own folder when it is a prepared dataset (has val.bin)."""
    if cfg.get("data_dir"):
        return Path(str(cfg["data_dir"])).expanduser()
    if tok_path is not None and (tok_path.parent / "val.bin").is_file():
        return tok_path.parent
    return None


def _model_info(m: EvalModel) -> dict:
    return {"label": m.label, "arch": m.arch, "source": m.source, "sha256": m.sha256,
            "n_params": sum(p.numel() for p in m.model.parameters()),
            "config": m.config.to_dict(),
            "max_context": m.max_context,
            "trained_lengths": m.hparams.get("trained_lengths"),
            "data_fingerprint": m.hparams.get("data_fingerprint")}


def versions() -> dict[str, str | None]:
    """Versions of the interpreter and of the libraries that shape the numbers."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("torch", "lightning", "numpy", "scipy"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def _plain_config(cfg: Any) -> dict:
    cfg = to_plain(cfg)
    try:
        cfg["seed"] = int(cfg.get("seed", 0))
    except (TypeError, ValueError):
        raise ConfigError(f"seed must be an integer, got {cfg.get('seed')!r}") from None
    return cfg


def _make_suites(names: list[str], eval_cfg: dict) -> list[Suite]:
    return [registry.make_suite(name, eval_cfg.get(name)) for name in names]


def _tokenizer(cfg: dict, models: list[EvalModel], suites: list[Suite], tokenizer: Any) -> tuple[Any, Path | None]:
    """The given tokenizer, else the configured / checkpoints' one (required only by suites that read text)."""
    if tokenizer is not None:
        return tokenizer, None
    try:
        tok_path = tokenizer_path(cfg, models)
    except DataError:
        if any(s.needs_tokenizer for s in suites):
            raise
        return None, None
    return (None if tok_path is None else load_tokenizer(tok_path, models)), tok_path


def _checked(suites: list[Suite], ctx: EvalContext, is_all: bool, skipped: dict[str, str]) -> list[Suite]:
    """Suites that apply, each checked (bad input -> one line) before anything runs or is written."""
    runnable = []
    for s in suites:
        reason = s.applies(ctx)
        if reason:
            if not is_all:
                raise ConfigError(f"suite '{s.name}': {reason}")
            skipped[s.name] = reason
            continue
        s.check(ctx)
        runnable.append(s)
    return runnable


def _run_suites(suites: list[Suite], ctx: EvalContext, plots_dir: Path) -> tuple[dict[str, dict], list[str]]:
    """Each suite's results and report section, models in eval mode (restored afterwards)."""
    results: dict[str, dict] = {}
    sections: list[str] = []
    was_training = [m.model.training for m in ctx.models]
    for m in ctx.models:
        m.model.eval()
    try:
        for s in suites:
            t0 = time.perf_counter()
            with torch.no_grad():
                res = s.run(ctx)
            res["runtime_s"] = time.perf_counter() - t0
            res["plots"] = s.plots(res, plots_dir)
            results[s.name] = res
            sections.append(s.report(res) + "".join(f"\n![{p}]({p})\n" for p in res["plots"]))
    finally:
        for m, flag in zip(ctx.models, was_training):
            m.model.train(flag)
    return results, sections


def _metadata(cfg: dict, names: list[str], is_all: bool, ctx: EvalContext, tok_path: Path | None,
              git: dict | None) -> dict:
    return {
        "suite": names if not is_all else "all",
        "created": _dt.datetime.now().isoformat(timespec="seconds"),
        "git_commit": code_version() if git is None else git["commit"] + ("-dirty" if git["dirty"] else ""),
        "git": git,
        "versions": versions(),
        "device": str(ctx.device),
        "dtype": str(next(ctx.models[0].model.parameters()).dtype).replace("torch.", ""),
        "models": [_model_info(m) for m in ctx.models],
        # the checksum of the bytes actually loaded (the file could be rebuilt during a long run)
        "tokenizer": None if tok_path is None else {"path": str(tok_path.resolve()),
                                                     "sha256": getattr(ctx.tokenizer, "checksum", None)},
        "data": ctx.data,
        "config": cfg,
    }


def _staging(out_dir: Path) -> Path:
    return out_dir.parent / f".{out_dir.name}.partial"


def _publish(out_dir: Path, write) -> None:
    """Run `write(staging)` into `.<name>.partial` and rename it into place only when it succeeded.
    Deletes only its own staging folders and, with overwrite=true, an earlier evaluation's output as
    its record names it (both checked by _check_out_dir; anchormass/own_files.py)."""
    staging = _staging(out_dir)
    if staging.exists() and not remove_staging(staging):
        raise ConfigError(f"{staging} is not a staging folder of ours; move it")
    make_staging(staging)
    try:
        write(staging)
        publish_staging(staging)
        if out_dir.exists():
            remove_own_folder(out_dir)  # empty, or an earlier evaluation's output (overwrite=true)
        staging.rename(out_dir)
    except BaseException:
        remove_staging(staging)
        raise


def run_evaluation(cfg: Any, models: list[EvalModel] | None = None, tokenizer: Any = None) -> Path:
    """Run the suites `cfg` asks for and write results.json, report.md and plots.

    cfg: the composed evaluate config (DictConfig or dict; see configs/evaluate.yaml).
    models / tokenizer: already-built objects (training callbacks pass the live model); when
    None they are loaded from cfg. Returns the output folder.
    """
    cfg = _plain_config(cfg)
    git = git_state()  # the code as it is loaded now, not as the tree is when a long run ends
    names, is_all = suite_list(cfg)
    out_dir = _out_path(cfg, names)
    from anchormass.path_checks import check_not_link
    check_not_link(out_dir, "out_dir")  # before any model loads: publishing cannot replace a link
    with claim_out_dir(out_dir):  # checked before models load: a refusal costs no loading time
        _check_out_dir(cfg, out_dir)
        return _evaluate(cfg, names, is_all, git, out_dir, models, tokenizer)


def _evaluate(cfg: dict, names: list[str], is_all: bool, git: Any, out_dir: Path, models: list[EvalModel] | None,
              tokenizer: Any) -> Path:
    device = resolve_device(cfg.get("device"))
    if models is None:
        models = load_models(cfg, device, resolve_dtype(cfg.get("dtype")))
    else:
        device = next(models[0].model.parameters()).device
    suites, skipped = _make_suites(names, cfg.get("eval") or {}), {}
    tokenizer, tok_path = _tokenizer(cfg, models, suites, tokenizer)

    data: dict[str, dict] = {}

    def record_data(name: str, path: str | Path) -> None:
        path = Path(path)
        if name not in data:
            data[name] = {"path": str(path.resolve()), "sha256": sha256_file(path) if path.is_file() else None}

    ctx = EvalContext(models=models, tokenizer=tokenizer, device=device, seed=cfg["seed"],
                      progress=bool(cfg.get("progress", True)), data=data, record_data=record_data,
                      data_dir=_data_dir(cfg, tok_path))
    runnable = _checked(suites, ctx, is_all, skipped)

    def write(staging: Path) -> None:
        results, sections = _run_suites(runnable, ctx, staging)
        results.update({name: {"skipped": reason} for name, reason in skipped.items()})
        meta = _metadata(cfg, names, is_all, ctx, tok_path, git)
        atomic_write_json(staging / RESULTS, {**meta, "suites": results})
        atomic_write_text(staging / "report.md", _report(meta, sections, skipped))

    _publish(out_dir, write)
    return out_dir


def _report(meta: dict, sections: list[str], skipped: dict[str, str]) -> str:
    lines = ["# AnchorMass evaluation", "",
             f"- created: {meta['created']}; git commit: `{meta['git_commit']}`; device: {meta['device']}, "
             f"dtype: {meta['dtype']}", ""]
    lines += ["- " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()), ""]
    lines += ["| model | arch | parameters | source | sha256 |", "| --- | --- | ---: | --- | --- |"]
    for m in meta["models"]:
        lines.append(f"| {m['label']} | {m['arch']} | {m['n_params']:,} | `{m['source']}` | "
                     f"`{(m['sha256'] or '-')[:16]}` |")
    lines.append("")
    if meta["data"]:
        lines += ["| data | file | sha256 |", "| --- | --- | --- |"]
        lines += [f"| {name} | `{d['path']}` | `{(d['sha256'] or '-')[:16]}` |" for name, d in meta["data"].items()]
        lines.append("")
    for name, reason in skipped.items():
        lines.append(f"- suite `{name}` skipped: {reason}")
    if skipped:
        lines.append("")
    return "\n".join(lines) + "\n" + "\n".join(sections)
