"""tools/tree_report.py on a small fake tree: the exact circles, depth, sys.path edits, private
imports, upward imports and public face it reports."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "tree_report.py"

FILES = {
    "seta_stream/__init__.py": """
        from . import a
        from .a import thing
        from .c import pub

        __all__ = ["a", "thing", "pub"]
    """,
    "seta_stream/a.py": """
        from .b import other

        thing = 1
        __all__ = ["thing"]
    """,
    "seta_stream/b.py": """
        from . import a
        from ._priv import _hidden

        other = 2
    """,
    "seta_stream/c.py": """
        def pub():
            return 3


        __all__ = ["pub"]
    """,
    "seta_stream/_priv.py": """
        from .c import pub

        _hidden = pub()


        def helper():
            return _hidden
    """,
    "benchmarks/x.py": """
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        import y
        from seta_stream import a, __version__

        CODE = "import sys; sys.path.insert(0, 'elsewhere')"


        def run():
            return y
    """,
    "benchmarks/y.py": """
        def load():
            from x import run

            return run
    """,
    "tools/t.py": """
        import sys
        from pathlib import Path

        HERE = Path(__file__).parent
        sys.path.append(str(HERE.parent / "benchmarks"))

        import y
        from seta_stream._priv import helper
        from seta_stream.c import _secret
    """,
    "examples/e.py": """
        import importlib.util
        from pathlib import Path

        spec = importlib.util.spec_from_file_location("t", Path(__file__).parent.parent / "tools" / "t.py")
    """,
    "tests/test_fake.py": """
        from seta_stream import _priv
        from seta_stream import c
    """,
}

LAYERS = {
    "comment": "test layers",
    "layers": {
        "seta_stream": 1,
        "seta_stream.a": 0,
        "seta_stream.b": 0,
        "seta_stream._priv": 0,
        "benchmarks": 2,
        "tools": 2,
    },
}


def make_tree(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for rel, text in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    return root


def report(root: Path, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(root), "--json", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert str(root) not in out  # every path relative to the root
    return json.loads(out)


def line(rel: str, text: str) -> int:
    return textwrap.dedent(FILES[rel]).lstrip("\n").splitlines().index(text) + 1


def test_fake_tree(tmp_path):
    root = make_tree(tmp_path)
    layers = tmp_path / "layers.json"
    layers.write_text(json.dumps(LAYERS))
    r = report(root, "--layers", str(layers))
    assert str(tmp_path) not in json.dumps(r)

    lines = {k: v["lines"] for k, v in r["lines"]["top_level"].items()}
    expected = {}
    for rel, text in FILES.items():
        top = rel.split("/")[0]
        expected[top] = expected.get(top, 0) + len(textwrap.dedent(text).lstrip("\n").splitlines())
    assert lines == expected
    assert r["lines"]["total"] == sum(expected.values())
    assert r["lines"]["total_without_tests"] == sum(v for k, v in expected.items() if k != "tests")

    g = r["graph"]
    edges = {(e["from"], e["to"]) for e in g["edge_list"]}
    assert edges == {
        ("seta_stream", "seta_stream.a"),
        ("seta_stream", "seta_stream.c"),
        ("seta_stream.a", "seta_stream.b"),
        ("seta_stream.b", "seta_stream.a"),
        ("seta_stream.b", "seta_stream._priv"),
        ("seta_stream._priv", "seta_stream.c"),
        ("benchmarks.x", "benchmarks.y"),
        ("benchmarks.x", "seta_stream"),  # __version__, a name of the package
        ("benchmarks.x", "seta_stream.a"),  # a submodule
        ("benchmarks.y", "benchmarks.x"),
        ("tools.t", "benchmarks.y"),
        ("tools.t", "seta_stream._priv"),
        ("tools.t", "seta_stream.c"),
        ("examples.e", "tools.t"),
    }

    circles = {frozenset(c["modules"]) for c in g["circles"]}
    assert circles == {
        frozenset({"seta_stream.a", "seta_stream.b"}),
        frozenset({"benchmarks.x", "benchmarks.y"}),
    }
    circle_edges = {
        (e["from"], e["to"], tuple(o["names"]), tuple(o["flags"]))
        for c in g["circles"]
        for e in c["edges"]
        for o in e["imports"]
    }
    assert circle_edges == {
        ("seta_stream.a", "seta_stream.b", ("other",), ()),
        ("seta_stream.b", "seta_stream.a", (), ()),
        ("benchmarks.x", "benchmarks.y", (), ("bare",)),
        ("benchmarks.y", "benchmarks.x", ("run",), ("bare", "deferred")),
    }
    by_edge = {(e["from"], e["to"]): e["imports"] for e in g["edge_list"]}
    assert [o["flags"] for o in by_edge[("examples.e", "tools.t")]] == [["file_load"]]
    assert [o["flags"] for o in by_edge[("tools.t", "benchmarks.y")]] == [["bare"]]  # through its sys.path

    assert g["depth"] == 7
    assert g["depth_chain"] == [
        "examples.e",
        "tools.t",
        "{benchmarks.x, benchmarks.y}",
        "seta_stream",
        "{seta_stream.a, seta_stream.b}",
        "seta_stream._priv",
        "seta_stream.c",
    ]
    assert g["package_depth"] == 4

    edits = {(e["file"], e["line"], e["folder"], e["deferred"]) for e in r["sys_path_edits"]["edits"]}
    assert edits == {
        (
            "benchmarks/x.py",
            line("benchmarks/x.py", "sys.path.insert(0, str(Path(__file__).resolve().parents[1]))"),
            ".",
            False,
        ),
        ("tools/t.py", line("tools/t.py", 'sys.path.append(str(HERE.parent / "benchmarks"))'), "benchmarks", False),
    }
    assert r["sys_path_edits"]["count"] == 2
    code_line = line("benchmarks/x.py", "CODE = \"import sys; sys.path.insert(0, 'elsewhere')\"")
    assert r["sys_path_edits"]["in_code_strings"] == [f"benchmarks/x.py:{code_line}"]

    private = {
        (p["file"], p["line"], p["private"], p["is_module"]) for p in r["private_imports_from_outside"]["imports"]
    }
    assert private == {
        ("tools/t.py", line("tools/t.py", "from seta_stream._priv import helper"), "seta_stream._priv", True),
        ("tools/t.py", line("tools/t.py", "from seta_stream.c import _secret"), "seta_stream.c._secret", False),
    }
    assert r["private_imports_from_outside"]["count"] == 2
    assert r["private_imports_from_outside"]["private_modules"] == ["seta_stream._priv"]
    assert r["private_imports_from_tests"]["private_modules"] == ["seta_stream._priv"]
    inside = {(p["file"], p["from"], p["name"]) for p in r["private_names_inside_package"]["imports"]}
    assert inside == {("seta_stream/b.py", "seta_stream._priv", "_hidden")}

    lay = r["layers"]
    assert lay["file"] == "layers.json"
    assert {(u["from"], u["to"], u["gap"]) for u in lay["upward"]} == {("seta_stream._priv", "seta_stream.c", 1)}
    assert lay["upward_count"] == 1
    assert lay["unlayered"] == ["examples.e"]

    pf = r["public_face"]
    assert pf["package_all_count"] == 3
    assert pf["package_all"] == ["a", "pub", "thing"]
    assert [(s["module"], s["source"], s["names"]) for s in pf["public_submodules"]] == [
        ("seta_stream.a", "__all__", ["thing"]),
        ("seta_stream.b", "implied", ["other"]),
        ("seta_stream.c", "__all__", ["pub"]),
    ]
    assert pf["public_submodule_names_total"] == 2
    assert {(t["object"], tuple(t["exported_by"])) for t in pf["reachable_twice"]} == {
        ("seta_stream.a.thing", ("seta_stream", "seta_stream.a")),
        ("seta_stream.c.pub", ("seta_stream", "seta_stream.c")),
    }


def test_no_layers_file_no_upward_imports(tmp_path):
    root = make_tree(tmp_path)
    r = report(root)
    assert r["layers"]["upward"] == [] and r["layers"]["upward_count"] == 0
    assert r["graph"]["depth"] == 7
    text = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(root)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert "circles: 2" in text and "depth 7:" in text and str(tmp_path) not in text


def test_this_repository(tmp_path):
    r = report(ROOT, "--layers", str(ROOT / "tools" / "layers.json"))
    assert r["layers"]["file"] == "tools/layers.json"
    assert r["layers"]["unlayered"] == []
    assert r["public_face"]["package_all_count"] > 0


def test_compare_prints_both_reports_figures_and_a_dash_for_a_missing_one(tmp_path: Path) -> None:
    before = {"graph": {"modules": 3, "depth": 4, "package_depth": 2, "circles_count": 1},
              "lines": {"top_level": {"seta_stream": {"lines": 1200}}}}  # fmt: skip
    after = {"graph": {"modules": 5, "depth": 3, "package_depth": 2, "circles_count": 0},
             "lines": {"top_level": {"seta_stream": {"lines": 900}, "studies": {"lines": 40}}}}  # fmt: skip
    (tmp_path / "b.json").write_text(json.dumps(before))
    (tmp_path / "a.json").write_text(json.dumps(after))
    tool = Path(__file__).resolve().parent.parent / "tools" / "tree_report.py"
    out = subprocess.run([sys.executable, str(tool), "--compare", str(tmp_path / "b.json"), str(tmp_path / "a.json")],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    lines = out.splitlines()
    assert lines[:6] == [
        "| figure | before | after |",
        "| --- | --- | --- |",
        "| modules of the repository | 3 | 5 |",
        "| longest import chain (modules) | 4 | 3 |",
        "| longest chain inside the package (modules) | 2 | 2 |",
        "| import circles | 1 | 0 |",
    ]
    assert "| lines of the package | 1,200 | 900 |" in lines
    assert "| lines of studies/ | - | 40 |" in lines
    assert "| sys.path edits | - | - |" in lines
    assert len(lines) == 14
