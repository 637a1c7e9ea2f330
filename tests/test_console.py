"""What reaches the console: the curriculum's live and finished lines, a failed stage's log tail,
and train.py without the libraries' chatter (which still reaches its log file)."""

import io
import json
import logging
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from anchormass.errors import ConfigError
from anchormass.logging_setup import ConsoleFilter, check_verbose
from anchormass.runs.progress import PROGRESS_FILE, read_progress
from anchormass.runs.stage_console import StageConsole, Task

from _train_helpers import FAST, REPO, stage_data, subprocess_env, tiny_datasets, train_cmd


def record(step, total=300, loss=2.5, tps=1500.0, eta=45.0):
    return json.dumps({"step": step, "total": total, "loss": loss, "tokens_per_s": tps, "eta_s": eta}) + "\n"


def test_read_progress_takes_the_newest_complete_record(tmp_path):
    assert read_progress(tmp_path) is None
    (tmp_path / PROGRESS_FILE).write_text(record(10) + record(20) + '{"step": 3')  # a line still being written
    assert read_progress(tmp_path)["step"] == 20


def run_console(console: StageConsole, script) -> None:
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(script)
        console.follow([future])
    future.result()


def shown_within(out: io.StringIO, fragments: list[str], seconds: float) -> None:
    """Wait until the console has drawn every fragment (it polls the progress files on its own thread)."""
    deadline = time.monotonic() + seconds
    while not all(f in out.getvalue() for f in fragments) and time.monotonic() < deadline:
        time.sleep(0.02)


def test_live_line_per_running_stage_then_a_finished_line(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")  # a pytest-xdist worker reports 80, which cuts the line short
    out = io.StringIO()
    console = StageConsole(verbose=1, stream=out, live=True, poll_s=0.05)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    ta, tb = Task("standard_tiny    pretrain_1k", a / "train.log", a), Task("anchormass_tiny  pretrain_1k", b / "x", b)

    def script():
        console.post("started", ta)
        console.post("started", tb)
        (a / PROGRESS_FILE).write_text(record(120, loss=2.913, tps=1530.0, eta=45))
        (b / PROGRESS_FILE).write_text(record(60, loss=3.5, tps=800.0, eta=3700))
        shown_within(out, ["120/300", "60/300"], seconds=30)  # the poller's pace, not a fixed sleep: a loaded CI
        console.post("finished", ta, message="done    300 steps")
        console.post("finished", tb, message="done    300 steps")
        return 0

    run_console(console, script)
    text = out.getvalue()
    assert "standard_tiny    pretrain_1k" in text and "120/300  loss 2.9130  1.5k tok/s  ETA 0:45" in text
    assert "60/300  loss 3.5000  800 tok/s  ETA 1:01:40" in text
    plain = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text).replace("\r", "\n")  # cursor moves between the bars' rows
    lines = [line.strip() for line in plain.splitlines() if line.strip()]
    assert [line for line in lines if "done" in line] == ["standard_tiny    pretrain_1k  done    300 steps",
                                                          "anchormass_tiny  pretrain_1k  done    300 steps"]
    assert lines[-1] == "anchormass_tiny  pretrain_1k  done    300 steps"  # no bar left behind


def test_without_a_terminal_no_bars_only_finished_lines(tmp_path):
    out = io.StringIO()
    console = StageConsole(verbose=1, stream=out, poll_s=0.05)  # a StringIO is not a terminal
    task = Task("m  s", tmp_path / "train.log", tmp_path)

    def script():
        console.post("started", task)
        (tmp_path / PROGRESS_FILE).write_text(record(5, total=10))
        time.sleep(0.2)
        console.post("finished", task, message="done    10 steps")
        return 0

    run_console(console, script)
    assert out.getvalue() == "m  s  done    10 steps\n"


def test_failed_stage_shows_its_log_path_and_last_20_lines(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("".join(f"line {i}\n" for i in range(1, 31)))
    for verbose in (0, 1):
        out = io.StringIO()
        console = StageConsole(verbose=verbose, stream=out, poll_s=0.05)
        task = Task("m  s", log, tmp_path)
        run_console(console, lambda: console.post("failed", task, message="exit 2 after 3 s"))
        lines = out.getvalue().splitlines()
        assert lines[:2] == ["m  s  FAILED: exit 2 after 3 s", f"  log: {log} (last 20 lines below)"]
        assert lines[2:] == [f"  | line {i}" for i in range(11, 31)]


def test_quiet_console_shows_no_finished_lines(tmp_path):
    out = io.StringIO()
    console = StageConsole(verbose=0, stream=out, live=True, poll_s=0.05)
    task = Task("m  s", tmp_path / "train.log", tmp_path)
    run_console(console, lambda: (console.post("started", task), console.post("finished", task, message="done")))
    assert out.getvalue() == ""


def test_console_filter_keeps_our_records_and_errors_at_the_default_level():
    def rec(name, level):
        return logging.LogRecord(name, level, __file__, 1, "m", None, None)

    default, quiet, everything = ConsoleFilter(1), ConsoleFilter(0), ConsoleFilter(2)
    assert default.filter(rec("anchormass.runs.train", logging.INFO))
    assert not default.filter(rec("lightning.pytorch.utilities.rank_zero", logging.INFO))
    assert not default.filter(rec("py.warnings", logging.WARNING))
    assert default.filter(rec("lightning.pytorch", logging.ERROR))
    assert not quiet.filter(rec("anchormass.runs.train", logging.INFO))
    assert everything.filter(rec("py.warnings", logging.WARNING))
    for bad in (3, -1, "loud", True):
        with pytest.raises(ConfigError):
            check_verbose(bad)


@pytest.mark.slow
def test_train_py_console_has_no_library_chatter_but_its_log_has_all(tmp_path):
    data = stage_data("pretrain_1k", tiny_datasets(tmp_path / "data"))
    overrides = [o for o in FAST if o != "trainer.enable_progress_bar=false"]
    out = tmp_path / "run"
    proc = subprocess.run(train_cmd([*overrides, f"data_dir={data}", "stage=pretrain_1k"], out), cwd=REPO,
                          env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    console, log = proc.stdout + proc.stderr, (out / "train.log").read_text()
    for chatter in ("GPU available", "Tip:", "Trainable params", "`Trainer.fit` stopped"):
        assert chatter not in console and chatter in log
    assert "Epoch 0" in proc.stdout  # Lightning's progress bar stays: train.py is the single-run tool
    assert proc.stdout.strip().splitlines()[-1].startswith("done: step 2")

    quiet = subprocess.run(train_cmd([*overrides, f"data_dir={data}", "stage=pretrain_1k", "verbose=0"],
                                     tmp_path / "quiet"), cwd=REPO, env=subprocess_env(), capture_output=True,
                           text=True, timeout=300)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert quiet.stderr == "" and quiet.stdout.strip().splitlines() == [quiet.stdout.strip()]  # the done line only
