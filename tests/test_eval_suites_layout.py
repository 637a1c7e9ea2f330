"""The layout of anchormass/eval: one module per suite under eval/suites/ (or one package, for a suite
of several files), named by the registry; no suite imports another (what several share lives beside
the framework in eval/), and no module imports a private name of another. What the suites share stays
a few modules: eval/ holds at most MAX_SHARED of them beside the framework (suite.py, registry.py,
runner.py) and suites/, and no suite (all its files together) imports more than MAX_FAN_IN of them.
Imports are read from the source (ast), lazy ones inside functions included, so nothing is executed."""

from __future__ import annotations

import ast
from pathlib import Path

from _import_rules import private_name_imports

from anchormass.eval.registry import SUITES

ROOT = Path(__file__).resolve().parent.parent
EVAL_DIR = ROOT / "anchormass" / "eval"
SUITES_DIR = EVAL_DIR / "suites"
SUITE_MODULES = {target.split(":")[0] for target in SUITES.values()}
FRAMEWORK = {"__init__", "suite", "registry", "runner"}  # what every suite builds on: not counted
MAX_SHARED = 8  # modules in eval/ beside the framework and suites/
MAX_FAN_IN = 3  # of those, the most one suite imports


def _module_name(path: Path, root: Path) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts)


def imported_modules(path: Path, root: Path) -> set[str]:
    """Dotted names the file imports: `import a.b` -> a.b; `from a import b` -> a and a.b (b may be a module)."""
    package = _module_name(path, root).split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            stem = ".".join(base + ([node.module] if node.module else []))
            found.add(stem)
            found.update(f"{stem}.{alias.name}" for alias in node.names)
    return found


def _suite_of(module: str, suite_modules: set[str]) -> str | None:
    """The suite a module belongs to: the suite module itself, or a file of the suite's package."""
    return next((s for s in suite_modules if module == s or module.startswith(s + ".")), None)


def suite_import_violations(suites_dir: Path, suite_modules: set[str], root: Path) -> list[str]:
    """One line per import of a suite (its module or a file of its package) by a module of another suite."""
    problems = []
    for path in sorted(suites_dir.rglob("*.py")):
        own = _module_name(path, root)
        if own.endswith(".__init__"):
            own = own.removesuffix(".__init__")
        seen = set()
        for name in sorted(imported_modules(path, root)):  # `from m import x` reads as m and m.x: one line
            other = _suite_of(name, suite_modules)
            if other is not None and other != _suite_of(own, suite_modules) and other not in seen:
                seen.add(other)
                problems.append(f"{path.relative_to(root)} imports the suite module {name}")
    return problems


def shared_modules(eval_dir: Path) -> list[str]:
    """The modules of eval/ beside the framework and suites/: its .py files and its packages."""
    return sorted(p.stem for p in eval_dir.iterdir() if p.suffix == ".py" and p.stem not in FRAMEWORK) + sorted(
        p.name for p in eval_dir.iterdir() if p.is_dir() and p.name != "suites" and (p / "__init__.py").is_file())


def too_many_shared_modules(eval_dir: Path, limit: int = MAX_SHARED) -> str | None:
    """One line when eval/ holds more than `limit` shared modules, else None."""
    found = shared_modules(eval_dir)
    if len(found) <= limit:
        return None
    return f"eval/ holds {len(found)} modules beside the framework (at most {limit}): {', '.join(found)}"


def shared_fan_in(suites_dir: Path, suite_modules: set[str], root: Path) -> dict[str, set[str]]:
    """Per suite, the shared eval modules (not the framework, not suites/) that its files import, together:
    `from anchormass.eval.report import x` and `from anchormass.eval import report` both count as report."""
    eval_package = ".".join(suites_dir.relative_to(root).parts[:-1])  # anchormass.eval
    used: dict[str, set[str]] = {s: set() for s in suite_modules}
    for path in sorted(suites_dir.rglob("*.py")):
        suite = _suite_of(_module_name(path, root).removesuffix(".__init__"), suite_modules)
        if suite is None:
            continue
        for name in imported_modules(path, root):
            if name.startswith(eval_package + "."):
                part = name[len(eval_package) + 1:].split(".")[0]
                if part not in FRAMEWORK | {"suites"}:
                    used[suite].add(part)
    return used


def fan_in_violations(suites_dir: Path, suite_modules: set[str], root: Path, limit: int = MAX_FAN_IN) -> list[str]:
    """One line per suite that imports more than `limit` shared eval modules."""
    return [f"{suite} imports {len(parts)} shared eval modules (at most {limit}): {', '.join(sorted(parts))}"
            for suite, parts in sorted(shared_fan_in(suites_dir, suite_modules, root).items()) if len(parts) > limit]


