"""The closed-loop check of the noise rule's scale (``studies/quality/noise_scale.py``):
``python -m studies noise_scale_check ARGS``."""

from __future__ import annotations

from studies.quality.noise_scale import main

if __name__ == "__main__":
    main()
