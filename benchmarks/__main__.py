"""``python -m benchmarks NAME [args]``: run the benchmark ``NAME`` (``bench_*``, ``ab_*``, or ``report``)
as ``python -m benchmarks.NAME [args]`` would; ``python -m benchmarks --help`` lists them."""

from __future__ import annotations

import ast
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def commands() -> dict[str, str]:
    """NAME -> the first sentence of its docstring, for every runnable module of the wing (read, not
    imported: listing them starts no benchmark's imports)."""
    out = {}
    for path in sorted(HERE.glob("*.py")):
        if path.stem.startswith(("bench_", "ab_")) or path.stem == "report":
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
            first = " ".join(doc.split("\n\n")[0].split())
            out[path.stem] = first.split(". ")[0].rstrip(".")
    return out


def usage(names: dict[str, str]) -> str:
    width = max(map(len, names))
    lines = [f"  {name:<{width}}  {text[:100]}{'...' if len(text) > 100 else ''}" for name, text in names.items()]
    return "usage: python -m benchmarks NAME [args]   (NAME --help: its arguments)\n\n" + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    names = commands()
    if not argv or argv[0] in ("-h", "--help"):
        (sys.stdout if argv else sys.stderr).write(usage(names))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in names:
        sys.stderr.write(f"python -m benchmarks: no benchmark {name!r}\n\n" + usage(names))
        return 2
    sys.argv = [str(HERE / f"{name}.py"), *rest]
    runpy.run_module(f"{__package__}.{name}", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