def test_every_registered_suite_lives_in_eval_suites():
    for module in SUITE_MODULES:
        assert module.startswith("anchormass.eval.suites."), module
        path = ROOT / Path(*module.split("."))
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), module


def test_no_suite_module_imports_another():
    problems = suite_import_violations(SUITES_DIR, SUITE_MODULES, ROOT)
    assert not problems, "\n".join(problems)


def test_no_module_imports_a_private_name_of_another():
    paths = sorted((ROOT / "anchormass" / "eval").rglob("*.py")) + sorted((ROOT / "scripts").glob("*.py"))
    problems = private_name_imports(paths, ROOT)
    assert not problems, "\n".join(problems)


def test_the_checks_catch_a_suite_importing_a_suite_and_a_private_import(tmp_path):
    suites = tmp_path / "anchormass" / "eval" / "suites"
    suites.mkdir(parents=True)
    (suites / "a.py").write_text("from anchormass.eval.report import holm\n")
    (suites / "b.py").write_text("def f():\n    from anchormass.eval.suites.a import X\n")
    (suites / "c.py").write_text("from . import a\nfrom anchormass.eval.report import _save\n")
    (suites / "d.py").write_text("from anchormass.eval import report\nreport._save(None, None)\n")
    (suites / "p").mkdir()  # a suite package: its files import each other, not another suite
    (suites / "p" / "__init__.py").write_text("from anchormass.eval.suites.p.parts import Y\n")
    (suites / "p" / "parts.py").write_text("from anchormass.eval.suites.a.z import W\n")
    modules = {"anchormass.eval.suites.a", "anchormass.eval.suites.b", "anchormass.eval.suites.p"}
    assert suite_import_violations(suites, modules, tmp_path) == [
        "anchormass/eval/suites/b.py imports the suite module anchormass.eval.suites.a",
        "anchormass/eval/suites/c.py imports the suite module anchormass.eval.suites.a",
        "anchormass/eval/suites/p/parts.py imports the suite module anchormass.eval.suites.a.z",
    ]
    assert private_name_imports(sorted(suites.glob("*.py")), tmp_path) == [
        "anchormass/eval/suites/c.py: from anchormass.eval.report import _save",
        "anchormass/eval/suites/d.py: report._save",
    ]


def test_eval_holds_few_shared_modules_and_no_suite_imports_many():
    assert too_many_shared_modules(EVAL_DIR) is None, too_many_shared_modules(EVAL_DIR)
    problems = fan_in_violations(SUITES_DIR, SUITE_MODULES, ROOT)
    assert not problems, "\n".join(problems)


def test_the_checks_catch_too_many_shared_modules_and_a_suite_importing_many(tmp_path):
    evaldir = tmp_path / "anchormass" / "eval"
    suites = evaldir / "suites"
    (suites / "p").mkdir(parents=True)
    for name in ["__init__", "suite", "registry", "runner", "a", "b", "c", "d"]:
        (evaldir / f"{name}.py").write_text("")
    (evaldir / "e").mkdir()  # a shared package counts as one module
    (evaldir / "e" / "__init__.py").write_text("")
    assert shared_modules(evaldir) == ["a", "b", "c", "d", "e"]
    assert too_many_shared_modules(evaldir, limit=5) is None
    assert too_many_shared_modules(evaldir, limit=4) == (
        "eval/ holds 5 modules beside the framework (at most 4): a, b, c, d, e")
    # the framework and other suites are not counted; `from eval import m` and `from eval.m import x` are m
    (suites / "one.py").write_text("from anchormass.eval import a, b\nfrom anchormass.eval.c import X\n"
                                   "from anchormass.eval.suite import Suite\nfrom anchormass.eval.runner import run\n")
    (suites / "p" / "__init__.py").write_text("from anchormass.eval.a import X\nfrom anchormass.eval.b.y import Y\n")
    (suites / "p" / "parts.py").write_text("def f():\n    from anchormass.eval.c import Z\n"
                                           "    from anchormass.eval import d\n")
    modules = {"anchormass.eval.suites.one", "anchormass.eval.suites.p"}
    assert shared_fan_in(suites, modules, tmp_path) == {"anchormass.eval.suites.one": {"a", "b", "c"},
                                                          "anchormass.eval.suites.p": {"a", "b", "c", "d"}}
    assert fan_in_violations(suites, modules, tmp_path) == [
        "anchormass.eval.suites.p imports 4 shared eval modules (at most 3): a, b, c, d"]
