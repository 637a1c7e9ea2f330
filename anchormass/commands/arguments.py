"""What every Hydra command does with its arguments before Hydra sees them: answer `--help`
(before torch loads), then check the arguments in our words. Hydra would create its folders and
logs first and report a problem over several lines with exit 1; here each is one line and exit 2."""

from __future__ import annotations

import sys

from anchormass.cli import check_group_choices, check_overrides, quoted_where_needed
from anchormass.errors import ConfigError
from anchormass.utils import CONFIG_ROOT


def check_arguments(script: str, doc: str, config_name: str, groups: list[str],
                    choices: dict[str, list[str]] | None = None, *, options_in_help: bool = True,
                    follow_runner: bool = False, check=None) -> None:
    """`--help` for `script` (its `doc`, the config `groups` it reads, `choices` of other keys and,
    with `options_in_help`, configs/<config_name>.yaml's options), then `sys.argv` checked against
    configs/<config_name>.yaml: a non-ASCII path quoted so it stays a path, a `group=option` naming no
    file, an unknown key (and what `check` refuses in the composed config). `follow_runner`: a
    command a curriculum starts ends with its runner."""
    from anchormass.cli_help import exit_with_help

    exit_with_help(sys.argv[1:], script, doc, groups, config_name if options_in_help else None, choices)
    if follow_runner:
        from anchormass.runs.logged_process import follow_parent

        follow_parent()
    sys.argv[1:] = quoted_where_needed(sys.argv[1:])
    check_group_choices(CONFIG_ROOT, sys.argv[1:])
    check_overrides(CONFIG_ROOT, config_name, sys.argv[1:], check=check)


def require_paths(cfg, keys: tuple[str, ...], usage: str) -> None:
    """Refuse, in one line that shows the usage, a command line without one of the paths `keys`."""
    for key in keys:
        if not cfg.get(key):
            raise ConfigError(f"{key}=<path> is required ({usage})")
