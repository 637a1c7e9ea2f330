"""The tokenizer a checkpoint carries, so that it is evaluated, exported or trained from any folder.

Since this module exists a training checkpoint holds its tokenizer's files in
`hyper_parameters["tokenizer_files"]`: `{"kind": "sentencepiece" | "huggingface", "files":
{name: base64 text}}`. Text, not bytes, so that hyper-parameters stay JSON values (and torch's
weights-only unpickler reads them); base64 adds a third (a SentencePiece model is ~10 KB to ~1 MB,
an imported tokenizer.json a few MB). `tokenizer_path` (absolute) and `tokenizer_checksum` stay
beside it as provenance.

Which tokenizer a checkpoint means (`checkpoint_tokenizer`), in this order:
1. the recorded path, when it still holds the tokenizer of that checksum (a prepared dataset's
   copy: evaluation then also finds the dataset's val.bin beside it);
2. the carried bytes, written once into a content-addressed folder
   (`<cache>/anchormass/tokenizers/<sha256>/tokenizer.model` or `.../tokenizer/`), since the
   suites, the export and the evaluation record all want a path;
3. a checkpoint from before (path only, possibly relative to the folder it was trained in):
   the path from the current folder, then from each folder above the checkpoint (a run folder
   `runs/...` lies under the folder training ran in); otherwise one line naming `tokenizer=`.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any, Mapping

from anchormass.errors import CheckpointError, DataError

CARRIED_KEY = "tokenizer_files"


def carried(tok) -> dict[str, Any]:
    """What a checkpoint stores of `tok` (tokenizer_base.TokenizerBase)."""
    files = dict(tok.files) if tok.kind == "huggingface" else {tok.file_name: tok.model_bytes}
    return {"kind": tok.kind, "files": {name: base64.b64encode(data).decode("ascii") for name, data in files.items()}}


def from_carried(record: Mapping[str, Any], label: str = "<checkpoint>"):
    """The tokenizer object of a carried record (not written anywhere)."""
    from anchormass.data.hf_tokenizer import HFTokenizer
    from anchormass.data.tokenizer import Tokenizer

    kind = record.get("kind")
    try:
        files = {name: base64.b64decode(text, validate=True) for name, text in (record.get("files") or {}).items()}
    except (ValueError, TypeError):
        raise CheckpointError(f"{label}: its carried tokenizer is not base64 text; pass tokenizer=<path>") from None
    if kind == Tokenizer.kind and Tokenizer.file_name in files:
        return Tokenizer(files[Tokenizer.file_name], label)
    if kind == HFTokenizer.kind:
        return HFTokenizer(files, label)
    raise CheckpointError(f"{label}: its carried tokenizer has unknown kind {kind!r}; pass tokenizer=<path>")


def cache_root() -> Path:
    """Where carried tokenizers are written out: $ANCHORMASS_CACHE, else $XDG_CACHE_HOME/anchormass
    (~/.cache/anchormass)."""
    if os.environ.get("ANCHORMASS_CACHE"):
        return Path(os.environ["ANCHORMASS_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "anchormass"


def written_out(tok) -> Path:
    """A content-addressed copy of `tok` on disk (made once; equal content, equal folder)."""
    folder = cache_root() / "tokenizers" / tok.checksum
    path = folder / tok.file_name
    if not path.exists():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tok.save(folder)  # atomic file writes: two processes may write the same bytes at once
        except OSError as err:
            raise CheckpointError(f"cannot write the checkpoint's tokenizer into {folder} ({err.strerror or err}); "
                                  f"set ANCHORMASS_CACHE=<a writable folder> or pass tokenizer=<path>") from None
    return path


def _same(path: Path, checksum: str | None) -> bool:
    from anchormass.data.tokenizer_loader import load_tokenizer

    if not path.exists():
        return False
    if not checksum:
        return True
    try:
        return load_tokenizer(path).checksum == checksum
    except DataError:
        return False


def _old_style(named: str, ckpt: Path) -> Path:
    """A path-only record: as given if absolute, else from here, then from above the checkpoint."""
    path = Path(named).expanduser()
    if path.is_absolute():
        candidates = [path]
    else:
        candidates = [Path.cwd() / path, *(folder / path for folder in Path(ckpt).resolve().parents)]
    found = next((c for c in candidates if c.exists()), None)
    if found is None:
        where = "" if path.is_absolute() else " (from here or any folder above the checkpoint)"
        raise DataError(f"checkpoint {ckpt} names its tokenizer as {named}, not found{where}, and carries no "
                        f"copy (it predates that); pass tokenizer=<the tokenizer.model or tokenizer folder it was "
                        f"trained with>")
    return found


def checkpoint_tokenizer(hparams: Mapping[str, Any], ckpt: str | os.PathLike) -> Path | None:
    """The path of the tokenizer checkpoint `ckpt` (with `hparams`) was trained with, None if it
    records none (see the module docstring for the order)."""
    named, checksum = hparams.get("tokenizer_path"), hparams.get("tokenizer_checksum")
    record = hparams.get(CARRIED_KEY)
    if named and Path(str(named)).is_absolute() and record and _same(Path(str(named)), checksum):
        return Path(str(named))
    if record:
        tok = from_carried(record, f"{ckpt} (its carried tokenizer)")
        if checksum and tok.checksum != checksum:
            raise CheckpointError(f"checkpoint {ckpt}: its carried tokenizer (sha256 {tok.checksum[:12]}) is not "
                                  f"the one it records ({checksum[:12]}); pass tokenizer=<path>")
        return written_out(tok)
    return _old_style(str(named), Path(ckpt)) if named else None
