"""The multi-stage curriculum: a plan of `train.py` runs (model x stage) chained by `init_from`.

A curriculum (configs/curriculum/<name>.yaml, the `curriculum` group of scripts/run_curriculum.py)
lists models, stages (each with its dataset, seeded from an earlier stage's last checkpoint) and
the closing evaluations. Runs land in `runs/<curriculum>/<model>/<stage>/`, each with its whole
output in `train.log`; with `seeds: [...]` every model's chain is repeated once per training seed
in `runs/<curriculum>/seed<s>/<model>/<stage>/`. A `models` entry is a preset name or a variant
`{name: <label>, model: <preset>, overrides: [...]}` (an ablation of one preset); a variant may
train only some stages (`stages: [<key>, ...]`) and only some of the curriculum's seeds
(`seeds: [...]`), so one file can hold models that take different routes (the slot-recall study's
uptrained model beside the ones trained from scratch). A stage entry's key is its `name` (default:
its `stage` preset), which names its folder, so one preset may appear twice. Re-running the same command continues where it stopped: finished stages
(train_result.json recording `completed: true` at the stage's total steps) are skipped, an
interrupted one resumes exactly from its own last.ckpt. A stop signal to the runner reaches its
running stages, which save at their next optimizer step (training/preemption.py); no stage starts
after it, and none ever starts from a stage that did not finish. One runner per `runs/<curriculum>/`.

A stage marked `shared: true` is trained once, by the first model, and every other model starts
its next stages from that checkpoint. That is only allowed where the models are one function
(anchormass/models/equivalence.py: AnchorMass is the Standard model up to min(W, S + C) tokens)
and every other argument of the stage is the same, so sharing changes nothing but the compute:
the miniature's 64-token stage 1 would otherwise be trained twice (once per model; six times in
the ablations), to the same weights. The shared run gets the cores the waiting chains leave idle.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from omegaconf import DictConfig, OmegaConf

from anchormass.dir_lock import DirLock
from anchormass.errors import ConfigError
from anchormass.models import load_model_config
from anchormass.models.equivalence import same_function_len
from anchormass.training.logged_process import request_stop, run_logged, stop_requested
from anchormass.training.preemption import EXIT_INTERRUPTED, TrainingInterrupted, signal_name
from anchormass.training.progress import PROGRESS_FILE
from anchormass.training.run import RESULT_FILE
from anchormass.training.stage_console import StageConsole, Task, shown
from anchormass.utils import CONFIG_ROOT, REPO_ROOT

DATA_CONFIG_DIR = CONFIG_ROOT / "data"
LOG_FILE = "train.log"
LOCK_FILE_NAME = ".curriculum.lock"  # in runs/<curriculum>/, held while a runner works there
# Every stage runs with these: its complete output (all levels, no progress bar) goes to its log
# file, and its progress to a small file the runner shows as a live line.
STAGE_CONSOLE_ARGS = ["verbose=2", "hydra/job_logging=stdout", "trainer.enable_progress_bar=false",
                      "++callbacks.progress_file._target_=anchormass.training.progress.ProgressFile"]


@dataclass
class StageRun:
    model: str  # the model's label (a preset name, or a variant's name)
    stage: str
    out_dir: Path
    init_from: Path | None
    args: list[str] = field(default_factory=list)  # train.py overrides
    seed: int | None = None  # the training seed, when the curriculum lists seeds
    shared_from: "StageRun | None" = None  # a shared stage: the run (of the first model) that trains it

    @property
    def chain(self) -> tuple[int | None, str]:
        """The stages that run one after another: one model under one seed."""
        return self.seed, self.model

    @property
    def log_path(self) -> Path:
        return self.out_dir / LOG_FILE

    @property
    def last_ckpt(self) -> Path:
        return self.out_dir / "checkpoints" / "last.ckpt"

    def result(self) -> dict | None:
        path = self.out_dir / RESULT_FILE
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

    def is_done(self) -> bool:
        """Its train_result.json says it completed its total steps (a run stopped on a signal
        writes completed: false), and its last checkpoint is there for the next stage."""
        res = self.result() or {}
        return (res.get("completed") is True and res.get("global_step") == res.get("total_steps")
                and self.last_ckpt.is_file())


@contextmanager
def curriculum_lock(root: Path) -> Iterator[None]:
    """`runs/<curriculum>/` belongs to one runner at a time (anchormass/dir_lock.py): a second
    launch of the same curriculum would skip, rerun or resume the first one's stages under it."""
    with DirLock(root / LOCK_FILE_NAME, what=f"curriculum folder {shown(root)}") as lock:
        if lock.previous:
            print(f"note: {shown(root)} was left locked by a curriculum that did not finish "
                  f"({lock.describe_previous()}); taking it over", file=sys.stderr)
        yield


