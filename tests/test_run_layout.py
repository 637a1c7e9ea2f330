"""The run-folder layout is stated once, in anchormass/runs/layout.py: no other module of the package
spells its names (a second spelling is how `source.parents[3]` and three `"checkpoints" / "last.ckpt"`
joins came about), and its helpers walk the layout both ways."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from anchormass.runs import layout

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "anchormass"
OWNER = Path("runs/layout.py")
# utils.py (layer 1, below runs/) tells any project output folder by a marker file, a run's result
# among them: it cannot ask runs/layout.py, so it states that one name itself.
ALLOWED = {(Path("utils.py"), layout.RESULT_FILE)}
NAMES = (layout.CHECKPOINTS, layout.LAST_CHECKPOINT, layout.RESULT_FILE, layout.STAGE_ARGS_FILE)


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def layout_literals(root: Path = PACKAGE_ROOT) -> list[str]:
    """`<file>:<line>: <name>` for each string literal (f-string parts included, docstrings and
    comments not) that names a part of the run-folder layout outside runs/layout.py."""
    hits = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel == OWNER:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in skip:
                continue
            segments = node.value.replace("\\", "/").split("/")
            for name in NAMES:
                if name in segments and (rel, name) not in ALLOWED:
                    hits.append(f"anchormass/{rel}:{node.lineno}: {name}")
    return sorted(hits)


def test_only_the_layout_module_names_the_run_folder_layout():
    hits = layout_literals()
    assert not hits, "ask anchormass/runs/layout.py instead:\n" + "\n".join(hits)


def test_the_check_finds_a_planted_spelling(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "layout.py").write_text('LAST = "last.ckpt"\n')
    (tmp_path / "clean.py").write_text('"""Reads checkpoints/last.ckpt (a docstring may say so)."""\n'
                                      "# and so may a comment: train_result.json\nX = 'logs'\n")
    assert layout_literals(tmp_path) == []
    (tmp_path / "eval.py").write_text('def f(run):\n    return run / "checkpoints" / "last.ckpt"\n'
                                      'G = f"{1}/stage_args.json"\n')
    assert layout_literals(tmp_path) == ["anchormass/eval.py:2: checkpoints", "anchormass/eval.py:2: last.ckpt",
                                         "anchormass/eval.py:3: stage_args.json"]


def test_the_layout_walks_from_a_checkpoint_back_to_its_seed_folder(tmp_path):
    root = layout.seed_folder(tmp_path / "study", 3)
    run = layout.stage_folder(root, "m", "s")
    ckpt = layout.last_checkpoint(run)
    assert ckpt == tmp_path / "study" / "seed3" / "m" / "s" / "checkpoints" / "last.ckpt"
    assert layout.seed_folder(tmp_path / "study", None) == tmp_path / "study"
    assert layout.run_of_checkpoint(ckpt) == run and layout.seed_folder_of(ckpt) == root
    assert not layout.finished_run(run)
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"")
    layout.result_file(run).write_text(json.dumps({"completed": True, "global_step": 4, "total_steps": 4}))
    assert layout.finished_run(run)
    layout.result_file(run).write_text(json.dumps({"completed": False, "global_step": 2, "total_steps": 4}))
    assert not layout.finished_run(run)
