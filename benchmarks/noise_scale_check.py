"""The closed-loop check of the noise rule's scale (benchmarks/quality/noise_scale.py), run as a script."""

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.quality.noise_scale import main

    main()
