"""kvpress's presses on the same weights and prompts, answered in kvpress's own environment.

kvpress pins an older `transformers` than this project, so it runs as a separate interpreter
(`make kvpress-env` -> .venv-kvpress) on a Llama folder exported from the very checkpoint under
evaluation, answering the suite's prompts given as token ids (scripts/peers/kvpress_generate.py).
Scoring stays here, with the suite's own scorer, so every method is scored the same way. The
answers file (one per length) is kept beside the suite's other partial results and rewritten after
every item: a rerun answers only what is missing.
"""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

from anchormass.errors import ConfigError
from anchormass.utils import CHECKOUT, atomic_write_json

RUNNER = "scripts/peers/kvpress_generate.py"
log = logging.getLogger(__name__)


def runner_path() -> Path:
    if CHECKOUT is None or not (CHECKOUT / RUNNER).is_file():
        raise ConfigError(f"kv_frontier.kvpress needs a checkout (it runs {RUNNER}); "
                          "set kvpress.python=null to leave kvpress out")
    return CHECKOUT / RUNNER


def check_python(python: str) -> Path:
    path = Path(python).expanduser()
    if not path.is_absolute() and CHECKOUT is not None:
        path = CHECKOUT / path
    if not path.is_file():
        raise ConfigError(f"kv_frontier.kvpress.python={python}: no such interpreter (make kvpress-env builds "
                          f".venv-kvpress), or kvpress.python=null to leave kvpress out")
    return path


def export_folder(model, special_ids: dict[str, int], work: Path, session_len: int | None = None) -> Path:
    """The model as a native Llama folder (safetensors), written once per work folder and reused;
    past the trained length under NTK, one per prompt length (`session_len`, hf/export_llama.py)."""
    from anchormass.hf.export_llama import export_llama, past_trained_length

    past = past_trained_length(model.cfg, session_len)
    name = f"llama_ntk{session_len}" if past else "llama"
    folder = work / name
    if not (folder / "config.json").is_file():
        staging = work / f".{name}.partial"
        staging.mkdir(parents=True, exist_ok=True)
        export_llama(model, staging, special_ids, session_len if past else None)
        staging.rename(folder)
    return folder


def answer(python: Path, folder: Path, presses: list[dict], items: list[dict], new_tokens: int, work: Path,
           tag: str, threads: int = 1) -> dict:
    """{label: {item id: {"ids", "kept", "stored_bytes"}}} for every press spec and item. `tag` names
    this call's files (one per prompt length), so runs at different lengths can share a work folder."""
    spec = work / f"kvpress_items_{tag}.json"
    out = work / f"kvpress_answers_{tag}.json"
    atomic_write_json(spec, {"model": str(folder), "max_new_tokens": int(new_tokens), "presses": presses,
                             "items": items})
    done = subprocess.run([str(python), str(runner_path()), f"items={spec}", f"out={out}", f"threads={threads}"],
                          capture_output=True, text=True)
    log.info("kvpress runner: %s", done.stdout.strip().replace("\n", "; "))
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ConfigError(f"kv_frontier: kvpress runner failed (exit {done.returncode}): {last}")
    return json.loads(out.read_text())["answers"]
