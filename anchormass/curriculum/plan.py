"""The plan: every (seed, model, stage) run of a recipe as a structured record, and its checks.

`plan()` orders the runs (all stages of the first model, then the next model, then the next seed)
and chains each to the run whose last checkpoint seeds it, or to the checkpoint file the recipe names
(an imported model; curriculum/start_files.py). The models of one seed get the same
seed and data, so stage k feeds them identical batches and only the model differs. Every check
(init_from chains, shared stages, same-function lengths) reads these records; the records become
`train.py` command lines only in `train_args`, the one edge to the training code.

A stage marked `shared: true` is trained once, by the first model, and every other model starts
its next stages from that checkpoint. That is allowed only where the models are one function
(anchormass/models/equivalence.py: AnchorMass is the Standard model up to min(W, S + C) tokens)
and everything else about the stage is the same, so sharing changes nothing but the compute: the
miniature's 64-token stage 1 would otherwise be trained once per model to the same weights. The
shared run gets the cores the waiting chains leave idle.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from anchormass.cli import check_override_path
from anchormass.config_compose import compose_file
from anchormass.curriculum.execute import StageRun
from anchormass.curriculum.recipe import START_FILE_SUFFIX, ModelSpec, Recipe, StageSpec, is_start_file
from anchormass.errors import ConfigError
from anchormass.models import load_model_config
from anchormass.models.config import TENSOR_FIELDS
from anchormass.models.equivalence import same_function_len
from anchormass.runs.layout import last_checkpoint, seed_folder, stage_folder
from anchormass.runs.start_module import ACROSS_ARCH_FIELDS
from anchormass.utils import CONFIG_ROOT, resolve_path

DATA_CONFIG_DIR = CONFIG_ROOT / "data"
# Every stage runs with these: its complete output (all levels, no progress bar) goes to its log
# file, and its progress to a small file the runner shows as a live line.
STAGE_CONSOLE_ARGS = ["verbose=2", "hydra/job_logging=stdout", "trainer.enable_progress_bar=false",
                      "++callbacks.progress_file._target_=anchormass.runs.progress.ProgressFile"]
# scripts/run_curriculum.py's own settings; every other command-line override is for train.py.
RUNNER_KEYS = ("curriculum", "runs_root", "evaluate", "verbose", "changed")
# Hydra settings that belong to the stages: the launcher that runs each train.py (e.g. on Slurm).
STAGE_HYDRA_PREFIXES = ("hydra/launcher=", "hydra.launcher.")


@dataclass(eq=False)
class PlannedRun:
    """One model training one stage under one seed."""
    variant: ModelSpec
    entry: StageSpec
    seed: int | None
    out_dir: Path
    parent: "PlannedRun | None"  # the run whose last checkpoint seeds this one
    extra: tuple[str, ...] = ()  # the command line's train.py overrides, for every run
    shared_from: "PlannedRun | None" = None  # a shared stage: the first model's run, which trains it
    start_file: Path | None = None  # the checkpoint file that seeds it, when the recipe names one (no parent)

    @property
    def model(self) -> str:
        return self.variant.name

    @property
    def stage(self) -> str:
        return self.entry.key

    @property
    def last_ckpt(self) -> Path:
        return last_checkpoint(self.out_dir)


def plan(recipe: Recipe, runs_root: Path, extra: list[str] | tuple[str, ...] = ()) -> list[PlannedRun]:
    order = [s.key for s in recipe.stages]
    runs: list[PlannedRun] = []
    for seed in recipe.seed_list:
        base = seed_folder(runs_root / recipe.name, seed)
        owners: dict[str, PlannedRun] = {}  # shared stage -> the first model's run of it
        by_model: dict[str, dict[str, PlannedRun]] = {}  # this seed's runs so far, model -> stage -> run
        for variant in recipe.models:
            done = by_model.setdefault(variant.name, {})
            for entry in recipe.stages:
                if not variant.trains(entry.key, seed):
                    continue
                parent = start_run(recipe, variant, entry, seed, done, by_model, order)
                folder = stage_folder(base, variant.name, entry.key)
                run = PlannedRun(variant, entry, seed, folder, parent, tuple(extra),
                                 start_file=start_file(recipe, variant, entry))
                if parent is not None and parent.model != run.model:
                    check_same_tensors(recipe, parent, run)
                owner = owners.setdefault(entry.key, run) if entry.shared else run
                if owner is not run:
                    check_shared(recipe, owner, run)
                    run = PlannedRun(variant, entry, seed, owner.out_dir, None, tuple(extra), shared_from=owner)
                done[entry.key] = run
                runs.append(run)
    return runs


def start_run(recipe: Recipe, variant: ModelSpec, entry: StageSpec, seed: int | None,
              done: dict[str, PlannedRun], by_model: dict[str, dict[str, PlannedRun]],
              order: list[str]) -> PlannedRun | None:
    """The run whose last checkpoint seeds this stage: an earlier stage of the same model, or
    `<model>/<stage>` of a model listed before it (under the same seed); none for a checkpoint file."""
    ref = variant.start_of(entry)
    if ref is None or is_start_file(ref):
        return None
    where = f"curriculum {recipe.name}: {variant.name}'s stage {entry.key} starts from {ref}"
    if "/" not in ref:
        if ref not in done:
            raise ConfigError(f"curriculum {recipe.name}: stage {entry.key} starts from {ref}, which is "
                              f"not an earlier stage {variant.name} trains (order: {order})")
        return done[ref]
    model, stage = ref.split("/", 1)
    if model == variant.name:
        raise ConfigError(f"{where}: name its own stages without the model ({stage})")
    if model not in by_model:
        labels = [m.name for m in recipe.models]
        raise ConfigError(f"{where}, but {model} is not a model listed before {variant.name} "
                          f"(models: {labels}; a checkpoint file to start from ends in {START_FILE_SUFFIX})")
    if stage not in by_model[model]:
        raise ConfigError(f"{where}, but {model} does not train {stage}"
                          + (f" under seed {seed}" if seed is not None else "")
                          + f" (it trains {list(by_model[model])})")
    return by_model[model][stage]


def start_file(recipe: Recipe, variant: ModelSpec, entry: StageSpec) -> Path | None:
    """The checkpoint file this stage starts from when the recipe names one, resolved as runs_root and
    data folders are (utils.resolve_path: from the folder the command runs in). Whether it exists is
    checked when the curriculum runs (curriculum/start_files.py), not when a recipe is only planned."""
    ref = variant.start_of(entry)
    if not is_start_file(ref):
        return None
    path = resolve_path(ref)
    check_override_path(path, f"curriculum {recipe.name}: {variant.name}'s stage {entry.key} starts from file")
    return path


def check_same_tensors(recipe: Recipe, parent: PlannedRun, run: PlannedRun) -> None:
    """A stage may start from another model's checkpoint only if every tensor has the same shape:
    the fields that shape them agree (arch and the local/global split may differ, docs/method.md §5)."""
    a, b = model_config(recipe, parent).to_dict(), model_config(recipe, run).to_dict()
    differ = [k for k in TENSOR_FIELDS if a[k] != b[k]]
    if differ:
        raise ConfigError(f"curriculum {recipe.name}: {run.model}'s stage {run.stage} starts from "
                          f"{parent.model}/{parent.stage}, whose tensors differ ("
                          + "; ".join(f"{k}: {a[k]} vs {b[k]}" for k in differ) + ")")


def crosses_architecture(recipe: Recipe, parent: PlannedRun, run: PlannedRun) -> bool:
    a, b = model_config(recipe, parent).to_dict(), model_config(recipe, run).to_dict()
    return any(a[k] != b[k] for k in ACROSS_ARCH_FIELDS)


def model_overrides(recipe: Recipe, run: PlannedRun) -> list[str]:
    """The `model.<field>=` overrides a run trains with, in the order train_args passes them."""
    return [o for o in (*recipe.overrides, *run.variant.overrides_for(run.stage), *run.extra) if o.startswith("model.")]


def model_config(recipe: Recipe, run: PlannedRun):
    """The model a run trains: its preset with its `model.<field>=` overrides applied."""
    fields = OmegaConf.from_dotlist([o.removeprefix("model.") for o in model_overrides(recipe, run)])
    return load_model_config(run.variant.preset).replace(**OmegaConf.to_container(fields))


def check_shared(recipe: Recipe, owner: PlannedRun, run: PlannedRun) -> None:
    """A stage may be shared only if the models compute the same function at its length and the
    variants change nothing else (data, steps, learning rate, seed are the stage's and the recipe's)."""
    where = f"curriculum {recipe.name}: stage {run.stage} is shared"
    if run.entry.init_from is not None:
        raise ConfigError(f"{where}, so it must start from scratch (init_from: null), not from {run.entry.init_from}")
    own = lambda r: {o for o in r.variant.overrides_for(r.stage) if not o.startswith("model.")}  # noqa: E731
    if own(owner) != own(run):
        raise ConfigError(f"{where}, but {run.model} trains it with other arguments than {owner.model}: "
                          f"{sorted(own(run) ^ own(owner))}")
    if run.entry.seq_len is None:
        raise ConfigError(f"{where}: state its length in set.seq_len")
    same = same_function_len(model_config(recipe, owner), model_config(recipe, run))
    if same < int(run.entry.seq_len):
        raise ConfigError(f"{where}, but {owner.model} and {run.model} are one function only up to {same:.0f} "
                          f"tokens, not at seq_len {run.entry.seq_len} (anchormass/models/equivalence.py)")


def override_value(value: Any) -> str:
    """A YAML value in Hydra's override grammar."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(override_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{override_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def data_overrides(entry: StageSpec) -> list[str]:
    return [f"data.{k}={override_value(v)}" for k, v in entry.data_set]


