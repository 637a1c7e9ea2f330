"""Running the plan: each stage a `train.py` process whose output goes to its own log file.

Runs land in `runs/<curriculum>/<model>/<stage>/` (with seeds, `.../seed<s>/<model>/<stage>/`),
each with its whole output in `train.log`. Each model's stages run in order, up to `parallel`
chains side by side. Re-running the same command continues where it stopped: finished stages
(train_result.json recording `completed: true` at the stage's total steps) are skipped, an
interrupted one resumes exactly from its own last.ckpt. A stop signal to the runner reaches its
running stages, which save at their next optimizer step (runs/preemption.py); no stage starts
after it, and none ever starts from a stage that did not finish. One runner per `runs/<curriculum>/`.
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

from anchormass.curriculum.stage_identity import data_fingerprint, identify
from anchormass.curriculum.start_files import RECORD_KEY as START_RECORD_KEY
from anchormass.curriculum.start_files import start_record
from anchormass.dir_lock import DirLock
from anchormass.runs.layout import finished_run, last_checkpoint, result_file, stage_args_file
from anchormass.runs.logged_process import request_stop, run_logged, stop_requested
from anchormass.runs.preemption import EXIT_INTERRUPTED, TrainingInterrupted, signal_name
from anchormass.runs.progress import PROGRESS_FILE
from anchormass.runs.run_dir import checkpoints_in
from anchormass.runs.stage_console import StageConsole, Task, shown
from anchormass.utils import atomic_write_json

LOG_FILE = "train.log"
LOCK_FILE_NAME = ".curriculum.lock"  # in runs/<curriculum>/, held while a runner works there
# The runner's code for a stage killed by a signal it did not send (the OOM killer's SIGKILL): a
# failure, resumable by a rerun, not the shell's 128+n (SystemExit(-9) exited 247).
EXIT_KILLED = 1


@dataclass
class StageRun:
    """One train.py process: what anchormass/curriculum/plan.py's records become at the edge."""
    model: str  # the model's label (a preset name, or a variant's name)
    stage: str  # the stage's key
    out_dir: Path
    init_from: Path | None
    args: list[str] = field(default_factory=list)  # train.py overrides
    seed: int | None = None  # the training seed, when the curriculum lists seeds
    shared_from: "StageRun | None" = None  # a shared stage: the run (of the first model) that trains it
    after: "StageRun | None" = None  # the run of another model's chain whose checkpoint seeds this one
    settings: dict | None = None  # its composed config, flat (stage_identity.identify)
    unknown: str | None = None  # why there is none: the arguments do not compose
    data_dir: Path | None = None  # the prepared data folder it reads
    start_file: Path | None = None  # init_from is a checkpoint file the recipe names, not a stage's (start_files.py)

    @property
    def chain(self) -> tuple[int | None, str]:
        """The stages that run one after another: one model under one seed."""
        return self.seed, self.model

    @property
    def log_path(self) -> Path:
        return self.out_dir / LOG_FILE

    @property
    def last_ckpt(self) -> Path:
        return last_checkpoint(self.out_dir)

    def result(self) -> dict | None:
        path = result_file(self.out_dir)
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

    def is_done(self) -> bool:
        """It trained its total steps and its last checkpoint is there for the next stage."""
        return finished_run(self.out_dir)


@contextmanager
def curriculum_lock(root: Path) -> Iterator[None]:
    """`runs/<curriculum>/` belongs to one runner at a time (anchormass/dir_lock.py): a second
    launch of the same curriculum would skip, rerun or resume the first one's stages under it."""
    with DirLock(root / LOCK_FILE_NAME, what=f"curriculum folder {shown(root)}") as lock:
        if lock.previous:
            print(f"note: {shown(root)} was left locked by a curriculum that did not finish "
                  f"({lock.describe_previous()}); taking it over", file=sys.stderr)
        yield


def command(run: StageRun) -> list[str]:
    """The train.py call for one run: resume its own newest checkpoint if it has any (last.ckpt
    or not: a stage killed between its first periodic checkpoint and its first last.ckpt has only
    step-N.ckpt), else start from the parent stage's weights."""
    cmd = [sys.executable, "-m", "anchormass.commands.train", *run.args]
    if checkpoints_in(run.out_dir):
        cmd.append("ckpt_path=last")
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
    run's event is set once it is over (done, skipped or failed), for chains that wait on it. A
    stage starts only once the one before it is done; after a stop signal none starts."""
    try:
        for run in chain:
            if stop_requested():
                return EXIT_INTERRUPTED
            rc = _wait_for_parent(run, console, label, finished) or _run_one(run, console, label, finished)
            finished[id(run)].set()
            if rc:
                return rc
        return 0
    finally:
        for run in chain:
            finished[id(run)].set()  # a failed chain never leaves a waiter hanging


def _wait_for_parent(run: StageRun, console: StageConsole, label, finished: dict[int, threading.Event]) -> int:
    """A stage seeded by another chain's run starts once that run is done; 1 if it failed."""
    if run.after is None:
        return 0
    finished[id(run.after)].wait()
    if run.after.is_done() or run.is_done():
        return 0
    if stop_requested():
        return EXIT_INTERRUPTED
    console.post("failed", Task(label(run), run.log_path, progress_dir=run.out_dir),
                 message=f"it starts from {run.after.model}/{run.after.stage}, which did not finish")
    return 1


