"""Run a child process with its whole output appended to a log file (optionally also streamed)."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from pathlib import Path
from typing import Callable

from anchormass.utils import REPO_ROOT


def run_logged(cmd: list[str], log_path: str | os.PathLike, echo: Callable[[str], None] | None = None) -> int:
    """Run `cmd` from the repository root; stdout and stderr go, interleaved as printed, to the
    end of `log_path` after a header naming the command. Returns the exit code.

    Progress bars are switched off in the child (a bar redrawn into a file is thousands of
    fragments); output is unbuffered so the log is current while the child runs.
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"}
    with open(log_path, "ab") as log:
        log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(cmd)}\n".encode())
        log.flush()
        if echo is None:
            return subprocess.call(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        for line in proc.stdout:
            log.write(line)
            log.flush()
            echo(line.decode("utf-8", errors="replace").rstrip("\n"))
        return proc.wait()
