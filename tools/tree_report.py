#!/usr/bin/env python3
"""The shape of the source tree: lines per folder, the import graph between the repository's own
modules (its depth, its circles, the imports that run back up the layers), sys.path edits, private
imports from outside the package, and the package's public face.

    python tools/tree_report.py                               # text report of this checkout
    python tools/tree_report.py --layers tools/layers.json    # and the imports against the layers
    python tools/tree_report.py --json                        # the same as JSON
    python tools/tree_report.py --root OTHER_TREE --json

Standard library only: the files are read as ASTs, none of the project's modules is imported.

Definitions (what each figure counts):

* lines: physical lines of the ``.py`` files (a last line without its newline counts), per
  top-level folder present (seta_stream/, benchmarks/, studies/, tools/, examples/, tests/) and per
  folder below them, each with its own files' lines and with everything under it.
* modules: every ``.py`` file under seta_stream/, benchmarks/, studies/, tools/ and examples/, named by its
  path from the root (``studies/quality/study.py`` is ``studies.quality.study``, a
  package's ``__init__.py`` is the package). tests/ counts for lines and for private imports only.
* edges: ``import a.b`` and ``from a.b import c`` with ``a`` a top-level folder of the root;
  relative imports, resolved against the file's folder; bare names (``import common``), resolved
  to a sibling file, else to a folder the file adds to ``sys.path`` (when the argument reads
  literally: ``Path(__file__)``, ``.parent``, ``.parents[n]``, ``/ "literal"``, ``os.path``
  calls, and names assigned such values, here or in a module they are imported from), else to
  the one file or package of that name in the same top-level folder (names of the standard
  library are never resolved); ``importlib.import_module("literal")`` (relative ones against
  ``__name__``/``__package__``) and ``importlib.util.spec_from_file_location(name, PATH)`` with
  PATH readable as above. ``from a import b`` is an edge to ``a.b`` when that is a module, else
  to ``a`` (importing ``b`` from it); an edge goes to the module named, not to the packages
  above it. Imports inside functions count, flagged ``deferred``; the others carry ``bare``,
  ``dynamic``, ``file_load`` or ``type_checking`` flags where they apply.
* circles: strongly connected components of more than one module, with each edge's imports.
* depth: the longest chain of imports in the DAG of the components, counted in nodes (a module
  importing nothing of the repository has depth 1; a circle counts as one node), with one such
  chain; also for the package's modules alone.
* layers (``--layers FILE``): a JSON object whose ``layers`` (or the object itself) maps module
  name prefixes to numbers, lower = lower layer; a module takes the number of its longest
  matching prefix (``a.b`` matches ``a.b`` and ``a.b.c``, not ``a.bc``). An edge from a lower
  layer to a higher one runs back up. An optional ``independent`` list of wings (each a list of
  prefixes) names groups that must not import each other: an edge between two wings of the same
  layer is sideways (an edge from a wing down to a wing of a lower layer is an ordinary import).
* private: a name is private when it starts with ``_`` and is not a dunder (``__init__``,
  ``__main__``, ``__version__``...). A private import from outside the package is an import of a
  package module or name whose dotted path has a private component, made by a file outside the
  package (its ``private`` is the dotted path up to that component). Inside the package, a
  private name crossing modules is ``from .m import _name`` (``_name`` not a module) from another
  package module. Attribute uses (``mod._name`` where ``mod`` is bound by an import to a package
  module) are listed beside the imports, not counted in them.
* sys.path edits: ``sys.path.insert``/``sys.path.append`` calls, with the folder they add when
  it reads literally. The same calls inside string constants (code a benchmark runs in a fresh
  interpreter, whose path setting is part of what it measures) are listed apart and counted in no
  figure: not as edits, and their imports not as edges or private imports.
* public face: ``__all__`` of the package (read from its ``__init__.py``) and of each public
  submodule (no component of its name after the package with a leading ``_``, and not a
  ``__main__``). A public module without ``__all__`` exports its top-level definitions without
  a leading ``_`` (and ``import x as x`` re-exports), counted apart as "implied". A name is
  reachable twice when the object it names (followed through the imports to the module
  defining it) is exported by two or more public modules, the package included.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from pathlib import Path

PACKAGE = "seta_stream"
GRAPH_DIRS = ("seta_stream", "benchmarks", "studies", "tools", "examples")
LINES_ONLY_DIRS = ("tests",)
STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | {"__future__"}
PATH_TYPES = {"Path", "PurePath", "PosixPath", "PurePosixPath", "pathlib.Path", "pathlib.PurePath"}
SAME_PATH_CALLS = {"str", "os.fspath", "os.path.abspath", "os.path.realpath", "os.path.normpath", "fspath"}
SYS_PATH_CALLS = {"insert": 1, "append": 0}


def is_private(part: str) -> bool:
    dunder = part.startswith("__") and part.endswith("__") and len(part) > 4
    return part.startswith("_") and not dunder


def count_lines(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def py_files(top: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(
            d for d in dirnames if not d.startswith(".") and d != "__pycache__" and not d.endswith(".egg-info")
        )
        out.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return out


class Module:
    def __init__(self, root: Path, path: Path):
        self.path = path
        rel = path.relative_to(root)
        self.rel = rel.as_posix()
        parts = list(rel.with_suffix("").parts)
        self.is_package = parts[-1] == "__init__"
        if self.is_package:
            parts.pop()
        self.name = ".".join(parts)
        self.top = parts[0]
        self.package = self.name if self.is_package else self.name.rpartition(".")[0]
        text = path.read_text(encoding="utf-8", errors="replace")
        self.lines = count_lines(text)
        try:
            self.tree: ast.Module | None = ast.parse(text, filename=self.rel)
        except SyntaxError:
            self.tree = None
        self.events: list[tuple[str, ast.AST, ast.AST | None, bool]] = []  # kind, node, function, type_checking
        self.code_strings: list[int] = []  # lines of sys.path edits inside string constants
        self.syspath_dirs: list[Path] = []
        self._assigns: dict[str, list[tuple[int, ast.AST]]] | None = None
        if self.tree is not None:
            walker = Walker()
            walker.visit(self.tree)
            self.events = walker.events
            self.code_strings = walker.code_strings

    def top_assigns(self) -> dict[str, list[tuple[int, ast.AST]]]:
        """Module-level ``NAME = value`` (also inside module-level if/try/with blocks)."""
        if self._assigns is None:
            self._assigns = {}
            if self.tree is not None:
                for stmt in module_level(self.tree.body):
                    for name, value in assigned(stmt):
                        self._assigns.setdefault(name, []).append((stmt.lineno, value))
        return self._assigns


def module_level(body: list[ast.stmt]):
    for stmt in body:
        yield stmt
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for field in ("body", "orelse", "finalbody"):
            yield from module_level(getattr(stmt, field, None) or [])
        for handler in getattr(stmt, "handlers", None) or []:
            yield from module_level(handler.body)


def assigned(stmt: ast.AST):
    if isinstance(stmt, ast.Assign):
        for target in stmt.targets:
            if isinstance(target, ast.Name):
                yield target.id, stmt.value
    elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None and isinstance(stmt.target, ast.Name):
        yield stmt.target.id, stmt.value


def is_type_checking(test: ast.AST) -> bool:
    return dotted(test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


class Walker(ast.NodeVisitor):
    """Every import, sys.path edit, spec_from_file_location and import_module call of a file,
    with the function it sits in (None at module level)."""

    def __init__(self) -> None:
        self.functions: list[ast.AST] = []
        self.type_checking = 0
        self.events: list[tuple[str, ast.AST, ast.AST | None, bool]] = []
        self.code_strings: list[int] = []

    def _add(self, kind: str, node: ast.AST) -> None:
        self.events.append((kind, node, self.functions[-1] if self.functions else None, self.type_checking > 0))

    def visit_FunctionDef(self, node: ast.AST) -> None:
        self.functions.append(node)
        self.generic_visit(node)
        self.functions.pop()

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_Lambda = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        if not is_type_checking(node.test):
            self.generic_visit(node)
            return
        self.type_checking += 1
        for stmt in node.body:
            self.visit(stmt)
        self.type_checking -= 1
        for stmt in node.orelse:
            self.visit(stmt)

    def visit_Import(self, node: ast.Import) -> None:
        self._add("import", node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self._add("import", node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if isinstance(func, ast.Attribute) and func.attr in SYS_PATH_CALLS and dotted(func.value) == "sys.path":
            self._add("sys_path", node)
        elif name == "spec_from_file_location":
            self._add("file_load", node)
        elif name == "import_module":
            self._add("dynamic", node)
        self.generic_visit(node)

    def _code_string(self, text: str, lineno: int) -> None:
        for call in ("sys.path." + "insert(", "sys.path." + "append("):  # split: not a hit in this file
            start = text.find(call)
            while start >= 0:
                self.code_strings.append(lineno + text.count("\n", 0, start))
                start = text.find(call, start + 1)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            self._code_string(node.value, node.lineno)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        self._code_string(text, node.lineno)


class Tree:
    def __init__(self, root: Path, package: str = PACKAGE):
        self.root = root
        self.package = package
        self.modules: dict[str, Module] = {}
        self.by_path: dict[Path, Module] = {}
        self.tests: list[Module] = []
        self.line_files: dict[str, list[Module]] = {}
        for top in GRAPH_DIRS + LINES_ONLY_DIRS:
            if not (root / top).is_dir():
                continue
            mods = [Module(root, p) for p in py_files(root / top)]
            self.line_files[top] = mods
            for mod in mods:
                if top in GRAPH_DIRS:
                    self.modules[mod.name] = mod
                    self.by_path[mod.path] = mod
                else:
                    self.tests.append(mod)
        self.tops = {top for top in GRAPH_DIRS if (root / top).is_dir()}
        self.syspath_edits: list[dict] = []
        self.unresolved_dynamic: list[dict] = []
        self.edges: dict[tuple[str, str], list[dict]] = {}
        for mod in self.modules.values():
            self._read_sys_path(mod)
        for mod in self.modules.values():
            self._read_imports(mod)

    # -- modules by place -------------------------------------------------------------------

    def find(self, base: Path, parts: list[str]) -> tuple[Module | None, int]:
        """The module named by the longest prefix of ``parts`` under ``base``, and that length."""
        if not parts:
            return self.by_path.get(base / "__init__.py"), 0
        for k in range(len(parts), 0, -1):
            p = base.joinpath(*parts[:k])
            mod = self.by_path.get(p.with_name(p.name + ".py")) or self.by_path.get(p / "__init__.py")
            if mod is not None:
                return mod, k
        return None, 0

    def bases(self, mod: Module, level: int, parts: list[str], sys_path: bool = True) -> list[tuple[Path, str]]:
        """Where an import statement's module is looked up, in order, with the flag it carries."""
        if level:
            base = mod.path.parent
            for _ in range(level - 1):
                base = base.parent
            return [(base, "")]
        if not parts or parts[0] in STDLIB:
            return []
        if parts[0] in self.tops:
            return [(self.root, "")]
        out = [(mod.path.parent, "bare")]
        if sys_path:
            out += [(d, "bare") for d in mod.syspath_dirs]
        same_name = [
            m
            for m in self.modules.values()
            if m.top == mod.top and m.name.rpartition(".")[2] == parts[0] and m.name != mod.top
        ]
        if len(same_name) == 1:
            m = same_name[0]
            out.append(((m.path.parent.parent if m.is_package else m.path.parent), "bare"))
        return out

    def resolve(
        self, mod: Module, level: int, module: str | None, names: list[str] | None, sys_path: bool = True
    ) -> tuple[list[tuple[Module, list[str]]], str]:
        """[(target module, names imported from it)] of one import, and its flag. ``names`` is
        None for ``import module``."""
        parts = module.split(".") if module else []
        for base, flag in self.bases(mod, level, parts, sys_path):
            found: dict[str, tuple[Module, list[str]]] = {}
            if names is None:
                target, k = self.find(base, parts)
                if target is not None and k:
                    found[target.name] = (target, [])
            else:
                for name in names:
                    if name != "*":
                        sub, k = self.find(base, parts + [name])
                        if sub is not None and k == len(parts) + 1:
                            found.setdefault(sub.name, (sub, []))
                            continue
                    target, k = self.find(base, parts)
                    if target is not None and (k or level):
                        found.setdefault(target.name, (target, []))[1].append(name)
            if found:
                return [found[k] for k in sorted(found)], flag
        return [], ""

    # -- literal paths -----------------------------------------------------------------------

    def value(self, mod: Module, node: ast.AST, func: ast.AST | None, depth: int = 0) -> str | None:
        """A path or string expression read literally, else None."""
        if depth > 30:
            return None
        v = lambda n: self.value(mod, n, func, depth + 1)  # noqa: E731
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            if node.id == "__file__":
                return str(mod.path)
            return self.name_value(mod, node.id, func, node.lineno, depth + 1)
        if isinstance(node, ast.Attribute) and node.attr == "parent":
            base = v(node.value)
            return None if base is None else os.path.normpath(Path(base).parent)
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "parents"
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, int)
        ):
            base = v(node.value.value)
            if base is None:
                return None
            parents = Path(os.path.normpath(base)).parents
            return str(parents[node.slice.value]) if node.slice.value < len(parents) else None
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.Add)):
            left, right = v(node.left), v(node.right)
            if left is None or right is None:
                return None
            return str(Path(left) / right) if isinstance(node.op, ast.Div) else left + right
        if isinstance(node, ast.Call):
            name = dotted(node.func)
            args = [v(a) for a in node.args]
            if None in args or node.keywords:
                return None
            if name in PATH_TYPES:
                return str(Path(*args)) if args else None
            if name in SAME_PATH_CALLS and len(args) == 1:
                return os.path.normpath(args[0]) if name != "str" else args[0]
            if name == "os.path.dirname" and len(args) == 1:
                return os.path.dirname(args[0])
            if name == "os.path.join" and args:
                return os.path.join(*args)
            if isinstance(node.func, ast.Attribute):
                base = v(node.func.value)
                if base is None:
                    return None
                if node.func.attr in ("resolve", "absolute") and not args:
                    return os.path.normpath(base)
                if node.func.attr == "joinpath":
                    return str(Path(base).joinpath(*args))
        return None

    def name_value(self, mod: Module, name: str, func: ast.AST | None, lineno: int, depth: int) -> str | None:
        if func is not None:
            local = [
                (stmt.lineno, value)
                for stmt in ast.walk(func)
                for target, value in assigned(stmt)
                if target == name and stmt.lineno < lineno
            ]
            if local:
                return self.value(mod, max(local, key=lambda t: t[0])[1], func, depth)
        found = mod.top_assigns().get(name, [])
        before = [a for a in found if func is not None or a[0] < lineno] or found
        if before:
            return self.value(mod, before[-1][1], None, depth)
        if mod.tree is None:
            return None
        for stmt in module_level(mod.tree.body):
            if isinstance(stmt, ast.ImportFrom):
                for alias in stmt.names:
                    if (alias.asname or alias.name) == name:
                        targets, _ = self.resolve(mod, stmt.level, stmt.module, [alias.name], sys_path=False)
                        for target, imported in targets:
                            if imported:
                                return self.name_value(target, alias.name, None, 1 << 30, depth + 1)
        return None

    def location(self, path: str | None) -> str | None:
        if path is None:
            return None
        try:
            rel = Path(os.path.normpath(path)).relative_to(self.root).as_posix()
        except ValueError:
            return "<outside the root>"
        return rel

    # -- passes ------------------------------------------------------------------------------

    def _read_sys_path(self, mod: Module) -> None:
        for kind, node, func, _ in mod.events:
            if kind != "sys_path":
                continue
            index = SYS_PATH_CALLS[node.func.attr]
            arg = node.args[index] if len(node.args) > index else None
            path = None if arg is None else self.value(mod, arg, func)
            where = self.location(path)
            if path is not None and where != "<outside the root>" and Path(path).is_dir():
                d = Path(os.path.normpath(path))
                if d not in mod.syspath_dirs:
                    mod.syspath_dirs.append(d)
            self.syspath_edits.append(
                {
                    "file": mod.rel,
                    "line": node.lineno,
                    "call": " ".join(ast.unparse(node).split()),
                    "folder": where if path is not None else None,
                    "deferred": func is not None,
                }
            )

    def _edge(self, mod: Module, target: Module, node: ast.AST, names: list[str], flags: list[str]) -> None:
        if target.name == mod.name:
            return
        text = " ".join(ast.unparse(node).split())
        self.edges.setdefault((mod.name, target.name), []).append(
            {"file": mod.rel, "line": node.lineno, "import": text, "names": sorted(names), "flags": sorted(flags)}
        )

    def _read_imports(self, mod: Module) -> None:
        for kind, node, func, type_checking in mod.events:
            flags = (["deferred"] if func is not None else []) + (["type_checking"] if type_checking else [])
            if kind == "import":
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        targets, flag = self.resolve(mod, 0, alias.name, None)
                        for target, names in targets:
                            self._edge(mod, target, node, names, flags + ([flag] if flag else []))
                else:
                    names = [a.name for a in node.names]
                    targets, flag = self.resolve(mod, node.level, node.module, names)
                    for target, imported in targets:
                        self._edge(mod, target, node, imported, flags + ([flag] if flag else []))
            elif kind == "file_load":
                arg = (
                    node.args[1]
                    if len(node.args) > 1
                    else next((k.value for k in node.keywords if k.arg == "location"), None)
                )
                path = None if arg is None else self.value(mod, arg, func)
                target = None if path is None else self.by_path.get(Path(os.path.normpath(path)))
                if target is None:
                    self.unresolved_dynamic.append(
                        {"file": mod.rel, "line": node.lineno, "call": "spec_from_file_location"}
                    )
                else:
                    self._edge(mod, target, node, [], flags + ["file_load"])
            elif kind == "dynamic":
                full = literal_module(mod, node)
                targets = self.resolve(mod, 0, full, None)[0] if full else []
                if not targets:
                    self.unresolved_dynamic.append({"file": mod.rel, "line": node.lineno, "call": "import_module"})
                for target, _ in targets:
                    self._edge(mod, target, node, [], flags + ["dynamic"])


