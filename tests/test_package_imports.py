"""Rules over the whole `anchormass` package, read from the source (ast; nothing is executed):
no file uses a name private to another file, no two modules import each other (a cycle, through
however many modules), no entry point edits sys.path or takes options another way than key=value,
and data/__init__.py's map of the data pipeline names every module of it."""

from __future__ import annotations

import ast
from pathlib import Path

from _import_rules import import_cycles, import_graph, parse, private_attribute_crossings, private_name_imports

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = sorted((ROOT / "anchormass").rglob("*.py"))
ENTRY_POINTS = sorted((ROOT / "scripts").glob("*.py")) + [ROOT / "train.py", ROOT / "evaluate.py"]


def test_no_file_imports_a_name_private_to_another():
    problems = private_name_imports(PACKAGE + ENTRY_POINTS, ROOT, package="anchormass")
    assert not problems, "\n".join(problems)


def test_no_file_reaches_into_another_files_private_attributes():
    problems = private_attribute_crossings(PACKAGE, ROOT)
    assert not problems, "\n".join(problems)


def test_no_import_cycle_among_the_packages_modules():
    cycles = import_cycles(import_graph(PACKAGE, ROOT))
    assert not cycles, "\n".join(" -> ".join(cycle) for cycle in cycles)


def sys_path_edits_and_argparse(paths: list[Path], root: Path) -> list[str]:
    """One line per `sys.path` change (the package is installed: `make setup`) and per import of
    argparse (options are key=value, Hydra's style, in every entry point)."""
    problems = []
    for path in paths:
        for node in ast.walk(parse(path)):
            if (isinstance(node, ast.Attribute) and node.attr in ("insert", "append", "extend")
                    and ast.unparse(node.value) == "sys.path"):
                problems.append(f"{path.relative_to(root)}:{node.lineno}: sys.path.{node.attr}")
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) else [])
            if "argparse" in names:
                problems.append(f"{path.relative_to(root)}:{node.lineno}: argparse")
    return problems


def test_no_sys_path_edits_and_one_option_style():
    problems = sys_path_edits_and_argparse(PACKAGE + ENTRY_POINTS, ROOT)
    assert not problems, "\n".join(problems)


def test_the_data_packages_docstring_names_each_of_its_modules():
    data = ROOT / "anchormass" / "data"
    doc = ast.get_docstring(ast.parse((data / "__init__.py").read_text(encoding="utf-8"))) or ""
    missing = [p.name for p in sorted(data.glob("*.py")) if p.name != "__init__.py" and p.name not in doc]
    assert not missing, f"anchormass/data/__init__.py does not list {missing}"


def _tree(root: Path, files: dict[str, str]) -> list[Path]:
    for name, body in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(body)
    return sorted(root.rglob("*.py"))


def test_the_checks_catch_planted_private_uses(tmp_path):
    paths = _tree(tmp_path, {
        "anchormass/__init__.py": "",
        "anchormass/models/__init__.py": "",
        "anchormass/models/attn.py": "class A:\n    def _heads(self, x):\n        return self._heads(x)\n",
        "anchormass/bench/report.py": "def _table(rows):\n    return rows\n",
        "anchormass/bench/check.py": "def f():\n    from anchormass.bench.report import _table\n",
        "anchormass/bench/probe.py": "from anchormass.bench import report\nreport._table([])\n",
        "anchormass/eval/slot.py": "def qkv(attn, x):\n    return attn._heads(x)\n",
        "anchormass/eval/own.py": "import torch\nclass B:\n    def _own(self):\n        pass\n"
                                  "def g(b):\n    torch._dynamo.reset()\n    return b._own(), super()._table\n",
    })
    assert private_name_imports(paths, tmp_path, package="anchormass") == [
        "anchormass/bench/check.py: from anchormass.bench.report import _table",
        "anchormass/bench/probe.py: report._table",
    ]
    assert private_attribute_crossings(paths, tmp_path) == [
        "anchormass/bench/probe.py:2: report._table (private to anchormass/bench/report.py)",
        "anchormass/eval/slot.py:2: attn._heads (private to anchormass/models/attn.py)",
    ]


def test_the_entry_point_check_catches_a_path_edit_and_argparse(tmp_path):
    paths = _tree(tmp_path, {"scripts/a.py": "import sys\nsys.path.insert(0, '..')\n",
                             "scripts/b.py": "def main():\n    import argparse\n",
                             "scripts/c.py": "import sys\nprint(sys.path)\n"})
    assert sys_path_edits_and_argparse(paths, tmp_path) == ["scripts/a.py:2: sys.path.insert",
                                                            "scripts/b.py:2: argparse"]


def test_the_cycle_check_catches_a_planted_cycle_and_ignores_lazy_imports(tmp_path):
    files = {
        "anchormass/__init__.py": "",
        "anchormass/data/__init__.py": "",
        "anchormass/data/prepare.py": "from anchormass.data.recall import write_recall\n",
        "anchormass/data/recall.py": "from anchormass.data import tokens\n",
        "anchormass/data/tokens.py": "def f():\n    from anchormass.data.prepare import prepare\n",
        "anchormass/data/longctx.py": "from .prepare import prepare\n",
    }
    assert import_cycles(import_graph(_tree(tmp_path, files), tmp_path)) == []  # the way back is lazy
    (tmp_path / "anchormass/data/tokens.py").write_text("try:\n    from . import prepare\nexcept ImportError:\n"
                                                        "    pass\n")
    assert import_cycles(import_graph(sorted(tmp_path.rglob("*.py")), tmp_path)) == [
        ["anchormass.data.prepare", "anchormass.data.recall", "anchormass.data.tokens", "anchormass.data.prepare"],
    ]
