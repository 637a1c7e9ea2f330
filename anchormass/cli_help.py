"""`--help` of the entry points, answered before torch, Lightning or Hydra's composition load.

Hydra's own help lists every config group in configs/ (a curriculum for export_hf.py) and no
suite names, after the entry point has imported torch (~6 s). Here each entry point names the
groups it reads; their presets are the YAML files in configs/<group>/, and the options are the
primary config's top-level keys with their defaults, read from the YAML file as written.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import yaml

from anchormass.utils import CONFIG_ROOT

HELP_FLAGS = ("--help", "-h")


def presets(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONFIG_ROOT) / group).glob("*.yaml"))


def options(config_name: str) -> list[str]:
    """`key=default` for the scalar top-level keys of configs/<config_name>.yaml."""
    path = Path(CONFIG_ROOT) / f"{config_name}.yaml"
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else {}
    shown = []
    for key, value in (raw or {}).items():
        if key in ("defaults", "hydra") or isinstance(value, dict):
            continue
        shown.append(f"{key}={'null' if value is None else str(value).lower() if isinstance(value, bool) else value}")
    return shown


def render(script: str, doc: str, groups: list[str], config_name: str | None = None,
           choices: dict[str, list[str]] | None = None) -> str:
    from anchormass.command_names import for_this_install

    lines = [for_this_install((doc or "").strip()), ""]
    listed = {**{g: presets(g) for g in groups}, **(choices or {})}
    if listed:
        lines.append("Choices (key=choice):")
        width = max(map(len, listed))
        for name, values in listed.items():
            lines += textwrap.wrap(", ".join(values), 100, initial_indent=f"  {name:<{width}}  ",
                                   subsequent_indent=" " * (width + 4), break_on_hyphens=False)
        lines.append("")
    if config_name and options(config_name):
        lines += ["Options (key=value; defaults shown):",
                  *textwrap.wrap("  ".join(options(config_name)), 100, initial_indent="  ", subsequent_indent="  ",
                                 break_on_hyphens=False, break_long_words=False), ""]
    command = invoked_as(script)
    lines += [f"The composed config: {command} [overrides] --cfg job. Hydra's own flags: --hydra-help.",
              f"Shell completion (bash): eval \"$({command} -sc install=bash)\"."]
    return "\n".join(lines)


def invoked_as(script: str) -> str:
    """`python train.py` from a checkout (or `python -m anchormass.commands.train`); the console
    script's own name (`anchormass-train`) when the installed command was run."""
    name = Path(sys.argv[0]).name
    return f"python {script}" if not name or name.endswith(".py") else name


def exit_with_help(argv: list[str], script: str, doc: str, groups: list[str], config_name: str | None = None,
                   choices: dict[str, list[str]] | None = None) -> None:
    """If `argv` asks for help, print it and exit 0."""
    if any(a in HELP_FLAGS for a in argv):
        print(render(script, doc, groups, config_name, choices))
        sys.exit(0)