def literal_module(mod: Module, node: ast.Call) -> str | None:
    """The absolute module name of ``import_module("literal"[, __name__ or __package__])``."""
    if not node.args or not isinstance(node.args[0], ast.Constant) or not isinstance(node.args[0].value, str):
        return None
    name = node.args[0].value
    if not name.startswith("."):
        return name
    anchor = node.args[1] if len(node.args) > 1 else None
    if not isinstance(anchor, ast.Name) or anchor.id not in ("__name__", "__package__"):
        return None
    package = mod.name if anchor.id == "__name__" else mod.package
    level = len(name) - len(name.lstrip("."))
    parts = package.split(".")
    if level - 1 >= len(parts):
        return None
    base = parts[: len(parts) - (level - 1)]
    rest = name[level:]
    return ".".join(base + ([rest] if rest else []))


# -- graph -------------------------------------------------------------------------------------


def components(nodes: list[str], succ: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            children = succ.get(node, [])
            if i < len(children):
                work.append((node, i + 1))
                child = children[i]
                if child not in index:
                    work.append((child, 0))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                out.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return out


def depth(nodes: list[str], pairs: list[tuple[str, str]]) -> tuple[int, list[str]]:
    """Longest chain in the DAG of components, counted in nodes, and one such chain."""
    if not nodes:
        return 0, []
    keep = set(nodes)
    succ: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in pairs:
        if a in keep and b in keep:
            succ[a].append(b)
    comps = components(sorted(nodes), {n: sorted(set(s)) for n, s in succ.items()})
    comp_of = {n: i for i, comp in enumerate(comps) for n in comp}
    csucc: dict[int, set[int]] = {i: set() for i in range(len(comps))}
    for a, bs in succ.items():
        for b in bs:
            if comp_of[a] != comp_of[b]:
                csucc[comp_of[a]].add(comp_of[b])
    label = [c[0] if len(c) == 1 else "{" + ", ".join(c) + "}" for c in comps]
    best: dict[int, tuple[int, list[str]]] = {}
    # Tarjan emits components in reverse topological order: successors come first
    for i in range(len(comps)):
        options = [best[j] for j in csucc[i]]
        if options:
            longest = max(o[0] for o in options)
            chain = min(o[1] for o in options if o[0] == longest)
            best[i] = (longest + 1, [label[i]] + chain)
        else:
            best[i] = (1, [label[i]])
    top = max(v[0] for v in best.values())
    chain = min(v[1] for v in best.values() if v[0] == top)
    return top, chain


# -- layers ------------------------------------------------------------------------------------


def load_layers(path: Path) -> tuple[dict[str, float], list[list[str]]]:
    data = json.loads(path.read_text())
    mapping = data.get("layers", data) if isinstance(data, dict) else {}
    layers = {k: v for k, v in mapping.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    wings = data.get("independent", []) if isinstance(data, dict) else []
    return layers, [list(w) for w in wings]


def longest_prefix(name: str, prefixes) -> str | None:
    best = None
    for p in prefixes:
        if (name == p or name.startswith(p + ".")) and (best is None or len(p) > len(best)):
            best = p
    return best


def layer_report(tree: Tree, layers: dict[str, float], wings: list[list[str]]) -> dict:
    def layer(name: str):
        p = longest_prefix(name, layers)
        return None if p is None else layers[p]

    def wing(name: str):
        hits = [(len(p), i) for i, w in enumerate(wings) for p in w if name == p or name.startswith(p + ".")]
        return max(hits)[1] if hits else None

    upward, sideways = [], []
    for (a, b), occurrences in sorted(tree.edges.items()):
        la, lb = layer(a), layer(b)
        where = [f"{o['file']}:{o['line']}" for o in occurrences]
        if la is not None and lb is not None and la < lb:
            upward.append({"from": a, "to": b, "from_layer": la, "to_layer": lb, "gap": lb - la, "at": where})
        wa, wb = wing(a), wing(b)
        if wa is not None and wb is not None and wa != wb and la == lb:
            sideways.append({"from": a, "to": b, "at": where})
    upward.sort(key=lambda u: (-u["gap"], u["from"], u["to"]))
    return {
        "upward_count": len(upward),
        "upward": upward,
        "sideways_count": len(sideways),
        "sideways": sideways,
        "unlayered": sorted(n for n in tree.modules if layer(n) is None),
        "by_layer": {
            f"{k:g}": sorted(n for n in tree.modules if layer(n) == k)
            for k in sorted({layer(n) for n in tree.modules} - {None})
        },
        "wings": [sorted(n for n in tree.modules if wing(n) == i) for i in range(len(wings))],
    }


# -- private names -----------------------------------------------------------------------------


def private_prefix(parts: list[str], start: int = 1) -> str | None:
    for i in range(start, len(parts)):
        if is_private(parts[i]):
            return ".".join(parts[: i + 1])
    return None


def module_bindings(tree: Tree, mod: Module) -> dict[str, str]:
    """Local names a file binds to the package's modules (for attribute uses)."""
    out: dict[str, str] = {}
    for kind, node, _, _ in mod.events:
        if kind != "import":
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == tree.package:
                    out[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else tree.package
        elif mod.name in tree.modules or (node.level == 0 and (node.module or "").split(".")[0] == tree.package):
            targets, _ = tree.resolve(mod, node.level, node.module, [a.name for a in node.names])
            for target, imported in targets:
                if not imported and target.name.split(".")[0] == tree.package:
                    for alias in node.names:
                        if target.name.rpartition(".")[2] == alias.name:
                            out[alias.asname or alias.name] = target.name
    return out


def attribute_uses(tree: Tree, mod: Module, inside: bool) -> list[dict]:
    if mod.tree is None:
        return []
    bound = module_bindings(tree, mod)
    if not bound:
        return []
    out = []
    seen: set[int] = set()
    for node in ast.walk(mod.tree):
        if not isinstance(node, ast.Attribute) or id(node) in seen:
            continue
        chain = []
        cur: ast.AST = node
        while isinstance(cur, ast.Attribute):
            seen.add(id(cur))
            chain.append(cur.attr)
            cur = cur.value
        if not isinstance(cur, ast.Name) or cur.id not in bound:
            continue
        base = bound[cur.id]
        if inside and base == mod.name:
            continue
        parts = base.split(".") + list(reversed(chain))
        private = private_prefix(parts, len(base.split(".")))
        if private:
            out.append({"file": mod.rel, "line": node.lineno, "private": private})
    return out


def private_imports(tree: Tree, mod: Module) -> list[dict]:
    """Imports of the package's private modules and names by a file outside the package."""
    out = []
    for kind, node, func, _ in mod.events:
        found: list[tuple[str, list[str]]] = []
        if kind == "import" and isinstance(node, ast.Import):
            found = [(alias.name, []) for alias in node.names]
        elif kind == "import" and isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if private_prefix(node.module.split(".")):
                found = [(node.module, [a.name for a in node.names])]
            else:
                found = [(f"{node.module}.{a.name}", []) for a in node.names]
        elif kind == "dynamic":
            name = literal_module(mod, node)
            found = [(name, [])] if name else []
        elif kind == "file_load":
            for (a, b), occurrences in tree.edges.items():
                if a == mod.name and any(o["line"] == node.lineno and "file_load" in o["flags"] for o in occurrences):
                    found.append((b, []))
        for name, names in found:
            parts = name.split(".")
            if parts[0] != tree.package:
                continue
            private = private_prefix(parts)
            if private:
                out.append(
                    {
                        "file": mod.rel,
                        "line": node.lineno,
                        "private": private,
                        "is_module": private in tree.modules,
                        "names": sorted(names),
                        "deferred": func is not None,
                    }
                )
    return out


def private_inside(tree: Tree, mod: Module) -> list[dict]:
    """``from .other import _name`` (``_name`` not a module) between the package's modules."""
    out = []
    for kind, node, _, _ in mod.events:
        if kind != "import" or not isinstance(node, ast.ImportFrom):
            continue
        targets, _ = tree.resolve(mod, node.level, node.module, [a.name for a in node.names])
        for target, imported in targets:
            if target.name.split(".")[0] != tree.package or target.name == mod.name:
                continue
            for name in imported:
                if is_private(name):
                    out.append({"file": mod.rel, "line": node.lineno, "from": target.name, "name": name})
    return out


# -- public face -------------------------------------------------------------------------------


def read_all(mod: Module) -> list[str] | None:
    if mod.tree is None:
        return None
    names: list[str] | None = None

    def strings(value: ast.AST) -> list[str]:
        if isinstance(value, (ast.List, ast.Tuple)):
            return [e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        return []

    for stmt in module_level(mod.tree.body):
        for name, value in assigned(stmt):
            if name == "__all__":
                names = strings(value)
        if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == "__all__":
            names = (names or []) + strings(stmt.value)
        if (
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Call)
            and dotted(stmt.value.func) == "__all__.extend"
            and stmt.value.args
        ):
            names = (names or []) + strings(stmt.value.args[0])
    return names


def implied_exports(mod: Module) -> list[str]:
    out = set()
    for stmt in mod.tree.body if mod.tree is not None else []:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(stmt.name)
        for name, _ in assigned(stmt):
            out.add(name)
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            out.update(a.asname for a in stmt.names if a.asname and a.asname == a.name.rpartition(".")[2])
    return sorted(n for n in out if not n.startswith("_"))


def origin(tree: Tree, mod: Module, name: str, depth: int = 0) -> str:
    """The object a module's name stands for: ``module.name`` where it is defined, or the
    module's own name for a module."""
    if depth > 20 or mod.tree is None:
        return f"{mod.name}.{name}"
    for stmt in mod.tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.name == name:
            return f"{mod.name}.{name}"
        if any(n == name for n, _ in assigned(stmt)):
            return f"{mod.name}.{name}"
    for stmt in module_level(mod.tree.body):
        if isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if (alias.asname or alias.name) != name:
                    continue
                targets, _ = tree.resolve(mod, stmt.level, stmt.module, [alias.name])
                for target, imported in targets:
                    return origin(tree, target, alias.name, depth + 1) if imported else target.name
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname == name:
                    targets, _ = tree.resolve(mod, 0, alias.name, None)
                    if targets:
                        return targets[0][0].name
    if mod.is_package:
        sub = tree.modules.get(f"{mod.name}.{name}")
        if sub is not None:
            return sub.name
    return f"{mod.name}.{name}"


def public_face(tree: Tree) -> dict:
    pkg = tree.modules.get(tree.package)
    package_all = read_all(pkg) if pkg is not None else None
    public = [
        m
        for name, m in sorted(tree.modules.items())
        if name.startswith(tree.package + ".")
        and not any(is_private(p) or p == "__main__" for p in name.split(".")[1:])
    ]
    submodules = []
    exporters: dict[str, set[str]] = {}
    for m in ([pkg] if pkg is not None else []) + public:
        names = read_all(m)
        source = "__all__"
        if names is None:
            names, source = implied_exports(m), "implied"
        if m is not pkg:
            submodules.append({"module": m.name, "source": source, "count": len(names), "names": sorted(names)})
        for name in names:
            exporters.setdefault(origin(tree, m, name), set()).add(m.name)
    twice = [{"object": k, "exported_by": sorted(v)} for k, v in sorted(exporters.items()) if len(v) > 1]
    return {
        "package_all_count": len(package_all) if package_all is not None else None,
        "package_all": sorted(package_all) if package_all is not None else None,
        "public_submodules_count": len(submodules),
        "public_submodule_names_total": sum(s["count"] for s in submodules if s["source"] == "__all__"),
        "public_submodule_implied_total": sum(s["count"] for s in submodules if s["source"] == "implied"),
        "public_submodules": submodules,
        "reachable_twice_count": len(twice),
        "reachable_twice": twice,
    }


# -- report ------------------------------------------------------------------------------------


def line_report(tree: Tree) -> dict:
    folders: dict[str, dict[str, int]] = {}
    tops = {}
    for top, mods in tree.line_files.items():
        tops[top] = {"files": len(mods), "lines": sum(m.lines for m in mods)}
        for m in mods:
            parent = Path(m.rel).parent
            own = folders.setdefault(parent.as_posix(), {"files": 0, "lines": 0, "own_files": 0, "own_lines": 0})
            own["own_files"] += 1
            own["own_lines"] += m.lines
            for anc in [parent, *parent.parents][:-1]:
                f = folders.setdefault(anc.as_posix(), {"files": 0, "lines": 0, "own_files": 0, "own_lines": 0})
                f["files"] += 1
                f["lines"] += m.lines
    total = sum(t["lines"] for t in tops.values())
    graph_total = sum(t["lines"] for k, t in tops.items() if k in GRAPH_DIRS)
    return {
        "top_level": tops,
        "folders": {k: folders[k] for k in sorted(folders)},
        "total": total,
        "total_without_tests": graph_total,
    }


def build_report(root: Path, layers_path: Path | None, package: str = PACKAGE) -> dict:
    tree = Tree(root, package)
    names = sorted(tree.modules)
    pairs = sorted(tree.edges)
    succ: dict[str, list[str]] = {n: [] for n in names}
    for a, b in pairs:
        succ[a].append(b)
    circles = []
    for comp in sorted((c for c in components(names, succ) if len(c) > 1), key=lambda c: (-len(c), c)):
        members = set(comp)
        circles.append(
            {
                "modules": comp,
                "edges": [
                    {"from": a, "to": b, "imports": tree.edges[(a, b)]}
                    for a, b in pairs
                    if a in members and b in members
                ],
            }
        )
    d, chain = depth(names, pairs)
    lib = [n for n in names if n == package or n.startswith(package + ".")]
    ld, lchain = depth(lib, pairs)
    occurrences = [o for occ in tree.edges.values() for o in occ]
    flag_counts = {
        f: sum(1 for occ in tree.edges.values() if any(f in o["flags"] for o in occ))
        for f in ("deferred", "bare", "dynamic", "file_load", "type_checking")
    }
    outside = [m for m in tree.modules.values() if m.top != package]
    inside = [m for m in tree.modules.values() if m.top == package]
    priv_out = sorted(
        (p for m in outside for p in private_imports(tree, m)), key=lambda p: (p["file"], p["line"], p["private"])
    )
    priv_tests = sorted(
        (p for m in tree.tests for p in private_imports(tree, m)), key=lambda p: (p["file"], p["line"], p["private"])
    )
    priv_in = sorted(
        (p for m in inside for p in private_inside(tree, m)), key=lambda p: (p["file"], p["line"], p["name"])
    )
    attr_out = sorted(
        (p for m in outside for p in attribute_uses(tree, m, False)), key=lambda p: (p["file"], p["line"], p["private"])
    )
    attr_in = sorted(
        (p for m in inside for p in attribute_uses(tree, m, True)), key=lambda p: (p["file"], p["line"], p["private"])
    )

    def summary(items: list[dict]) -> dict:
        return {
            "count": len(items),
            "private_modules": sorted({p["private"] for p in items if p.get("is_module")}),
            "private_names": sorted({p["private"] for p in items if not p.get("is_module")}),
            "imports": items,
        }

    if layers_path is not None:
        layers, wings = load_layers(layers_path)
        try:
            shown = layers_path.resolve().relative_to(root).as_posix()
        except ValueError:
            shown = layers_path.name
        layer_part = {"file": shown, **layer_report(tree, layers, wings)}
    else:
        layer_part = {"file": None, "upward_count": 0, "upward": [], "sideways_count": 0, "sideways": []}

    return {
        "package": package,
        "lines": line_report(tree),
        "graph": {
            "modules": len(names),
            "edges": len(pairs),
            "import_statements": len(occurrences),
            "edges_with_flag": flag_counts,
            "depth": d,
            "depth_chain": chain,
            "package_depth": ld,
            "package_depth_chain": lchain,
            "circles_count": len(circles),
            "circles": circles,
            "unresolved_dynamic": sorted(tree.unresolved_dynamic, key=lambda u: (u["file"], u["line"])),
            "edge_list": [{"from": a, "to": b, "imports": tree.edges[(a, b)]} for a, b in pairs],
        },
        "layers": layer_part,
        "sys_path_edits": {
            "count": len(tree.syspath_edits),
            "edits": sorted(tree.syspath_edits, key=lambda e: (e["file"], e["line"])),
            "in_code_strings": sorted(f"{m.rel}:{line}" for m in tree.modules.values() for line in m.code_strings),
        },
        "private_imports_from_outside": summary(priv_out),
        "private_attribute_uses_from_outside": attr_out,
        "private_imports_from_tests": summary(priv_tests),
        "private_names_inside_package": {"count": len(priv_in), "imports": priv_in},
        "private_attribute_uses_inside_package": attr_in,
        "public_face": public_face(tree),
    }


def _short(mods: list[str], package: str) -> list[str]:
    """Module names with whole top-level folders folded into ``folder.*``."""
    tops: dict[str, int] = {}
    for m in mods:
        tops[m.split(".")[0]] = tops.get(m.split(".")[0], 0) + 1
    out = []
    for m in mods:
        top = m.split(".")[0]
        if top != package and tops[top] > 3:
            label = f"{top}.* ({tops[top]})"
            if label not in out:
                out.append(label)
        else:
            out.append(m)
    return out


def text_report(r: dict) -> str:
    out: list[str] = []
    w = out.append
    lines = r["lines"]
    w("== lines (physical lines of .py files) ==")
    for top, t in lines["top_level"].items():
        w(f"  {top + '/':<28} {t['lines']:>8}  ({t['files']} files)")
    w(f"  {'total':<28} {lines['total']:>8}  (without tests/: {lines['total_without_tests']})")
    w("  per folder (own files / with everything under it):")
    for folder, f in lines["folders"].items():
        w(f"    {folder + '/':<40} {f['own_lines']:>7} / {f['lines']:>7}  ({f['own_files']} / {f['files']} files)")
    g = r["graph"]
    w("")
    w("== import graph ==")
    w(f"  modules {g['modules']}, edges {g['edges']} (import statements {g['import_statements']})")
    w("  edges with a flag: " + ", ".join(f"{k} {v}" for k, v in g["edges_with_flag"].items()))
    w(f"  depth {g['depth']}: " + " -> ".join(g["depth_chain"]))
    w(f"  depth of the package alone {g['package_depth']}: " + " -> ".join(g["package_depth_chain"]))
    w(f"  circles: {g['circles_count']}")
    for c in g["circles"]:
        w(f"    circle of {len(c['modules'])}: {', '.join(c['modules'])}")
        for e in c["edges"]:
            for o in e["imports"]:
                flags = f" [{', '.join(o['flags'])}]" if o["flags"] else ""
                w(f"      {e['from']} -> {e['to']}  {o['file']}:{o['line']}  {o['import']}{flags}")
    if g["unresolved_dynamic"]:
        w(
            "  dynamic imports not read literally: "
            + ", ".join(f"{u['file']}:{u['line']}" for u in g["unresolved_dynamic"])
        )
    lay = r["layers"]
    w("")
    w("== layers ==")
    if lay["file"] is None:
        w("  no --layers file: no upward imports judged")
    else:
        w(f"  layers file {lay['file']}: {lay['upward_count']} upward imports, {lay['sideways_count']} between wings")
        for k, mods in lay["by_layer"].items():
            w(f"    layer {k} ({len(mods)}): " + ", ".join(_short(mods, r["package"])))
        for i, mods in enumerate(lay["wings"]):
            w(f"    wing {i + 1} ({len(mods)}): " + ", ".join(mods))
        for u in lay["upward"]:
            at = ", ".join(u["at"])
            w(f"    up {u['gap']:g}: {u['from']} ({u['from_layer']:g}) -> {u['to']} ({u['to_layer']:g})  {at}")
        for s in lay["sideways"]:
            w(f"    sideways: {s['from']} -> {s['to']}  {', '.join(s['at'])}")
        if lay["unlayered"]:
            w(f"  modules in no layer: {', '.join(lay['unlayered'])}")
    sp = r["sys_path_edits"]
    w("")
    w(f"== sys.path edits: {sp['count']} ==")
    for e in sp["edits"]:
        where = e["folder"] if e["folder"] is not None else "not read literally"
        w(f"  {e['file']}:{e['line']}  {e['call']} -> {where}{' [deferred]' if e['deferred'] else ''}")
    if sp["in_code_strings"]:
        w(f"  inside code strings ({len(sp['in_code_strings'])}): " + ", ".join(sp["in_code_strings"]))
    for key, title in (
        ("private_imports_from_outside", "private imports from outside the package"),
        ("private_imports_from_tests", "private imports from tests/ (not in the graph)"),
    ):
        p = r[key]
        w("")
        w(f"== {title}: {p['count']} ==")
        w(f"  private modules ({len(p['private_modules'])}): {', '.join(p['private_modules'])}")
        if p["private_names"]:
            w(f"  private names ({len(p['private_names'])}): {', '.join(p['private_names'])}")
        if key == "private_imports_from_outside":
            for i in p["imports"]:
                w(
                    f"    {i['file']}:{i['line']}  {i['private']}"
                    + (f" ({', '.join(i['names'])})" if i["names"] else "")
                )
    a = r["private_attribute_uses_from_outside"]
    if a:
        w(
            f"  attribute uses of private names from outside ({len(a)}): "
            + ", ".join(f"{x['file']}:{x['line']} {x['private']}" for x in a)
        )
    pin = r["private_names_inside_package"]
    w("")
    w(f"== private names imported across the package's modules: {pin['count']} ==")
    for i in pin["imports"]:
        w(f"    {i['file']}:{i['line']}  {i['from']}.{i['name']}")
    ain = r["private_attribute_uses_inside_package"]
    if ain:
        w(f"  attribute uses ({len(ain)}): " + ", ".join(f"{x['file']}:{x['line']} {x['private']}" for x in ain))
    pf = r["public_face"]
    w("")
    w("== public face ==")
    w(f"  {r['package']}.__all__: {pf['package_all_count']} names")
    w(f"    {', '.join(pf['package_all'] or [])}")
    w(
        f"  public submodules: {pf['public_submodules_count']}; names in their __all__: "
        f"{pf['public_submodule_names_total']} (+ {pf['public_submodule_implied_total']} implied where no __all__)"
    )
    for s in pf["public_submodules"]:
        w(f"    {s['module']:<40} {s['count']:>4}  ({s['source']})")
    w(f"  names reachable twice: {pf['reachable_twice_count']}")
    for t in pf["reachable_twice"]:
        w(f"    {t['object']}: {', '.join(t['exported_by'])}")
    return "\n".join(out) + "\n"


#: The figures ``--compare`` sets side by side: (label, path of keys into the report).
COMPARED = (
    ("modules of the repository", ("graph", "modules")),
    ("longest import chain (modules)", ("graph", "depth")),
    ("longest chain inside the package (modules)", ("graph", "package_depth")),
    ("import circles", ("graph", "circles_count")),
    ("imports that run up or sideways across layers", ("layers", "upward_count")),
    ("sys.path edits", ("sys_path_edits", "count")),
    ("private imports from outside the package", ("private_imports_from_outside", "count")),
    ("names in the package's __all__", ("public_face", "package_all_count")),
    ("public names reachable from two places", ("public_face", "reachable_twice_count")),
    ("lines of the package", ("lines", "top_level", "seta_stream", "lines")),
    ("lines of benchmarks/", ("lines", "top_level", "benchmarks", "lines")),
    ("lines of studies/", ("lines", "top_level", "studies", "lines")),
)


def compare_table(before: dict, after: dict) -> str:
    """A Markdown table of :data:`COMPARED` for two reports (``--json`` output); "-" where a
    report has no such figure (a folder that did not exist yet)."""

    def get(report: dict, keys: tuple[str, ...]) -> str:
        for k in keys:
            if not isinstance(report, dict) or k not in report:
                return "-"
            report = report[k]
        return f"{report:,}" if isinstance(report, int) else str(report)

    rows = ["| figure | before | after |", "| --- | --- | --- |"]
    rows += [f"| {label} | {get(before, keys)} | {get(after, keys)} |" for label, keys in COMPARED]
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="the repository root")
    parser.add_argument("--layers", type=Path, help="JSON file: module name prefixes -> layer numbers")
    parser.add_argument("--package", default=PACKAGE, help="the library's package (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"),
                        help="print a Markdown table of two --json reports' headline figures")  # fmt: skip
    args = parser.parse_args(argv)
    if args.compare:
        before, after = (json.loads(p.read_text()) for p in args.compare)
        sys.stdout.write(compare_table(before, after))
        return 0
    report = build_report(args.root.resolve(), args.layers, args.package)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        sys.stdout.write(text_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
