"""How a command is called here, so that advice fits the install it is printed in.

In a checkout the commands are its scripts (`python train.py`, `python scripts/prepare_data.py`);
an installed package has console scripts (`anchormass-train`, `anchormass-prepare`) and neither
the scripts nor docs/. Messages name commands through `command`; `--help` text, written once in
the checkout's words, goes through `for_this_install`, which in an installed package names the
console scripts, the package's own configs folder, and the documents of the source repository
by their titles (a wheel has no docs/ to point into).
"""

from __future__ import annotations

import re

from anchormass.utils import CHECKOUT

# checkout script -> console script (pyproject.toml [project.scripts])
CONSOLE_SCRIPTS = {
    "train.py": "anchormass-train",
    "evaluate.py": "anchormass-eval",
    "scripts/prepare_data.py": "anchormass-prepare",
    "scripts/export_hf.py": "anchormass-export",
    "scripts/import_hf.py": "anchormass-import",
    "scripts/run_curriculum.py": "anchormass-curriculum",
}

# documents of the source repository, by title
DOC_TITLES = {
    "docs/method.md": 'the "Method" document',
    "docs/architecture.md": 'the "Architecture" document',
    "docs/training.md": 'the "Training" guide',
    "docs/evaluation.md": 'the "Evaluation" guide',
    "docs/install.md": 'the "Installing" guide',
    "data/README.md": 'the "Data formats" notes',
}


def command(script: str, checkout: object = CHECKOUT) -> str:
    """`python scripts/prepare_data.py` in a checkout, `anchormass-prepare` when installed."""
    if checkout is not None or script not in CONSOLE_SCRIPTS:
        return f"python {script}"
    return CONSOLE_SCRIPTS[script]


def for_this_install(text: str, checkout: object = CHECKOUT) -> str:
    """`text` as written in a checkout; installed, with console scripts, the package's configs
    folder and document titles in place of the checkout's scripts and paths."""
    if checkout is not None:
        return text
    for script, name in CONSOLE_SCRIPTS.items():
        text = text.replace(f"python {script}", name)
    text = re.sub(r"`([\w-]+)` or `\1`", r"`\1`", text)  # "`python train.py` or `anchormass-train`"
    for path, title in DOC_TITLES.items():
        text = re.sub(re.escape(path) + r"(#[\w-]+)?", title, text)
    return re.sub(r"(?<![\w/])configs/", "anchormass/configs/", text)
