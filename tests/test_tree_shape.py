"""The shape of the whole tree, read by tools/tree_report.py (``--json``, a subprocess: the files are read as
ASTs, nothing imported):

* no import circle anywhere: between modules (imports inside functions and bare names through sibling files
  or ``sys.path`` edits count), and, outside the package, between a wing's subpackages and modules (an import
  of ``studies.quality.x`` is one of ``studies.quality``: a module and a package that import each other are
  a circle too);
* no ``sys.path`` edit in benchmarks/, studies/, tools/ or examples/ (code a benchmark runs in a fresh
  interpreter is listed apart and allowed);
* outside the package, only ``benchmarks/seam.py`` and ``studies/seam.py`` import a private module or name of
  seta_stream;
* the layers of tools/layers.json: nothing outside the package imports up, every module outside it has a
  layer, and the speed benchmarks, the studies and the examples do not import each other; tools/ imports
  neither wing, and the examples import nothing of the repository but seta_stream's public modules.

The same checks run on a small tree with one fault of each kind, to show that each is caught.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "tree_report.py"
PACKAGE = "seta_stream"
OUTSIDE = ("benchmarks", "studies", "tools", "examples")
SEAMS = {"benchmarks/seam.py", "studies/seam.py"}


def report(root: Path, layers: Path) -> dict:
    out = subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), "--json", "--layers", str(layers)],
                         capture_output=True, text=True, check=True, timeout=300).stdout  # fmt: skip
    return json.loads(out)


def top(name: str) -> str:
    return name.split(".")[0]


def unit(name: str) -> str:
    """A module outside the package as the circle check between units sees it: ``studies.quality.x`` is
    ``studies.quality``; a wing's own modules (``studies.headline``) and packages stand for themselves."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else name


def circles(nodes: set[str], edges: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one node."""
    succ: dict[str, list[str]] = {n: sorted(b for a, b in edges if a == n and b != n) for n in nodes}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def problems(r: dict) -> list[str]:
    """Everything wrong with the tree's shape, one line each."""
    out = []
    g = r["graph"]
    out += [f"circle: {', '.join(c['modules'])}" for c in g["circles"]]
    edges = {(e["from"], e["to"]) for e in g["edge_list"]}
    outside = {(a, b) for a, b in edges if top(a) in OUTSIDE and top(b) in OUTSIDE}
    units = {(unit(a), unit(b)) for a, b in outside}
    seen = [c["modules"] for c in g["circles"]]
    out += [f"circle of units: {', '.join(c)}" for c in circles({n for e in units for n in e}, units) if c not in seen]
    out += [f"sys.path edit: {e['file']}:{e['line']} {e['call']}" for e in r["sys_path_edits"]["edits"]]
    for p in r["private_imports_from_outside"]["imports"] + r["private_attribute_uses_from_outside"]:
        if p["file"] not in SEAMS:
            out.append(f"private import outside the seams: {p['file']}:{p['line']} {p['private']}")
    lay = r["layers"]
    out += [f"upward: {u['from']} -> {u['to']}" for u in lay["upward"] if top(u["from"]) != PACKAGE]
    out += [f"between wings: {s['from']} -> {s['to']}" for s in lay["sideways"] if top(s["from"]) != PACKAGE]
    out += [f"no layer: {m}" for m in lay["unlayered"] if top(m) != PACKAGE]
    for a, b in sorted(edges):
        if top(a) == "tools" and top(b) not in ("tools", PACKAGE):
            out.append(f"tools imports {b}: {a}")
        if top(a) == "examples" and (top(b) != PACKAGE or any(p.startswith("_") for p in b.split(".")[1:])):
            out.append(f"an example imports {b}: {a}")
    return out


def test_this_tree_has_no_circle_no_path_edit_and_private_imports_only_in_the_seams() -> None:
    r = report(ROOT, ROOT / "tools" / "layers.json")
    assert problems(r) == []
    assert {top(m) for m in r["graph"]["depth_chain"]} <= {PACKAGE, *OUTSIDE}
    # the seams are used: each imports at least one private module, and nothing else outside the package does
    assert {p["file"] for p in r["private_imports_from_outside"]["imports"]} == SEAMS


FAULTS = {
    "seta_stream/__init__.py": "from . import _priv\n",
    "seta_stream/_priv.py": "X = 1\n",
    "benchmarks/__init__.py": "",
    "benchmarks/a.py": "import b\n",  # a bare-name circle: a -> b -> a
    "benchmarks/b.py": "def f():\n    import a\n",
    "benchmarks/seam.py": "from seta_stream._priv import X\n",
    "studies/__init__.py": "",
    "studies/scan.py": "from studies.pkg.m import Y\n",  # a module and a package that import each other
    "studies/pkg/__init__.py": "",
    "studies/pkg/m.py": "Y = 1\n",
    "studies/pkg/n.py": "import sys\nsys.path.insert(0, '.')\nfrom seta_stream._priv import X\n\n\ndef g():\n"
    "    from studies.scan import Y\n",
    "tools/t.py": "from benchmarks import a\n",
    "examples/e.py": "import benchmarks.a\n",
}


def test_each_fault_is_caught(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    for rel, text in FAULTS.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    layers = tmp_path / "layers.json"
    layers.write_text(json.dumps({"layers": {"seta_stream": 0, "tools": 1, "benchmarks": 2, "studies": 2,
                                             "examples": 2}, "independent": [["benchmarks"], ["studies"],
                                                                             ["examples"]]}))  # fmt: skip
    got = problems(report(root, layers))
    assert got == [
        "circle: benchmarks.a, benchmarks.b",
        "circle of units: studies.pkg, studies.scan",
        "sys.path edit: studies/pkg/n.py:2 sys.path.insert(0, '.')",
        "private import outside the seams: studies/pkg/n.py:3 seta_stream._priv",
        "upward: tools.t -> benchmarks.a",
        "between wings: examples.e -> benchmarks.a",
        "an example imports benchmarks.a: examples.e",
        "tools imports benchmarks.a: tools.t",
    ]


@pytest.mark.parametrize("module", ["benchmarks", "studies"])
def test_each_wing_lists_its_commands(module: str) -> None:
    proc = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    names = [line.split()[0] for line in proc.stdout.splitlines()[2:] if line.strip()]
    assert ("bench_plan" if module == "benchmarks" else "baselines_pairs") in names
    for name in names:  # each runnable as python -m WING.NAME too: a module of the wing (or of studies.quality)
        where = ROOT / module / f"{name}.py"
        assert where.exists() or (ROOT / module / "quality" / f"{name}.py").exists() or (ROOT / module / name).is_dir()