def check_curriculum(cfg: DictConfig) -> DictConfig:
    """The keys every curriculum needs, and a side-by-side count that is a whole number >= 1."""
    for key in ("name", "models", "stages"):
        if cfg.get(key) is None:
            raise ConfigError(f"the curriculum lacks '{key}'")
    for s in cfg.stages:
        if "stage" not in s or "data" not in s:
            raise ConfigError(f"curriculum {cfg.name}: every stage entry needs 'stage' and 'data', got {dict(s)}")
    keys = [stage_key(s) for s in cfg.stages]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise ConfigError(f"curriculum {cfg.name}: stage names must be unique (give a repeated preset a "
                          f"`name`), {', '.join(dup)} repeats")
    parallel = cfg.get("parallel", 1)
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise ConfigError(f"curriculum.parallel must be a whole number of models >= 1, got {parallel!r}")
    model_specs(cfg)
    seeds(cfg)
    return cfg


@dataclass(frozen=True)
class ModelSpec:
    name: str  # the label in folders and tables
    preset: str  # configs/model/<preset>
    overrides: tuple[str, ...] = ()  # train.py overrides for every stage of this model
    stages: tuple[str, ...] | None = None  # the stage keys it trains (None: all)
    seeds: tuple[int, ...] | None = None  # the curriculum seeds it trains under (None: all)

    def trains(self, stage: str, seed: int | None) -> bool:
        return ((self.stages is None or stage in self.stages)
                and (self.seeds is None or seed is None or seed in self.seeds))


def stage_key(s: DictConfig) -> str:
    """A stage entry's name: its folder and the key `init_from`, `evaluate` and `stages:` use."""
    return str(s.get("name") or s.stage)


def model_specs(cfg: DictConfig) -> list[ModelSpec]:
    """The curriculum's models: a preset name, or a variant mapping {name, model, overrides}."""
    specs = []
    for m in cfg.models:
        if isinstance(m, str):
            specs.append(ModelSpec(m, m))
            continue
        if not isinstance(m, DictConfig) or not isinstance(m.get("name"), str) or not isinstance(m.get("model"), str):
            raise ConfigError(f"curriculum {cfg.name}: a models entry is a preset name or "
                              f"{{name: <label>, model: <preset>, overrides: [...]}}, got {m!r}")
        extra = set(m.keys()) - {"name", "model", "overrides", "stages", "seeds"}
        if extra:
            raise ConfigError(f"curriculum {cfg.name}: model {m.name} has unknown keys {sorted(extra)}")
        keys, all_seeds = [stage_key(s) for s in cfg.stages], seeds(cfg)
        own_stages = None if m.get("stages") is None else tuple(str(x) for x in m.stages)
        own_seeds = None if m.get("seeds") is None else tuple(m.seeds)
        if own_stages is not None and (not own_stages or set(own_stages) - set(keys)):
            raise ConfigError(f"curriculum {cfg.name}: model {m.name}: stages must be a non-empty list of "
                              f"{keys}, got {list(own_stages)}")
        if own_seeds is not None and (all_seeds is None or not own_seeds or set(own_seeds) - set(all_seeds)):
            raise ConfigError(f"curriculum {cfg.name}: model {m.name}: seeds must be a non-empty subset of "
                              f"curriculum.seeds {all_seeds}, got {list(own_seeds)}")
        specs.append(ModelSpec(m.name, m.model, tuple(str(o) for o in (m.get("overrides") or [])),
                               own_stages, own_seeds))
    labels = [s.name for s in specs]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ConfigError(f"curriculum {cfg.name}: model labels must be unique, {', '.join(dup)} repeats")
    return specs


