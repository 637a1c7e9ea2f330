"""A rerun against a changed recipe: never credit a stage to settings it was not trained with.

Each stage records the train.py arguments it started with (execute.ARGS_FILE). Before anything runs,
every stage that is finished or resumable is compared with what the recipe gives now; a stage
whose settings differ (steps, lr, data, length, model fields, ...) is refused in one line naming the
keys, unless the command says what to do (`changed=`):

- `refuse` (default): one `error:` line, exit 2, nothing touched;
- `retrain`: that stage and every stage that starts from it (in its chain or another model's) are
  trained again; their old folders are moved aside to `<folder>.replaced-<n>`, never deleted;
- `keep`: the old runs stand, and each is named in a `note:` line.

Keys that only change what is shown or logged (console, logger, callbacks, the run folder) are not
settings of the run, nor is the thread count: it changes how fast a stage runs and the order of
floating-point sums, as another machine would, not what it trains. The plan itself varies it with
`curriculum.parallel`, so a rerun on more or fewer cores must not be refused for it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from anchormass.curriculum.execute import ARGS_FILE, StageRun
from anchormass.errors import ConfigError
from anchormass.training.stage_console import shown

POLICIES = ("refuse", "retrain", "keep")
# argument keys that change no result of a stage (what is shown or logged, and the thread count)
DISPLAY_KEYS = ("hydra.run.dir", "verbose", "hydra/job_logging", "trainer.enable_progress_bar", "logger",
                "callbacks", "++callbacks.progress_file._target_", "torch_threads")


def settings(args: list[str]) -> dict[str, str]:
    """key -> value of a train.py argument list, without the keys that change nothing trained."""
    out = {}
    for arg in args:
        key, _, value = arg.partition("=")
        if not key.lstrip("+~").startswith(DISPLAY_KEYS):
            out[key] = value
    return out


def recorded(run: StageRun) -> list[str] | None:
    path = run.out_dir / ARGS_FILE
    if not path.is_file():
        return None
    try:
        args = json.loads(path.read_text(encoding="utf-8")).get("args")
    except (OSError, ValueError, AttributeError):
        return None
    return [str(a) for a in args] if isinstance(args, list) else None


def differences(old: list[str], new: list[str]) -> list[str]:
    """`key: old -> new` for each setting that differs (absent on one side: `-`)."""
    a, b = settings(old), settings(new)
    return [f"{k}: {a.get(k, '-')} -> {b.get(k, '-')}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def changed_runs(runs: list[StageRun]) -> list[tuple[StageRun, list[str]]]:
    """Finished or resumable stages whose recorded arguments differ from the plan's."""
    out = []
    for run in runs:
        if run.shared_from is not None or not (run.is_done() or run.last_ckpt.is_file()):
            continue
        old = recorded(run)
        diff = differences(old, run.args) if old is not None else []
        if diff:
            out.append((run, diff))
    return out


def downstream(runs: list[StageRun], roots: list[StageRun]) -> list[StageRun]:
    """`roots` and every run that starts, directly or not, from one of them, in plan order."""
    hit = {id(r) for r in roots}
    by_ckpt = {r.last_ckpt: r for r in runs if r.shared_from is None}
    for run in runs:  # the plan lists a run after the run it starts from
        parent = by_ckpt.get(run.init_from) if run.init_from is not None else None
        if parent is not None and id(parent) in hit or run.shared_from is not None and id(run.shared_from) in hit:
            hit.add(id(run))
    return [r for r in runs if id(r) in hit]


def set_aside(folder: Path) -> Path:
    n = 1
    while folder.with_name(f"{folder.name}.replaced-{n}").exists():
        n += 1
    target = folder.with_name(f"{folder.name}.replaced-{n}")
    folder.rename(target)
    return target


def check_changes(runs: list[StageRun], policy: str) -> None:
    """Refuse, retrain or keep the stages a changed recipe no longer describes (see the module doc)."""
    if policy not in POLICIES:
        raise ConfigError(f"changed must be one of {', '.join(POLICIES)}, got {policy!r}")
    changed = changed_runs(runs)
    if not changed:
        return
    if policy == "refuse":
        run, diff = changed[0]
        more = f" (and {len(changed) - 1} more stage(s))" if len(changed) > 1 else ""
        raise ConfigError(f"{shown(run.out_dir)} was trained with other settings than the recipe gives now "
                          f"({'; '.join(diff)}){more}; rerun with changed=retrain to train it and the stages "
                          f"after it again (old folders kept aside), or changed=keep to keep the old runs")
    if policy == "keep":
        for run, diff in changed:
            print(f"note: keeping {shown(run.out_dir)}, trained with other settings ({'; '.join(diff)})",
                  file=sys.stderr)
        return
    for run in downstream(runs, [r for r, _ in changed]):
        if run.shared_from is None and run.out_dir.exists():
            print(f"note: {shown(run.out_dir)} moved to {shown(set_aside(run.out_dir))}; it trains again",
                  file=sys.stderr)
