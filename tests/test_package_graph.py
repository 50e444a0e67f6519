"""The shape of the package's imports (docs/architecture.md): no circle between its modules, no
private name crossing a module boundary, the reading side apart from planning, recording and the
policies, and each private subpackage importing only the layers below it.

The graph is read from the source (every import statement, those inside functions too) and the
names the package imports on first use (``seta_stream._ON_FIRST_USE``); importing a submodule
imports its package first, which is Python's doing and not an edge here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import seta_stream

PACKAGE = Path(seta_stream.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


FILES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _base(module: str, node: ast.ImportFrom) -> str:
    """The absolute module an ``from X import ...`` statement of ``module`` names."""
    if not node.level:
        return node.module or ""
    package = module if FILES[module].name == "__init__.py" else module.rpartition(".")[0]
    parts = package.split(".")
    parts = parts[: len(parts) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


def _imports(module: str) -> list[tuple[str, str | None, int]]:
    """(target module, name imported from it or None, line) of every import of ``module`` that
    reaches inside the package."""
    out = []
    for node in ast.walk(ast.parse(FILES[module].read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names if a.name in FILES]
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, node)
            for a in node.names:
                if f"{base}.{a.name}" in FILES:  # a submodule
                    out.append((f"{base}.{a.name}", None, node.lineno))
                elif base in FILES:
                    out.append((base, a.name, node.lineno))
    return out


def _graph() -> dict[str, set[str]]:
    graph = {m: {target for target, _, _ in _imports(m) if target != m} for m in FILES}
    for where, _ in seta_stream._ON_FIRST_USE.values():  # the package's imports on first use
        graph["seta_stream"].add("seta_stream" + where)
    return graph


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for n in graph[todo.pop()] - seen:
            seen.add(n)
            todo.append(n)
    return seen


def test_the_graph_reads_the_imports_it_should() -> None:
    """The reader of the graph sees relative, deferred and first-use imports (a check of the
    checks below)."""
    graph = _graph()
    assert "seta_stream._reading.planview" in graph["seta_stream._reading.stages"]  # relative
    assert "seta_stream._planning.transaction" in graph["seta_stream._cli"]  # inside a function
    assert "seta_stream._session" in graph["seta_stream"]  # on first use
    assert "seta_stream._kernels.draws" in graph["seta_stream._reading.planview"]


def test_no_circle_between_the_modules() -> None:
    graph = _graph()
    circles: list[list[str]] = []
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> None:
        for n in sorted(graph[m]):
            if n in path:
                circles.append(path[path.index(n) :] + [n])
            elif n not in done:
                visit(n, [*path, n])
        done.add(m)

    for m in sorted(graph):
        if m not in done:
            visit(m, [m])
    assert circles == []


def test_no_private_name_is_imported_across_modules() -> None:
    """A module imports another's public names only (private modules of private subpackages have
    plain names: ``_store.table``); a test may reach inside, the package may not."""
    crossing = [
        f"{FILES[m].relative_to(PACKAGE.parent)}:{line}: {name} from {target}"
        for m in FILES
        for target, name, line in _imports(m)
        if name is not None and name.startswith("_") and not name.startswith("__")
    ]
    assert crossing == []


def test_the_private_modules_of_subpackages_have_plain_names() -> None:
    private = ("_kernels", "_store", "_losses", "_planning", "_reading")
    for m in FILES:
        parts = m.split(".")
        if len(parts) > 2 and parts[1] in private:
            assert not parts[-1].startswith("_") or parts[-1] == "__init__", m


#: what each part of the package may import inside it (besides itself), from the bottom up
#: (docs/architecture.md, "Modules")
MAY_IMPORT = {
    "seta_stream.errors": set(),
    "seta_stream.ids": {"seta_stream.errors", "seta_stream._kernels"},
    "seta_stream._kernels": {"seta_stream.errors", "seta_stream.ids"},
    "seta_stream._store": {"seta_stream.errors", "seta_stream.ids", "seta_stream._kernels"},
    "seta_stream.policies": {"seta_stream.errors", "seta_stream.ids", "seta_stream._kernels"},
    "seta_stream._losses": {"seta_stream.errors", "seta_stream.ids", "seta_stream._kernels", "seta_stream._store"},
    "seta_stream._reading": {"seta_stream.errors", "seta_stream.ids", "seta_stream._kernels", "seta_stream._store"},
    "seta_stream._planning": {
        "seta_stream.errors",
        "seta_stream.ids",
        "seta_stream._kernels",
        "seta_stream._store",
        "seta_stream.policies",
    },
}


def _part(module: str) -> str:
    """The part of MAY_IMPORT ``module`` belongs to (the longest prefix named there), or itself."""
    for prefix in sorted(MAY_IMPORT, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return prefix
    return module


@pytest.mark.parametrize("part", sorted(MAY_IMPORT))
def test_each_part_imports_only_the_parts_below_it(part: str) -> None:
    graph = _graph()
    upward = sorted(
        f"{m} -> {n}"
        for m in graph
        if _part(m) == part
        for n in graph[m]
        if _part(n) != part and _part(n) not in MAY_IMPORT[part]
    )
    assert upward == []


@pytest.mark.parametrize(
    ("side", "apart"),
    [
        ("seta_stream._reading", ("seta_stream.policies", "seta_stream._planning", "seta_stream._losses")),
        ("seta_stream._planning", ("seta_stream._reading", "seta_stream._losses")),
        ("seta_stream._losses", ("seta_stream._reading", "seta_stream._planning", "seta_stream.policies")),
    ],
)
def test_reading_planning_and_recording_do_not_import_each_other(side: str, apart: tuple[str, ...]) -> None:
    """Not directly, nor through anything they import: a DataLoader worker that imports the
    stages imports no policy and nothing of planning (tests/test_worker_imports.py runs one)."""
    graph = _graph()
    reached = set().union(*(_reach(graph, m) for m in graph if m == side or m.startswith(side + ".")))
    assert sorted(m for m in reached if m.startswith(apart)) == []