def seeds(cfg: DictConfig) -> list[int] | None:
    """The training seeds, or None for a curriculum without the key (one run per model, the
    train config's own seed, the folder layout without seed<s>)."""
    value = cfg.get("seeds")
    if value is None:
        return None
    items = list(value) if not isinstance(value, (str, int)) else None
    if not items or any(isinstance(x, bool) or not isinstance(x, int) for x in items) or len(set(items)) < len(items):
        raise ConfigError(f"curriculum.seeds must be a non-empty list of distinct integers, got {value!r}")
    return items


def _data_kind(path: Path) -> str:
    """A data config's `kind`, looked up through its defaults list (a config may inherit it)."""
    data = OmegaConf.load(path)
    if "kind" in data:
        return str(data.kind)
    for parent in data.get("defaults") or []:
        if isinstance(parent, str) and parent != "_self_" and (path.parent / f"{parent}.yaml").is_file():
            return _data_kind(path.parent / f"{parent}.yaml")
    return "pretrain"


def datasets(cfg: DictConfig) -> list[tuple[list[str], Path]]:
    """Each distinct dataset the curriculum reads: (prepare_data.py arguments, prepared folder)."""
    out: dict[Path, list[str]] = {}
    kinds: dict[Path, str] = {}
    for s in cfg.stages:
        path = DATA_CONFIG_DIR / f"{s.data}.yaml"
        if not path.is_file():
            raise ConfigError(f"curriculum {cfg.name}: stage {s.stage} reads unknown data '{s.data}' (no {path})")
        overrides = list(s.get("data_overrides") or [])
        data = OmegaConf.merge(OmegaConf.load(path),
                               OmegaConf.from_dotlist([o.removeprefix("data.") for o in overrides]))
        folder = REPO_ROOT / str(data.get("out_dir") or f"data/{data.name}")
        out.setdefault(folder, [f"data={s.data}", *overrides])
        kinds.setdefault(folder, _data_kind(path))
    # pretraining corpora first: long-context and SFT data read their tokenizer (and source) from one
    return sorted(((args, folder) for folder, args in out.items()), key=lambda item: kinds[item[1]] != "pretrain")


# scripts/run_curriculum.py's own settings; every other command-line override is for train.py.
RUNNER_KEYS = ("curriculum", "runs_root", "evaluate", "verbose")
# Hydra settings that belong to the stages: the launcher that runs each train.py (e.g. on Slurm).
STAGE_HYDRA_PREFIXES = ("hydra/launcher=", "hydra.launcher.")


def stage_overrides(task: list[str], hydra: list[str]) -> list[str]:
    """The runner's command-line overrides (Hydra's task and hydra lists) that go to every stage."""
    own = [o for o in task if o.lstrip("+~").split("=", 1)[0].split(".", 1)[0] in RUNNER_KEYS]
    return [o for o in task if o not in own] + [o for o in hydra if o.lstrip("+~").startswith(STAGE_HYDRA_PREFIXES)]


def merge_overrides(args: list[str]) -> list[str]:
    """Later `key=value` wins (Hydra refuses the same group twice, e.g. trainer=gpu trainer=ddp)."""
    merged: dict[str, str] = {}
    for arg in args:
        merged.pop(arg.split("=", 1)[0], None)
        merged[arg.split("=", 1)[0]] = arg
    return list(merged.values())


