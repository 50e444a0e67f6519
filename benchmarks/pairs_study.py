"""The pairs study (benchmarks/quality/pairs.py) as a script: ``python -m benchmarks.quality --study pairs ARGS``."""

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.quality.__main__ import main

    main(["--study", "pairs", *sys.argv[1:]])
