"""Shared behaviour of the command-line entry points: one-line errors, non-zero exit."""

import functools
import sys

from anchormass.errors import AnchorMassError


def exit_on_error(fn):
    """Run `fn`; an `AnchorMassError` becomes `error: <message>` on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except AnchorMassError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)

    return wrapper


@exit_on_error
def check_group_choices(config_dir, argv: list[str]) -> None:
    """Refuse `group=option` overrides naming a config file that does not exist, in one line.

    Hydra reports these itself, but over several lines and with exit code 1, before any of our
    code runs; checking argv first keeps every entry point's bad-input contract (one line, exit 2).
    Sweeps (`model=a,b`) are checked option by option; anything that is not a plain group
    choice (dotted keys, lists, interpolations) is left to Hydra. Folders added with
    `hydra.searchpath=[file://...]` are searched too; other search-path kinds are Hydra's to check.
    """
    from pathlib import Path

    from anchormass.errors import ConfigError

    roots = [Path(config_dir)]
    for arg in argv:
        if arg.startswith("hydra.searchpath="):
            for entry in filter(None, arg.split("=", 1)[1].strip("[]").split(",")):
                if not entry.strip().startswith("file://"):
                    return
                roots.append(Path(entry.strip().removeprefix("file://")))
    for arg in argv:
        key, eq, value = arg.lstrip("+").partition("=")
        groups = [root / key for root in roots if (root / key).is_dir()]
        if not eq or "." in key or "/" in key or not groups:
            continue
        if any(c in value for c in "[]${}()/") or value.endswith(".yaml") or value in ("", "null"):
            continue
        for option in value.split(","):
            if not any((group / f"{option}.yaml").is_file() for group in groups):
                known = ", ".join(sorted({p.stem for group in groups for p in group.glob("*.yaml")}))
                raise ConfigError(f"unknown {key} '{option}'; choose one of: {known}")
