"""The benchmarks modules import each other without a circle (counting imports inside functions too),
and each imports on its own."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for p in (ROOT / "benchmarks").rglob("*.py")
)


def imports(name: str) -> set[str]:
    """The benchmarks modules ``name`` imports anywhere in its file."""
    path = ROOT / (name.replace(".", "/") + ("/__init__.py" if (ROOT / name.replace(".", "/")).is_dir() else ".py"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out |= {base} | {f"{base}.{a.name}" for a in node.names}
    return {m for m in out if m in MODULES and m != name}


def test_no_import_circle_among_the_benchmarks_modules() -> None:
    graph = {m: imports(m) for m in MODULES}
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        for n in sorted(graph[m]):
            if n in path:
                cycles.append(path[path.index(n) :] + [n])
            elif n not in done:
                visit(n, [*path, n])
        done.add(m)

    done: set[str] = set()
    for m in MODULES:
        if m not in done:
            visit(m, [m])
    assert cycles == []


STUDY_MODULES = [m for m in MODULES if "." in m and not m.split(".")[-1].startswith(("bench_", "ab_"))]


@pytest.mark.parametrize("name", STUDY_MODULES)
def test_each_study_module_imports(name: str) -> None:
    importlib.import_module(name)
