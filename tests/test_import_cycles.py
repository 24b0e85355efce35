"""No import cycle among the package's modules (issue 52): every import counts, a late one inside a
function as much as one at the top, since either way each module needs the other."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, anywhere in its code."""
    modules = {}
    for path in root.joinpath("otel_train").rglob("*.py"):
        name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    # The C extensions are modules too: `from otel_train.detect import _loops` imports `_loops`, not
    # a name from the package's `__init__`. They import nothing of ours, so they have no edges.
    extensions = tomllib.loads(root.joinpath("pyproject.toml").read_text())["tool"]["setuptools"]["ext-modules"]
    graph: dict[str, set[str]] = {name: set() for name in [*modules, *(e["name"] for e in extensions)]}

    def visit(name: str, package: str, tree: ast.AST) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                graph[name].update(a.name for a in node.names if a.name in graph)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    graph[name].add(target if target in graph else base)

    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        visit(name, package, ast.parse(path.read_text()))
        graph[name] = {target for target in graph[name] if target in graph and target != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in graph:
        if v not in index:
            strong(v)
    return found


def test_no_import_cycle() -> None:
    found = [sorted(c) for c in _cycles(_graph())]
    assert not found, found


def test_the_check_sees_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_the_graph_sees_late_imports_and_c_extensions(tmp_path: Path) -> None:
    """A function's import is an edge; `from pkg import _ext` of a C extension is one to `_ext`,
    not to the package's `__init__`."""
    tmp_path.joinpath("pyproject.toml").write_text(
        '[[tool.setuptools.ext-modules]]\nname = "otel_train.p._ext"\nsources = ["otel_train/p/_ext.c"]\n')
    package = tmp_path / "otel_train" / "p"
    package.mkdir(parents=True)
    tmp_path.joinpath("otel_train", "__init__.py").write_text("")
    package.joinpath("__init__.py").write_text("from otel_train.p import a\n")
    package.joinpath("a.py").write_text("from otel_train.p import _ext\nfrom otel_train.p.b import f\n")
    package.joinpath("b.py").write_text("def f():\n    from otel_train.p import a\n")
    graph = _graph(tmp_path)
    assert graph["otel_train.p.a"] == {"otel_train.p._ext", "otel_train.p.b"}
    assert graph["otel_train.p.b"] == {"otel_train.p.a"}
    assert _cycles(graph) == [{"otel_train.p.a", "otel_train.p.b"}]
