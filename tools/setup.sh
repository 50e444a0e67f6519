#!/usr/bin/env bash
# Create .venv and install seta_stream with everything the demo, tests and benchmarks need.
# torch is pinned to the CPU build this machine provides; never leave it unpinned.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]"