def merge_overrides(args: list[str]) -> list[str]:
    """Later `key=value` wins (Hydra refuses the same group twice, e.g. trainer=gpu trainer=ddp)."""
    merged: dict[str, str] = {}
    for arg in args:
        merged.pop(arg.split("=", 1)[0], None)
        merged[arg.split("=", 1)[0]] = arg
    return list(merged.values())


def train_args(recipe: Recipe, run: PlannedRun) -> list[str]:
    """The train.py overrides of one run: the only place the plan becomes command-line strings."""
    if run.shared_from is not None:
        return train_args(recipe, run.shared_from)
    e = run.entry
    args = [f"stage={e.preset}", f"model={run.variant.preset}", f"data={e.data}", *data_overrides(e),
            f"trainer={recipe.trainer}", f"run_name={recipe.name}", f"hydra.run.dir={run.out_dir}",
            *STAGE_CONSOLE_ARGS]
    args += [f"stage.{k}={override_value(v)}" for k, v in e.settings]
    if run.parent is not None and run.parent.shared_from is not None:
        args.append("init_across_arch=true")  # the shared checkpoint is the first model's
    elif run.parent is not None and run.parent.model != run.model and crosses_architecture(recipe, run.parent, run):
        args.append("init_across_arch=true")  # a retrofit: another architecture's checkpoint
    elif run.start_file is not None:
        args.append("init_across_arch=true")  # a file's architecture is known only once train.py reads it
    threads = [f"torch_threads={recipe.parallel}"] if e.shared and recipe.parallel > 1 else []
    # The seed goes last: a command-line `seed=` cannot silently collapse the seeds into one.
    seeded = [f"seed={run.seed}"] if run.seed is not None else []
    return merge_overrides(args + list(recipe.overrides) + list(run.variant.overrides_for(run.stage)) + threads
                           + list(run.extra) + seeded)


