"""The noise study (``studies/quality/noise.py``): ``python -m studies noise_study ARGS`` is
``python -m studies quality --study noise ARGS``."""

from __future__ import annotations

import sys

from studies.quality.__main__ import main as quality_main


def main(argv: list[str] | None = None) -> None:
    quality_main(["--study", "noise", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
