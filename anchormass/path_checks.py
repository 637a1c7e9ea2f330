"""Names read from files that become folders stay inside the project's roots.

A curriculum's `name`, model labels, stage and evaluate keys are folders under its runs root
(runs_root/<name>/<model>/<stage>, runs_root/<name>/closing/<evaluate>); a data config's `name` is
data/<name> when it gives no `out_dir`; a shard's meta.json names the dataset a merge writes to
data/<name>. Each must be one plain path component, so `../../x` in a recipe or a meta.json cannot
make the project write (or replace a folder) outside those roots. A data config's relative
`out_dir` must lie under data/; an absolute one is a choice made on purpose (`data.out_dir=/tmp/x`)
and is kept, but without `..`; prepare_data then only creates it or replaces a prepared dataset
folder there (data/staged_folder.py build_folder).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from anchormass.errors import ConfigError
from anchormass.utils import resolve_path

DATA_ROOT = Path("data")  # relative: taken from the folder a command runs in (utils.resolve_path)


def check_folder_name(name: Any, what: str) -> str:
    """`name` as a string when it is one plain folder name; ConfigError (one line) otherwise."""
    text = str(name)
    seps = {"/", "\\", os.sep} | ({os.altsep} if os.altsep else set())
    if not text.strip() or text in (".", "..") or "\x00" in text or any(s in text for s in seps):
        raise ConfigError(f"{what} {text!r} must be a plain folder name (no '/', '\\\\' or '..'): it names a "
                          f"folder inside the project's runs or data root, and may not point outside it")
    return text


def check_data_out_dir(out_dir: Any, what: str = "data.out_dir") -> Path:
    """A data config's out_dir: relative ones inside data/, none with '..'. Returns it resolved
    by utils.resolve_path."""
    path = Path(str(out_dir)).expanduser()
    if ".." in path.parts or (not path.is_absolute() and path.parts[:1] != (DATA_ROOT.name,)):
        raise ConfigError(f"{what}={out_dir} points outside the data root: give a folder under "
                          f"{DATA_ROOT.name}/ (or an absolute path without '..')")
    return resolve_path(path)


def _entry_names(raw: Any, key_of) -> list[str]:
    """The keys of a mapping field, or each list entry's name (`key_of`, the recipe's own rule)."""
    if raw is None:
        return []
    if hasattr(raw, "items"):
        return [str(k) for k, v in raw.items() if v is not None]
    return [key_of(e) if hasattr(e, "get") else str(e) for e in raw]


def check_recipe_names(cfg: Any) -> None:
    """Every name of a curriculum recipe that becomes a folder under its runs root is a plain
    folder name (called by curriculum/recipe.py load_recipe before anything else)."""
    name = check_folder_name(cfg.get("name"), "curriculum.name")
    for label in _entry_names(cfg.get("models"), lambda m: str(m.get("name") or m.get("model"))):
        check_folder_name(label, f"curriculum {name}: model")
    for key in _entry_names(cfg.get("stages"), lambda e: str(e.get("name") or e.get("stage"))):
        check_folder_name(key, f"curriculum {name}: stage")
    for key in _entry_names(cfg.get("evaluate"), lambda e: str(e.get("name"))):
        check_folder_name(key, f"curriculum {name}: evaluate entry")


def check_not_link(path: Any, what: str) -> Path:
    """A results folder that is replaced as a whole when written (a staging folder renamed into
    place) must not be a symbolic link: replacing it would not follow the link, and removing the
    link's folder failed with a traceback after the whole evaluation had run. Checked up front."""
    path = Path(str(path)).expanduser()
    if path.is_symlink():
        raise ConfigError(f"{what} {path} is a symbolic link (to {os.readlink(path)}); results replace the folder "
                          f"as a whole and cannot go through a link: give the folder it points to, or another path")
    return path
