"""``python -m studies NAME [args]``: run the study ``NAME`` as ``python -m studies.MODULE [args]`` would
(the table below names each one's module); ``python -m studies --help`` lists them."""

from __future__ import annotations

import ast
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: NAME -> the module it runs
COMMANDS = {
    "quality": "studies.quality",
    "noise_study": "studies.noise_study",
    "pairs_study": "studies.pairs_study",
    "noise_scale_check": "studies.noise_scale_check",
    "baselines_labels": "studies.baselines_labels",
    "baselines_pairs": "studies.baselines_pairs",
    "cifar_gpu": "studies.cifar_gpu",
    "words_noise": "studies.words_noise",
    "headline": "studies.headline",
    "rule_mechanisms": "studies.rule_mechanisms",
    "instability": "studies.quality.instability",
    "collapses": "studies.quality.collapses",
    "collapse": "studies.quality.collapse",
}


def summary(module: str) -> str:
    """The first sentence of the module's docstring (read, not imported)."""
    rel = Path(*module.split(".")[1:])
    path = HERE / rel / "__main__.py" if (HERE / rel).is_dir() else HERE / rel.with_suffix(".py")
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return " ".join(doc.split("\n\n")[0].split()).split(". ")[0].rstrip(".")


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = []
    for name, module in COMMANDS.items():
        text = summary(module)
        lines.append(f"  {name:<{width}}  {text[:100]}{'...' if len(text) > 100 else ''}")
    return "usage: python -m studies NAME [args]   (NAME --help: its arguments)\n\n" + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        (sys.stdout if argv else sys.stderr).write(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        sys.stderr.write(f"python -m studies: no study {name!r}\n\n" + usage())
        return 2
    sys.argv = [name, *rest]  # runpy puts the module's file first
    runpy.run_module(COMMANDS[name], run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