def plan(cfg: DictConfig, runs_root: Path, extra: list[str]) -> list[StageRun]:
    """Every (seed, model, stage) run in order: all stages of the first model, then the next
    model, then the next seed. The models of one seed get the same seed and data, so stage k
    feeds them identical batches and only the model differs."""
    names = [stage_key(s) for s in cfg.stages]
    runs: list[StageRun] = []
    seed_list = seeds(cfg)
    for seed in seed_list if seed_list is not None else [None]:
        base = runs_root / str(cfg.name) / (f"seed{seed}" if seed is not None else "")
        owners: dict[str, StageRun] = {}  # shared stage -> the first model's run of it
        # The seed goes last: a command-line `seed=` cannot silently collapse the seeds into one.
        seeded = [f"seed={seed}"] if seed is not None else []
        for spec in model_specs(cfg):
            done: dict[str, StageRun] = {}
            for s in cfg.stages:
                key = stage_key(s)
                if not spec.trains(key, seed):
                    continue
                parent = s.get("init_from")
                if parent is not None and parent not in done:
                    raise ConfigError(f"curriculum {cfg.name}: stage {key} starts from {parent}, which is not "
                                      f"an earlier stage {spec.name} trains (order: {names})")
                out = base / spec.name / key
                args = [f"stage={s.stage}", f"model={spec.preset}", f"data={s.data}",
                        *list(s.get("data_overrides") or []), f"trainer={cfg.get('trainer', 'cpu')}",
                        f"run_name={cfg.name}", f"hydra.run.dir={out}", *STAGE_CONSOLE_ARGS]
                args += [f"stage.{k}={v}" for k, v in (s.get("set") or {}).items()]
                if parent and done[parent].shared_from is not None:
                    args.append("init_across_arch=true")  # the shared checkpoint is the first model's
                threads = [f"torch_threads={cfg.parallel}"] if s.get("shared") and cfg.get("parallel", 1) > 1 else []
                args = merge_overrides(args + list(cfg.get("overrides") or []) + list(spec.overrides) + threads
                                       + list(extra) + seeded)
                run = StageRun(spec.name, key, out, done[parent].last_ckpt if parent else None, args, seed)
                owner = owners.setdefault(key, run) if s.get("shared") else run
                if owner is not run:
                    check_shared(cfg, s, owner, run)
                    run = StageRun(spec.name, key, owner.out_dir, None, owner.args, seed, shared_from=owner)
                done[key] = run
                runs.append(run)
    return runs


def _model_config(run: StageRun):
    """The model a run trains: its preset with the run's `model.<field>=` overrides applied."""
    preset = next(a.split("=", 1)[1] for a in run.args if a.startswith("model="))
    fields = OmegaConf.from_dotlist([a.removeprefix("model.") for a in run.args if a.startswith("model.")])
    return load_model_config(preset).replace(**OmegaConf.to_container(fields))


def check_shared(cfg: DictConfig, stage: DictConfig, owner: StageRun, run: StageRun) -> None:
    """A stage may be shared only if the models compute the same function at its length and every
    other argument (data, steps, learning rate, seed ...) is the same for both."""
    where = f"curriculum {cfg.name}: stage {stage.stage} is shared"
    if stage.get("init_from") is not None:
        raise ConfigError(f"{where}, so it must start from scratch (init_from: null), not from {stage.init_from}")
    own = lambda r: {a for a in r.args if not a.startswith(("model=", "model.", "hydra.run.dir="))}  # noqa: E731
    if own(owner) != own(run):
        raise ConfigError(f"{where}, but {run.model} trains it with other arguments than {owner.model}: "
                          f"{sorted(own(run) ^ own(owner))}")
    seq = next((a.split("=", 1)[1] for a in reversed(owner.args) if a.startswith("stage.seq_len=")), None)
    if seq is None:
        raise ConfigError(f"{where}: state its length in set.seq_len")
    same = same_function_len(_model_config(owner), _model_config(run))
    if same < int(seq):
        raise ConfigError(f"{where}, but {owner.model} and {run.model} are one function only up to {same:.0f} "
                          f"tokens, not at seq_len {seq} (anchormass/models/equivalence.py)")


def command(run: StageRun) -> list[str]:
    """The train.py call for one run: resume its own checkpoint if one exists, else start
    from the parent stage's weights."""
    cmd = [sys.executable, str(REPO_ROOT / "train.py"), *run.args]
    if run.last_ckpt.is_file():
        cmd.append(f"ckpt_path={run.last_ckpt}")
    elif run.init_from is not None:
        cmd.append(f"init_from={run.init_from}")
    return cmd


def finished_text(run: StageRun, seconds: float) -> str:
    res = run.result() or {}
    metrics = res.get("metrics", {})
    loss, val = metrics.get("train/loss"), metrics.get("val/loss")
    return (f"done    {res.get('global_step', '?')} steps  loss {loss:.4f}" if loss is not None else "done") + (
        f"  val {val:.4f}" if val is not None else "") + f"  {seconds:.0f} s"


