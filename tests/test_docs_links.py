"""README.md and docs/**/*.md: every relative link and image resolves to a file of the repository,
every anchor (``#heading``) to a heading of its target by GitHub's slug rules, the docs index
(docs/README.md) links every page in docs/, and README stays short (at most 250 lines, no paragraph,
list item or table row over 600 characters; code blocks do not count).

The Markdown is parsed by markdown-it-py (CommonMark plus tables), so links inside code spans and
code blocks are not links, as on GitHub.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from urllib.parse import unquote

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES, MAX_PARAGRAPH = 250, 600
HTML_REF = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
HTML_ID = re.compile(r"""<a\s[^>]*\b(?:id|name)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)


def _md() -> MarkdownIt:
    return MarkdownIt("commonmark").enable("table")


def github_slug(text: str) -> str:
    """GitHub's heading anchor (github-slugger): lower case, every character that is not a letter,
    a digit, ``_``, ``-`` or a space removed, each space a ``-``."""
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def _inline_text(tok) -> str:  # noqa: ANN001 - a markdown-it inline token
    """The text GitHub renders for an inline token: text and code spans, without markup or HTML tags."""
    return "".join(c.content for c in tok.children or [] if c.type in ("text", "code_inline"))


def anchors(text: str) -> set[str]:
    """The anchors of a Markdown document: its headings' slugs (a repeated slug gets -1, -2, ...,
    as on GitHub) and the ids of explicit ``<a id=...>``/``<a name=...>`` tags."""
    tokens = _md().parse(text)
    seen: dict[str, int] = {}
    out: set[str] = set()
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open":
            base = github_slug(_inline_text(tokens[i + 1]))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
        if tok.type in ("html_block", "html_inline", "inline"):
            pieces = [tok.content] + [c.content for c in tok.children or [] if c.type == "html_inline"]
            for piece in pieces:
                out.update(HTML_ID.findall(piece))
    return out


def links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every link, image and HTML href/src of a Markdown document."""
    out: list[tuple[int, str]] = []
    for tok in _md().parse(text):
        line = (tok.map[0] + 1) if tok.map else 0
        if tok.type == "html_block":
            out += [(line, t) for t in HTML_REF.findall(tok.content)]
        for c in tok.children or []:
            if c.type == "link_open":
                out.append((line, str(c.attrs["href"])))
            elif c.type == "image":
                out.append((line, str(c.attrs["src"])))
            elif c.type == "html_inline":
                out += [(line, t) for t in HTML_REF.findall(c.content)]
    return out


def broken_links(files: list[Path], root: Path) -> list[str]:
    """'file:line: target (why)' for every relative link of ``files`` that does not resolve."""
    cache: dict[Path, set[str]] = {}
    bad = []
    for f in files:
        for line, target in links(f.read_text()):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # https:, mailto:, ...
                continue
            path, _, frag = target.partition("#")
            dest = (f.parent / unquote(path)).resolve() if path else f.resolve()
            where = f"{f.relative_to(root)}:{line}: {target}"
            if not dest.is_relative_to(root.resolve()):
                bad.append(f"{where} (outside the repository)")
            elif not dest.exists():
                bad.append(f"{where} (no such file)")
            elif frag and dest.suffix == ".md":
                if dest not in cache:
                    cache[dest] = anchors(dest.read_text())
                if unquote(frag) not in cache[dest]:
                    bad.append(f"{where} (no heading or anchor '{frag}' in {dest.relative_to(root.resolve())})")
    return bad


def long_paragraphs(text: str, limit: int = MAX_PARAGRAPH) -> list[str]:
    """'line N: K characters' for each paragraph, list item paragraph or table row over ``limit``
    characters of Markdown source (code blocks and HTML blocks are not paragraphs)."""
    lines = text.splitlines()
    out = []
    for tok in _md().parse(text):
        if tok.type in ("paragraph_open", "tr_open") and tok.map:
            src = "\n".join(x.strip() for x in lines[tok.map[0] : tok.map[1]])
            if len(src) > limit:
                out.append(f"line {tok.map[0] + 1}: {len(src)} characters")
    return out


def doc_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


# ------------------------------------------------------------------------------ the repository
def test_every_relative_link_and_anchor_in_readme_and_docs_resolves() -> None:
    assert broken_links(doc_files(), ROOT) == []


def test_readme_is_at_most_250_lines_with_no_paragraph_over_600_characters() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= MAX_LINES
    assert long_paragraphs(text) == []


def test_the_docs_index_links_every_page_and_readme_links_the_index() -> None:
    index = ROOT / "docs" / "README.md"
    linked = {(index.parent / unquote(t.partition("#")[0])).resolve() for _, t in links(index.read_text())}
    pages = {p.resolve() for p in (ROOT / "docs").rglob("*.md") if p != index}
    assert sorted(str(p.relative_to(ROOT)) for p in pages - linked) == []
    readme = {(ROOT / unquote(t.partition("#")[0])).resolve() for _, t in links((ROOT / "README.md").read_text())}
    assert index.resolve() in readme


def test_readme_keeps_the_two_commands_first_and_second() -> None:
    """.ci/run runs tools/test.sh, README's second command."""
    blocks = [t.content for t in _md().parse((ROOT / "README.md").read_text()) if t.type == "fence"]
    commands = [x.split("#")[0].strip() for b in blocks for x in b.splitlines() if x.strip().startswith("bash ")]
    assert commands[:2] == ["bash tools/demo.sh", "bash tools/test.sh"]
    assert "exec bash tools/test.sh" in (ROOT / ".ci" / "run").read_text()


