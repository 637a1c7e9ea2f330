"""A rerun against a changed recipe: never credit a stage to settings it was not trained with.

Each stage records what it started with (runs/layout.py: STAGE_ARGS_FILE): its composed train config and its
data folder's fingerprint (stage_identity.py). Before anything runs, every stage that is finished
or resumable is compared with what the recipe, the config files and the data give now; a stage
whose settings differ (steps, lr, data, length, model fields, a preset file, a default of
configs/train.yaml, a data folder prepared again, a checkpoint file it starts from replaced:
start_files.py, ...) is refused in one line naming the keys, unless
the command says what to do (`changed=`). A stage whose record is missing, unreadable or older than
these records is not known to be the same, and is treated as changed (never skipped):

- `refuse` (default): one `error:` line, exit 2, nothing touched;
- `retrain`: that stage and every stage that starts from it (in its chain or another model's) are
  trained again; their old folders are moved aside to `<folder>.replaced-<n>`, never deleted;
- `keep`: the old runs stand, and each is named in a `note:` line.

Keys that only change what is shown or logged (console, logger, callbacks, the run folder) are not
settings of the run, nor is the thread count (runs/run_settings.py): it changes how fast a
stage runs and the order of floating-point sums, as another machine would, not what it trains. The
plan itself varies it with `curriculum.parallel`, so a rerun on more or fewer cores must not be
refused for it.

The check runs twice: the configs before any data is prepared (a refusal comes before hours of
preparation), the data folders' fingerprints once every folder the recipe reads is prepared.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from anchormass.curriculum.execute import StageRun
from anchormass.curriculum.stage_identity import data_fingerprint, identify
from anchormass.curriculum.start_files import start_differences
from anchormass.errors import ConfigError
from anchormass.runs.layout import STAGE_ARGS_FILE, stage_args_file
from anchormass.runs.run_settings import setting_differences
from anchormass.runs.stage_console import shown

POLICIES = ("refuse", "retrain", "keep")


def recorded(run: StageRun) -> dict | None:
    """The stage's record, None when it is missing or unreadable."""
    try:
        record = json.loads(stage_args_file(run.out_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def config_differences(record: dict | None, run: StageRun) -> list[str]:
    """How the stage's recorded config differs from the one composed now (or why it is not known)."""
    if record is None:
        return [f"its record {STAGE_ARGS_FILE} is missing or unreadable, so what it was trained with is not known"]
    if not isinstance(record.get("settings"), dict):
        return [f"its {STAGE_ARGS_FILE} records only its arguments (written before configs were recorded), so "
                f"whether its preset or default files changed is not known"]
    if run.settings is None:
        return [run.unknown or "its config is not known now"]
    now = json.loads(json.dumps(run.settings))
    return setting_differences(record["settings"], now) + start_differences(record, run)


def data_differences(record: dict | None, run: StageRun) -> list[str]:
    """Whether the data folder the stage reads is the one it was trained on (its fingerprint)."""
    if record is None or not isinstance(record.get("settings"), dict):
        return []  # the config check named it already
    before = (record.get("data") or {}).get("fingerprint") if isinstance(record.get("data"), dict) else None
    now = data_fingerprint(run.data_dir)
    if before is None or before != now:
        return [f"data folder {shown(run.data_dir) if run.data_dir else '?'}: fingerprint "
                f"{str(before)[:12] if before else 'not recorded'} -> {now[:12] if now else 'none readable'}"]
    return []


def changed_runs(runs: list[StageRun], check) -> list[tuple[StageRun, list[str]]]:
    """Finished or resumable stages for which `check(record, run)` names differences."""
    ran = [r for r in runs if r.shared_from is None and (r.is_done() or r.last_ckpt.is_file())]
    identify(ran)
    out = []
    for run in ran:
        diff = check(recorded(run), run)
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


def check_changes(runs: list[StageRun], policy: str, data: bool = False) -> None:
    """Refuse, retrain or keep the stages a changed recipe no longer describes (see the module doc):
    their configs, or with `data` their data folders (once those are prepared)."""
    if policy not in POLICIES:
        raise ConfigError(f"changed must be one of {', '.join(POLICIES)}, got {policy!r}")
    changed = changed_runs(runs, data_differences if data else config_differences)
    if not changed:
        return
    if policy == "refuse":
        run, diff = changed[0]
        more = f" (and {len(changed) - 1} more stage(s))" if len(changed) > 1 else ""
        raise ConfigError(f"{shown(run.out_dir)} does not match what the recipe gives now "
                          f"({'; '.join(diff)}){more}; rerun with changed=retrain to train it and the stages "
                          f"after it again (old folders kept aside), or changed=keep to keep the old runs")
    if policy == "keep":
        for run, diff in changed:
            print(f"note: keeping {shown(run.out_dir)}, which does not match the recipe ({'; '.join(diff)})",
                  file=sys.stderr)
        return
    for run in downstream(runs, [r for r, _ in changed]):
        if run.shared_from is None and run.out_dir.exists():
            print(f"note: {shown(run.out_dir)} moved to {shown(set_aside(run.out_dir))}; it trains again",
                  file=sys.stderr)
