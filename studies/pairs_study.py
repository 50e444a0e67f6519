"""The image-text pairs study (``studies/quality/pairs.py``): ``python -m studies pairs_study ARGS`` is
``python -m studies quality --study pairs ARGS``."""

from __future__ import annotations

import sys

from studies.quality.__main__ import main as quality_main


def main(argv: list[str] | None = None) -> None:
    quality_main(["--study", "pairs", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