def _ready(chain: list[StageRun], finished: dict[int, threading.Event]) -> bool:
    """Every run of other chains that this chain waits on is over."""
    return all(finished[id(dep)].is_set() for r in chain for dep in (r.after, r.shared_from) if dep is not None)


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
    run.out_dir.mkdir(parents=True, exist_ok=True)
    if not stage_args_file(run.out_dir).is_file():  # a resume keeps the record of the run's first start
        identify([run])
        atomic_write_json(stage_args_file(run.out_dir), stage_record(run), indent=1)
    console.post("started", task)
    echo = (lambda line, t=task: console.post("line", t, text=line)) if console.verbose >= 2 else None
    t0 = time.perf_counter()
    rc = run_logged(command(run), run.log_path, echo=echo)
    if rc == EXIT_INTERRUPTED or (rc != 0 and stop_requested()):  # killed while starting: nothing new to save
        console.post("interrupted", task, message=interrupted_text(run, rc))
        return EXIT_INTERRUPTED
    if rc != 0:
        console.post("failed", task, message=failure_text(run, rc, time.perf_counter() - t0))
        return rc if rc > 0 else EXIT_KILLED
    if not run.is_done():  # exit 0 without its total steps: its next stage must not start from it
        console.post("failed", task, message=f"exit 0, but {shown(result_file(run.out_dir))} does not record "
                                             f"its total steps as completed; rerun the same command to resume")
        return 1
    console.post("finished", task, message=finished_text(run, time.perf_counter() - t0))
    return 0


def stage_record(run: StageRun) -> dict:
    """stage_args.json (runs/layout.py), written before the stage's first start: its train.py arguments,
    the run it starts from (and the sha256 of a start file, start_files.py), its composed config and its
    data folder's fingerprint (stage_identity.py).
    A rerun compares them with what the recipe gives now, so a changed recipe never inherits an old result."""
    return {"args": run.args, "init_from": str(run.init_from) if run.init_from else None,
            START_RECORD_KEY: start_record(run.start_file), "settings": run.settings,
            "data": {"dir": str(run.data_dir) if run.data_dir else None, "fingerprint": data_fingerprint(run.data_dir)}}


def last_error_line(log: Path) -> str | None:
    """The stage's own one-line refusal (`error: ...`), the last one its log holds."""
    if not log.is_file():
        return None
    lines = [ln.strip() for ln in log.read_text(encoding="utf-8", errors="replace").splitlines()]
    return next((ln for ln in reversed(lines) if ln.startswith("error:")), None)


def failure_text(run: StageRun, rc: int, seconds: float) -> str:
    """The stage's own error line first, then advice that works: a refusal (exit 2) stays a refusal
    on a rerun until what it names is fixed; a crash resumes from the stage's last checkpoint."""
    error = last_error_line(run.log_path)
    ended = f"killed by {signal_name(-rc)}" if rc < 0 else f"exit {rc}"
    head = f"{error} ({ended} after {seconds:.0f} s)" if error else f"{ended} after {seconds:.0f} s"
    if rc == 2:
        return f"{head}; the stage refused to run: fix what it names, then rerun the same command"
    where = "from its last checkpoint" if checkpoints_in(run.out_dir) else "from the start of the stage"
    return f"{head}; rerun the same command to resume {where}"


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

    finished = {id(run): threading.Event() for run in runs}
    pending = list(chains.values())
    picking = threading.Lock()

    def next_chain() -> list[StageRun]:
        """The first chain, in plan order, whose other-chain parents are over (else the first one
        left, which then waits): a waiting chain does not hold a core while others could train."""
        with picking:
            chain = next((c for c in pending if _ready(c, finished)), pending[0])
            pending.remove(chain)
            return chain

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        futures = [pool.submit(lambda: _run_chain(next_chain(), console, label, finished)) for _ in chains]
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
        summary.append({**({"seed": run.seed} if run.seed is not None else {}), "model": run.model,
                        "stage": run.stage, "checkpoint": str(run.last_ckpt),
                        "global_step": res.get("global_step"),
                        "train_loss": res.get("metrics", {}).get("train/loss"),
                        "val_loss": res.get("metrics", {}).get("val/loss")})
    return summary


def run_step(console: StageConsole, label: str, cmd: list[str], log: Path, finished: str) -> None:
    """A data preparation or report process: its output to `log`, one line when it is done."""
    task = Task(label, log)
    t0 = time.perf_counter()
    rc = run_logged(cmd, log, echo=(lambda line: console.print(f"[{label}] {line}")) if console.verbose >= 2 else None)
    if rc != 0 and stop_requested():  # it got the stop signal too: not a failure of its own
        raise TrainingInterrupted(f"{signal_name(stop_requested())} during {label}; rerun the same command to resume")
    if rc != 0:
        console.failure(task, f"killed by {signal_name(-rc)}" if rc < 0 else f"exit {rc}")
        raise SystemExit(rc if rc > 0 else EXIT_KILLED)
    if console.verbose >= 1:
        console.print(f"{label}  {finished} in {time.perf_counter() - t0:.0f} s")
