"""Import rules read from the source (ast), so nothing is executed: private names that cross a file,
and import cycles among a package's modules. Used by test_package_imports.py (the whole package) and
test_eval_suites_layout.py (eval/ and scripts/)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path


def parse(path: Path) -> ast.Module:
    """The file's syntax tree, parsed once per version of the file (the rules share it)."""
    stat = path.stat()
    return _parse(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=None)
def _parse(path: str, mtime_ns: int, size: int) -> ast.Module:
    return ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)


def module_name(path: Path, root: Path) -> str:
    """anchormass/data/prepare.py -> anchormass.data.prepare; a package's __init__.py -> the package."""
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def private_name_imports(paths: list[Path], root: Path, package: str | None = None) -> list[str]:
    """One line per `from m import _x`, or `m._x` on an imported module m, of a name private to m.
    With `package`, only modules of that package (and relative imports) count: another project's
    private names (torch._dynamo) are that project's business."""
    def ours(module: str | None, level: int) -> bool:
        return package is None or level > 0 or (module or "").split(".")[0] == package

    problems = []
    for path in paths:
        tree = parse(path)
        modules = set()  # names bound to imported modules (or what may be one: `from pkg import mod`)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__" and ours(node.module, node.level):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        problems.append(f"{path.relative_to(root)}: from {node.module} import {alias.name}")
                    modules.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                modules.update(alias.asname or alias.name.split(".")[0] for alias in node.names
                               if ours(alias.name, 0))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                    and _private(node.attr)):
                problems.append(f"{path.relative_to(root)}: {node.value.id}.{node.attr}")
    return problems


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_names_defined(tree: ast.Module) -> set[str]:
    """Private names a file defines: functions, methods, classes, variables, attributes it assigns."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    return {name for name in names if _private(name)}


def private_attribute_crossings(paths: list[Path], root: Path) -> list[str]:
    """One line per `obj._x` where `_x` is private to another file of `paths` (a method or attribute
    it defines) and this file defines no `_x` of its own: another class's insides read from
    outside (`attn._heads(...)` on a model's attention). `self._x`, `cls._x` and `super()._x` are the
    class's own (or its base's) business."""
    trees = {path: parse(path) for path in paths}
    defined = {path: _private_names_defined(tree) for path, tree in trees.items()}
    problems = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)) or node.attr in defined[path]:
                continue
            value = node.value
            if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                continue
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super":
                continue
            owners = sorted(str(other.relative_to(root)) for other, names in defined.items()
                            if other != path and node.attr in names)
            if owners:
                problems.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)} "
                                f"(private to {', '.join(owners)})")
    return problems


def _top_level_imports(tree: ast.Module):
    """Import statements that run when the module is imported: the module body, and the bodies of
    its module-level `if` / `try` blocks; not those inside functions or classes (lazy imports)."""
    pending = list(tree.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                pending.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            pending.extend(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])


def import_graph(paths: list[Path], root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same tree it imports when it is imported. `from pkg import x`
    is an edge to pkg.x where that is a module of the tree, else to pkg; importing pkg.mod also
    runs pkg/__init__.py, so it is an edge to every package on the way too."""
    modules = {module_name(path, root): path for path in paths}
    packages = {module_name(path, root) for path in paths if path.name == "__init__.py"}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        own_package = name.split(".") if name in packages else name.split(".")[:-1]
        edges: set[str] = set()
        for node in _top_level_imports(parse(path)):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = own_package[:len(own_package) - node.level + 1] if node.level else []
                stem = ".".join(base + ([node.module] if node.module else []))
                targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in modules else stem for a in node.names]
            for target in targets:
                parts = target.split(".")
                edges.update(".".join(parts[:i]) for i in range(1, len(parts) + 1)
                             if ".".join(parts[:i]) in modules)
        edges.discard(name)
        # A package's own __init__ runs before its modules: an edge from a module to the package
        # that holds it is the normal order of things, not a cycle.
        graph[name] = {e for e in edges if not name.startswith(e + ".")}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of the graph, one per strongly connected component of more than one module
    (Tarjan's algorithm), each as a closed path a -> b -> ... -> a, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(_closed_path(graph, component) for component in components)


def _closed_path(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One cycle through the component's first module: a shortest path back to it (breadth first)."""
    start, members = component[0], set(component)
    came_from = {start: None}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for nxt in sorted(graph[node] & members):
                if nxt == start:
                    path = [node]
                    while came_from[path[-1]] is not None:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    return component
