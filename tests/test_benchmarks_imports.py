"""Every module of the two wings (benchmarks/, studies/) and of tools/ imports on its own, through the one
way to import them (``benchmarks.x``, ``studies.x``, ``tools.x`` from the repository root). The benchmark
scripts themselves (``bench_*``, ``ab_*``) run in tests/test_benchmarks.py; circles, path edits and private
imports are tests/test_tree_shape.py's."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: run in a venv of their own (bash tools/openclip_check.sh: OpenCLIP's training code)
ELSEWHERE = {"tools.openclip_check"}


def _name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


MODULES = sorted(
    name
    for wing in ("benchmarks", "studies", "tools")
    for name in map(_name, (ROOT / wing).rglob("*.py"))
    if not name.split(".")[-1].startswith(("bench_", "ab_")) and name not in ELSEWHERE
)


def test_the_wings_have_modules() -> None:
    assert {"benchmarks.common", "benchmarks.seam", "studies.seam", "studies.engines.pairs", "tools.draws"} <= set(
        MODULES
    )


@pytest.mark.parametrize("name", MODULES)
def test_each_module_imports(name: str) -> None:
    importlib.import_module(name)
