"""Run a child process with its whole output appended to a log file (optionally also streamed).

The children of one runner (the curriculum's stages, data preparations, reports) are known here,
so a stop signal reaching the runner can be passed on to each of them (`request_stop`) and the
runner can wait for them to save and exit instead of leaving them orphaned.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

from anchormass.parent_death import end_with_parent
from anchormass.utils import CHECKOUT

# The runner's pid, in each child's environment: the child asks the kernel for a SIGTERM when the
# runner dies (follow_parent), since its own process group keeps a kill of the runner's group from it.
PARENT_PID_ENV = "ANCHORMASS_RUNNER_PID"

_running: set[subprocess.Popen] = set()
# (signal the runner received, signal its children get), once a stop is requested
_stop: tuple[int, int] | None = None


def request_stop(received: int, forward: int) -> None:
    """Send `forward` to every running child now, and to any child that starts from now on.
    Called from a signal handler: no locks (the handler may interrupt a thread holding one)."""
    global _stop
    _stop = _stop or (received, forward)
    for proc in list(_running):
        _send(proc, forward)


def stop_requested() -> int | None:
    """The signal that asked this runner to stop, or None."""
    return _stop[0] if _stop else None


def clear_stop() -> None:
    global _stop
    _stop = None


def _send(proc: subprocess.Popen, signum: int) -> None:
    try:
        proc.send_signal(signum)  # does nothing for a child already reaped
    except ProcessLookupError:
        pass


def run_logged(cmd: list[str], log_path: str | os.PathLike, echo: Callable[[str], None] | None = None) -> int:
    """Run `cmd` in this process's folder (a relative path means the same to the child); stdout and
    stderr go, interleaved as printed, to the end of `log_path` after a header naming the command.
    Returns the exit code.

    Progress bars are switched off in the child (a bar redrawn into a file is thousands of
    fragments); output is unbuffered so the log is current while the child runs. The child runs
    in its own process group: a Ctrl-C at the terminal reaches only the runner, which passes a
    SIGTERM on (a SIGINT would stop a training run without its checkpoint, see request_stop).
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1", PARENT_PID_ENV: str(os.getpid())}
    if CHECKOUT is not None:  # `-m anchormass...` finds the checkout's package from any folder
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CHECKOUT), os.environ.get("PYTHONPATH")]))
    with open(log_path, "ab") as log:
        log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log if echo is None else subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env, process_group=0)
        _running.add(proc)
        try:
            if _stop is not None:  # requested while it was starting: request_stop did not see it
                _send(proc, _stop[1])
            if echo is not None:
                for line in proc.stdout:
                    log.write(line)
                    log.flush()
                    echo(line.decode("utf-8", errors="replace").rstrip("\n"))
            return proc.wait()
        finally:
            _running.discard(proc)


def follow_parent() -> None:
    """In a child of run_logged: get SIGTERM when the runner dies, even by SIGKILL, so no stage
    trains on orphaned (a training run then saves at its next step boundary and exits resumable).
    The runner waits for each child in the thread that started it, so that thread (whose end is
    what the kernel watches) lives as long as the child. A no-op outside run_logged or off Linux."""
    parent = os.environ.pop(PARENT_PID_ENV, None)  # not inherited further: a DDP rank's parent is its rank 0
    if parent:
        end_with_parent(int(parent), signal.SIGTERM)