# ------------------------------------------------------------------------------ the checker itself
def test_the_slugs_follow_githubs_rules() -> None:
    text = (
        "# Web scale: partitioned runs and a Ray cluster\n\n## `seta.weighted_mean` (the *remedy*)\n\n"
        "## Planning (`bench_plan.py --n 15000000`)\n\n## Results\n\n### Results\n\n#### Ünïcode, 20% — ok?\n\n"
        '<a id="custom-spot"></a>\n\n```\n# not a heading\n```\n'
    )
    assert anchors(text) == {
        "web-scale-partitioned-runs-and-a-ray-cluster",
        "setaweighted_mean-the-remedy",
        "planning-bench_planpy---n-15000000",
        "results",
        "results-1",
        "ünïcode-20--ok",
        "custom-spot",
    }


def test_the_checker_names_each_broken_link_and_anchor(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "# Page A\n\n## Two words\n\nsee [top](#page-a) and [b](../README.md#intro)\n"
    )
    (tmp_path / "README.md").write_text(
        "# Intro\n\n[a](docs/a.md#two-words) [gone](docs/b.md) [bad anchor](docs/a.md#three-words) [self](#nowhere)\n\n"
        '![plot](docs/p.png) `[in code](docs/none.md)` [web](https://example.com/x#y) <a href="docs/c.md">c</a>\n\n'
        "```\n[in a block](docs/none.md)\n```\n"
    )
    assert broken_links(doc_files(tmp_path), tmp_path) == [
        "README.md:3: docs/b.md (no such file)",
        "README.md:3: docs/a.md#three-words (no heading or anchor 'three-words' in docs/a.md)",
        "README.md:3: #nowhere (no heading or anchor 'nowhere' in README.md)",
        "README.md:5: docs/p.png (no such file)",
        "README.md:5: docs/c.md (no such file)",
    ]


def test_long_paragraphs_count_list_items_and_table_rows_but_not_code() -> None:
    long = "x" * 601
    text = f"# t\n\n{long}\n\n* short\n* {long}\n\n| a |\n| - |\n| {long} |\n\n```\n{long}\n```\n\nok\n"
    assert long_paragraphs(text) == ["line 3: 601 characters", "line 6: 603 characters", "line 10: 605 characters"]


# ------------------------------------------------------------------------------ the commands they name
#: a command the pages give: ``python -m PACKAGE NAME``, ``python -m MODULE``, ``python PATH.py``, ``bash PATH.sh``
COMMAND = re.compile(
    r"(?:python3?|\.venv/bin/python|\$PY) (?:-m ([\w.]+)(?: (\w+))?|([\w./-]+\.py))|bash ([\w./-]+\.sh)"
)
#: where a page quotes the command line a committed result file recorded (how that run was started, then):
#: benchmarks.md's result and balance blocks and the CIFAR GPU page's invocations
RECORDED = re.compile(
    r"<!-- (result:[\w.-]+|balance):begin -->.*?<!-- \1:end -->"
    r"|^[^\n]*(?:The file records the commit|Runs by invocation)[^\n]*$",
    re.S | re.M,
)


def wing_commands(wing: str) -> set[str]:
    if wing == "benchmarks":
        from benchmarks.__main__ import commands

        return set(commands())
    from studies.__main__ import COMMANDS

    return set(COMMANDS)


def stale_commands(text: str) -> list[str]:
    """The commands of a page that name no module, script or wing command of this tree."""
    out = []
    for m in COMMAND.finditer(RECORDED.sub("", text)):
        module, name, script, shell = m.groups()
        if module in ("benchmarks", "studies"):
            ok = name in wing_commands(module)
        elif module:
            base = ROOT / Path(*module.split("."))
            ok = base.with_suffix(".py").exists() or (base / "__init__.py").exists() or top_level_module(module)
        elif script:
            ok = (ROOT / script).exists() and runs_as_a_script(ROOT / script)
        else:
            ok = (ROOT / shell).exists()
        if not ok:
            out.append(m.group(0))
    return out


def runs_as_a_script(path: Path) -> bool:
    """Whether ``python PATH`` runs it: it imports none of the repository's packages (run by its path, the
    folder on ``sys.path`` is its own, not the repository's)."""
    tree = ast.parse(path.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
    return not {m.split(".")[0] for m in names} & {"benchmarks", "studies", "tools", "examples"}


def top_level_module(module: str) -> bool:
    """A module of the standard library or an installed package (``python -m pytest``, ``pip``, ``venv``)."""
    import importlib.util

    return importlib.util.find_spec(module.split(".")[0]) is not None and module.split(".")[0] not in (
        "benchmarks",
        "studies",
        "tools",
        "examples",
    )


def test_every_command_of_readme_and_docs_names_what_exists() -> None:
    """After a move (benchmarks/ -> studies/, tools run as modules), no page gives a command that fails."""
    stale = {str(p.relative_to(ROOT)): stale_commands(p.read_text()) for p in doc_files(ROOT)}
    assert {k: v for k, v in stale.items() if v} == {}


def test_the_command_check_names_stale_commands() -> None:
    text = (
        "python -m studies headline\npython benchmarks/headline.py\n.venv/bin/python -m benchmarks bench_nothing\n"
        "python -m tools.make_pair_shards\npython -m tools.gone\nbash tools/demo.sh\nbash tools/device_study.sh\n"
        "python tools/tree_report.py\npython tools/make_pair_shards.py\npython benchmarks/bench_plan.py\n"
        "<!-- result:x:begin -->\n`python benchmarks/bench_plan.py` (commit a)\n<!-- result:x:end -->\n"
    )
    assert stale_commands(text) == [
        "python benchmarks/headline.py",
        ".venv/bin/python -m benchmarks bench_nothing",
        "python -m tools.gone",
        "bash tools/device_study.sh",
        "python tools/make_pair_shards.py",
        "python benchmarks/bench_plan.py",
    ]
