"""`python -m anchormass` lists every console script of pyproject.toml, with its one-line summary."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_python_m_anchormass_lists_every_console_script():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    done = subprocess.run([sys.executable, "-m", "anchormass"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    listed = {line.split()[0]: line for line in done.stdout.splitlines()[1:]}
    assert set(listed) == set(scripts)
    assert "Train one stage" in listed["anchormass-train"]
    assert all(len(line.split(maxsplit=1)) == 2 for line in listed.values())  # every command has a summary
