"""Dependencies between the top-level parts of `anchormass` point one way.

Each top-level package or module has a layer; code may import only from strictly lower layers
(its own package aside), so no cycle can form and, for instance, the model never depends on the
cache or the inference engine that drive it. The imports are read from the source (ast), lazy
imports inside functions included, so nothing is executed.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "anchormass"

# Lower number = more basic. A new top-level package or module needs a line here.
LAYERS = {
    "errors": 0,                             # imports nobody from anchormass
    "utils": 1,                              # shared helpers; their errors are AnchorMassErrors
    "config_checks": 2, "logging_setup": 2,  # typed checks, console set-up
    "dir_lock": 2,                           # one writer per run directory
    "own_files": 2,                          # what the project may delete: the files it recorded writing
    "config_compose": 2,                     # config files composed as Hydra does, outside Hydra
    "path_checks": 2,                        # names read from files stay inside the runs / data roots
    "parent_death": 2,                       # child processes that end with their parent
    "extras": 2,                             # which optional extra a feature needs, named in one line
    "command_names": 2,                      # a command as this install calls it (console script or script)
    "cli": 3,                                # entry-point behaviour (one-line errors)
    "cli_help": 3,                           # entry points' --help, before torch loads
    "models": 4, "data": 4,                  # the networks; tokenizer and token files
    "cache": 5,                              # caches and stage-2 / KV policies, built for a model
    "inference": 6,                          # prefill + the one decode loop, over model and cache
    "training": 7,                           # how a model learns: Lightning module, loss, optimiser, checkpoints
    "runs": 8,                               # the run machinery: a run folder's layout, launch, resume, stop
    "bench": 9, "hf": 9,                     # benchmarks (may time training steps); HF export
    "eval": 10,                              # evaluation suites (may drive anything below)
    "curriculum": 11,                        # recipes, plans and runs of train.py / evaluate.py (drives all)
    "commands": 12,                          # the entry points' code (train.py, anchormass-train, ...): on top
    "__main__": 13,                          # `python -m anchormass`: lists the commands
}


def _top(name: str) -> str | None:
    """'anchormass.cache.base' -> 'cache'; names outside the package -> None."""
    parts = name.split(".")
    return parts[1] if parts[0] == "anchormass" and len(parts) > 1 else None


def imported_parts(path: Path, root: Path) -> set[str]:
    """Top-level parts of `anchormass` that the file at `path` imports."""
    module = path.relative_to(root.parent).with_suffix("").parts  # ('anchormass', 'cache', 'base')
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing module's package
                base = module[:len(module) - node.level]
                stem = ".".join(base + ((node.module,) if node.module else ()))
            else:
                stem = node.module or ""
            # `from anchormass import cache` names the part in the alias
            names = [f"{stem}.{a.name}" for a in node.names] if stem == "anchormass" else [stem]
        else:
            continue
        found.update(p for p in map(_top, names) if p is not None)
    return found


def layer_violations(root: Path = PACKAGE_ROOT, layers: dict[str, int] = LAYERS) -> list[str]:
    """One line per import that does not point to a strictly lower layer, or per unplaced part."""
    problems = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts == ("__init__.py",):
            continue
        part = rel.parts[0].removesuffix(".py")
        if part not in layers:
            problems.append(f"anchormass/{rel}: '{part}' has no layer in tests/test_import_layers.py LAYERS")
            continue
        for dep in sorted(imported_parts(path, root) - {part}):
            if dep not in layers or layers[dep] >= layers[part]:
                problems.append(f"anchormass/{rel}: {part} (layer {layers[part]}) imports {dep} "
                                f"(layer {layers.get(dep, '?')})")
    return problems


def test_imports_point_to_lower_layers_only():
    problems = layer_violations()
    assert not problems, "\n".join(problems)


def test_the_check_catches_a_model_importing_the_cache(tmp_path):
    pkg = tmp_path / "anchormass"
    for part, body in {"models/transformer.py": "from anchormass.errors import ConfigError\n",
                       "cache/base.py": "from anchormass.models import transformer\n",
                       "errors.py": "", "utils.py": ""}.items():
        (pkg / part).parent.mkdir(parents=True, exist_ok=True)
        (pkg / part).write_text(body)
    assert layer_violations(pkg) == []
    (pkg / "models/transformer.py").write_text("def f():\n    from anchormass.cache import new_cache\n")
    (pkg / "models/rope.py").write_text("from .. import inference\n")
    (pkg / "errors.py").write_text("from anchormass import utils\n")
    assert layer_violations(pkg) == [
        "anchormass/errors.py: errors (layer 0) imports utils (layer 1)",
        "anchormass/models/rope.py: models (layer 4) imports inference (layer 6)",
        "anchormass/models/transformer.py: models (layer 4) imports cache (layer 5)",
    ]
    (pkg / "newpart.py").write_text("")
    message = "anchormass/newpart.py: 'newpart' has no layer in tests/test_import_layers.py LAYERS"
    assert message in layer_violations(pkg)