def _run_chain(chain: list[StageRun], console: StageConsole, label, finished: dict[int, threading.Event]) -> int:
    """One model's stages in order; returns the first non-zero exit code (0 when all ran). Each
    run's event is set once it is over (done, skipped or failed), for chains that share it. A
    stage starts only once the one before it is done; after a stop signal none starts."""
    try:
        for run in chain:
            if stop_requested():
                return EXIT_INTERRUPTED
            rc = _run_one(run, console, label, finished)
            finished[id(run)].set()
            if rc:
                return rc
        return 0
    finally:
        for run in chain:
            finished[id(run)].set()  # a failed chain never leaves a waiter hanging


def _run_one(run: StageRun, console: StageConsole, label, finished: dict[int, threading.Event]) -> int:
    task = Task(label(run), run.log_path, progress_dir=run.out_dir)
    if run.shared_from is not None:
        finished[id(run.shared_from)].wait()
        if not run.shared_from.is_done() and stop_requested():
            return EXIT_INTERRUPTED
        if not run.shared_from.is_done():
            console.post("failed", task, message=f"the shared stage did not finish in {run.shared_from.model}'s chain")
            return 1
        console.post("skipped", task, message=f"shared: trained once, by {run.shared_from.model}")
        return 0
    if run.is_done():
        console.post("skipped", task, message="skipped (already done)")
        return 0
    (run.out_dir / PROGRESS_FILE).unlink(missing_ok=True)  # an earlier attempt's records would show as live
    console.post("started", task)
    echo = (lambda line, t=task: console.post("line", t, text=line)) if console.verbose >= 2 else None
    t0 = time.perf_counter()
    rc = run_logged(command(run), run.log_path, echo=echo)
    if rc == EXIT_INTERRUPTED or (rc != 0 and stop_requested()):  # killed while starting: nothing new to save
        console.post("interrupted", task, message=interrupted_text(run, rc))
        return EXIT_INTERRUPTED
    if rc != 0:
        console.post("failed", task, message=f"exit {rc} after {time.perf_counter() - t0:.0f} s; "
                                             f"rerun the same command to resume")
        return rc
    if not run.is_done():  # exit 0 without its total steps: its next stage must not start from it
        console.post("failed", task, message=f"exit 0, but {shown(run.out_dir / RESULT_FILE)} does not record "
                                             f"its total steps as completed; rerun the same command to resume")
        return 1
    console.post("finished", task, message=finished_text(run, time.perf_counter() - t0))
    return 0


def interrupted_text(run: StageRun, rc: int) -> str:
    """`interrupted at step 57/100 (SIGTERM), saved; ...` from the result the stage wrote when it stopped."""
    res = run.result() or {}
    where = (f"at step {res.get('global_step')}/{res.get('total_steps')}, saved" if rc == EXIT_INTERRUPTED
             else f"while starting (exit {rc}), nothing new to save")
    why = signal_name(stop_requested()) if stop_requested() else "a stop signal sent to the stage"
    return f"interrupted {where} ({why}); rerun the same command to resume"


