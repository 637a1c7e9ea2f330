"""prepare_data.py's encoding workers end with it, whatever ends it (issue 37): before, a killed
prepare left its spawned workers and the resource tracker running, re-parented to init."""

import os
import signal
import subprocess
import sys
import time

import pytest

from _train_helpers import REPO, subprocess_env

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            stat = open(f"/proc/{entry}/stat").read() if entry.isdigit() else ""
        except OSError:
            continue
        if stat and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_killing_prepare_data_ends_its_workers_and_resource_tracker(tmp_path, signum):
    proc = subprocess.Popen([sys.executable, "scripts/prepare_data.py", "data=demo", "data.num_workers=2",
                             f"data.out_dir={tmp_path / 'demo'}", "data.tokenizer.vocab_size=400"],
                            cwd=REPO, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, kids = time.time() + 120, []
        while proc.poll() is None and time.time() < deadline and len(kids) < 3:   # 2 workers + the tracker
            kids = children(proc.pid)
            time.sleep(0.05)
        assert len(kids) >= 3, "prepare_data.py ended before its workers were seen"
        time.sleep(0.5)
        proc.send_signal(signum)
        proc.wait(timeout=30)
        deadline = time.time() + 15
        while time.time() < deadline and any(alive(k) for k in kids):
            time.sleep(0.1)
        assert not [k for k in kids if alive(k)], "workers outlived prepare_data.py"
    finally:
        proc.kill()
        for k in [k for k in kids if alive(k)]:   # the orphans of a failing run: not left behind
            os.kill(k, signal.SIGKILL)
