"""Processes that end with their parent, however it ends (SIGKILL and the OOM killer included).

Linux's PR_SET_PDEATHSIG asks the kernel to signal this process when the thread that created it
exits; elsewhere this is a no-op (those children are then left to their own end, as before).
Used by the curriculum's stages (runs/logged_process.follow_parent) and by prepare_data's
encoding workers (data/parallel_encode.py), which the parent's death otherwise re-parents to init.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def end_with_parent(parent_pid: int, signum: int = signal.SIGTERM) -> bool:
    """Have the kernel send `signum` to this process when `parent_pid` (its parent) dies; if the
    parent is already gone (it died before the request took effect), send it now. Returns whether
    the request could be made."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    except (OSError, AttributeError):
        return False
    if os.getppid() != int(parent_pid):
        os.kill(os.getpid(), signum)
    return True
