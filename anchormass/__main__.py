"""`python -m anchormass`: the commands this install provides, one line each.

The list is the package's console scripts (its installed metadata), so it cannot drift from what
`pip install` put on PATH; each line's text is the first sentence of the command module's docstring.
Nothing here imports torch: it answers at once.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from importlib.metadata import PackageNotFoundError, distribution

COMMANDS_PACKAGE = "anchormass.commands."


def console_scripts() -> list[tuple[str, str]]:
    """(script name, module) of every anchormass console script, in name order."""
    try:
        entry_points = distribution("anchormass").entry_points
    except PackageNotFoundError:
        return []
    return sorted((ep.name, ep.value.split(":")[0]) for ep in entry_points
                  if ep.group == "console_scripts" and ep.value.startswith(COMMANDS_PACKAGE))


def summary(module: str) -> str:
    """The first sentence of a module's docstring, read from its source (no import, no torch)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return ""
    source = open(spec.origin, encoding="utf-8").read()
    match = re.match(r'\s*"""(.*?)(?:"""|\n\n)', source, re.S)
    text = " ".join(match.group(1).split()) if match else ""
    first = re.split(r"(?<=[.:])\s", text, maxsplit=1)[0].rstrip(":.")
    return re.sub(r"\s*\([^()]*`[^()]*\)$", "", first)  # drop "(or `anchormass-x`)": the name is beside it


def main() -> int:
    scripts = console_scripts()
    if not scripts:
        print("error: anchormass is not installed as a package (pip install -e . or make setup), "
              "so it has no commands on PATH", file=sys.stderr)
        return 2
    width = max(len(name) for name, _ in scripts)
    print("AnchorMass commands (each takes key=value options and answers --help):")
    for name, module in scripts:
        print(f"  {name:<{width}}  {summary(module)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