def execute(runs: list[StageRun], parallel: int = 1, console: StageConsole | None = None) -> list[dict]:
    """Run every stage as a train.py subprocess whose output goes to its log file. Each model's
    stages run in order; with parallel > 1 up to that many models train side by side (a 2-core
    machine runs two 1-thread chains faster than one 2-thread chain). Exits with the first
    failure's code once every chain has stopped; raises TrainingInterrupted when stages were
    stopped by a signal (and nothing failed otherwise)."""
    console = console or StageConsole()
    chains: dict[tuple[int | None, str], list[StageRun]] = {}
    for run in runs:
        chains.setdefault(run.chain, []).append(run)
    wm, ws = max(len(r.model) for r in runs), max(len(r.stage) for r in runs)
    wseed = max(len(f"seed{r.seed}") for r in runs) if runs[0].seed is not None else 0

    def label(run: StageRun) -> str:  # aligned columns across all chains' lines
        seed = f"{f'seed{run.seed}':<{wseed}}  " if run.seed is not None else ""
        return f"{seed}{run.model:<{wm}}  {run.stage:<{ws}}"

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        finished = {id(run): threading.Event() for run in runs}
        futures = [pool.submit(_run_chain, chain, console, label, finished) for chain in chains.values()]
        try:
            console.follow(futures)
        except BaseException:  # the runner is going down: its stages save and stop too, then it waits for them
            request_stop(signal.SIGTERM, signal.SIGTERM)
            raise
    codes = [f.result() for f in futures if f.result()]
    failed = [rc for rc in codes if rc != EXIT_INTERRUPTED]
    if failed:  # a stage that failed on its own: its code, even when a stop came too
        raise SystemExit(failed[0])
    if codes or stop_requested():
        why = signal_name(stop_requested()) if stop_requested() else "a stage was stopped by a signal"
        raise TrainingInterrupted(f"{why}; the running stages saved at a step boundary and no stage started "
                                  f"after; rerun the same command to resume")
    summary = []
    for run in runs:
        res = run.result() or {}
        summary.append({**({"seed": run.seed} if run.seed is not None else {}), "model": run.model, "stage": run.stage, "checkpoint": str(run.last_ckpt),
                        "global_step": res.get("global_step"),
                        "train_loss": res.get("metrics", {}).get("train/loss"),
                        "val_loss": res.get("metrics", {}).get("val/loss")})
    return summary


@dataclass
class ReportJob:
    """One closing comparison: model `a` vs model `b` at a stage, under one training seed."""
    name: str  # the evaluate entry's name
    seed: int | None
    a: StageRun
    b: StageRun
    out_dir: Path
    overrides: list[str]


def evaluate_pairs(cfg: DictConfig) -> list[tuple[DictConfig, str, str]]:
    """Each evaluate entry with the labels it compares: its `pair`, else the first two models.
    Checked before any training, so a typo does not surface after hours of it."""
    labels, stages = [s.name for s in model_specs(cfg)], [stage_key(s) for s in cfg.stages]
    out = []
    for entry in cfg.get("evaluate") or []:
        if entry.get("name") is None or entry.get("stage") not in stages:
            raise ConfigError(f"curriculum {cfg.name}: an evaluate entry needs a name and one of the stages "
                              f"{stages}, got {dict(entry)}")
        pair = entry.get("pair")
        if pair is None:
            if len(labels) < 2:
                raise ConfigError(f"the closing comparison needs two models, got curriculum.models=[{','.join(labels)}]; "
                                  f"pass two models or evaluate=false")
            pair = labels[:2]
        pair = [str(p) for p in pair] if not isinstance(pair, str) else [pair]
        if len(pair) != 2 or pair[0] == pair[1] or any(p not in labels for p in pair):
            raise ConfigError(f"curriculum {cfg.name}: evaluate {entry.name}: pair must name two different "
                              f"models of {labels}, got {pair}")
        out.append((entry, pair[0], pair[1]))
    return out


def report_jobs(cfg: DictConfig, runs: list[StageRun], root: Path) -> list[ReportJob]:
    """Every evaluate.py call, entry by entry and seed by seed; reports go to
    root/report/<entry>/ (without seeds) or root/report/<entry>/seed<s>/. The curriculum's
    `eval_overrides` follow every entry's own (e.g. smaller evaluation sizes for a quick run)."""
    by_key = {(r.seed, r.model, r.stage): r for r in runs}
    seed_list = seeds(cfg)
    jobs = []
    for entry, a, b in evaluate_pairs(cfg):
        for seed in seed_list if seed_list is not None else [None]:
            out = root / "report" / str(entry.name) / (f"seed{seed}" if seed is not None else "")
            pair = by_key.get((seed, a, str(entry.stage))), by_key.get((seed, b, str(entry.stage)))
            if None in pair:  # a model that does not train this stage under this seed: no comparison there
                continue
            jobs.append(ReportJob(str(entry.name), seed, pair[0], pair[1], out,
                                  list(entry.get("overrides") or []) + list(cfg.get("eval_overrides") or [])))
    return jobs