def stage_runs(recipe: Recipe, runs: list[PlannedRun]) -> list[StageRun]:
    """The plan as the processes to run (anchormass/curriculum/execute.py)."""
    out: dict[int, StageRun] = {}
    for r in runs:
        out[id(r)] = StageRun(r.model, r.stage, r.out_dir, r.parent.last_ckpt if r.parent else r.start_file,
                              train_args(recipe, r), r.seed,
                              shared_from=out[id(r.shared_from)] if r.shared_from is not None else None,
                              after=out[id(r.parent)] if r.parent is not None and r.parent.model != r.model else None,
                              start_file=r.start_file)
    return list(out.values())


def stage_overrides(task: list[str], hydra: list[str]) -> list[str]:
    """The runner's command-line overrides (Hydra's task and hydra lists) that go to every stage."""
    own = [o for o in task if o.lstrip("+~").split("=", 1)[0].split(".", 1)[0] in RUNNER_KEYS]
    return [o for o in task if o not in own] + [o for o in hydra if o.lstrip("+~").startswith(STAGE_HYDRA_PREFIXES)]


def datasets(recipe: Recipe) -> list[tuple[list[str], Path]]:
    """Each distinct dataset the recipe reads: (prepare_data.py arguments, prepared folder);
    pretraining corpora first (long-context and SFT data read their tokenizer and source from one)."""
    out: dict[Path, list[str]] = {}
    kinds: dict[Path, str] = {}
    for s in recipe.stages:
        if not (DATA_CONFIG_DIR / f"{s.data}.yaml").is_file():
            raise ConfigError(f"curriculum {recipe.name}: stage {s.key} reads unknown data '{s.data}' "
                              f"(no {DATA_CONFIG_DIR / f'{s.data}.yaml'})")
        data = OmegaConf.merge(compose_file(s.data, DATA_CONFIG_DIR, "data"),
                               OmegaConf.from_dotlist([o.removeprefix("data.") for o in data_overrides(s)]))
        folder = resolve_path(str(data.get("out_dir") or f"data/{data.name}"))
        out.setdefault(folder, [f"data={s.data}", *data_overrides(s)])
        kinds.setdefault(folder, str(data.get("kind", "pretrain")))
    return sorted(((args, folder) for folder, args in out.items()), key=lambda item: kinds[item[1]] != "pretrain")
