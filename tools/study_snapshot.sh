#!/usr/bin/env bash
# Run benchmarks/quality.py from a frozen copy of the library (the commit given, default HEAD),
# so a study that runs for hours is not affected by edits to the working tree meanwhile.
# Results still land in this checkout's docs/quality-runs/. Extra arguments go to quality.py.
#   bash tools/study_snapshot.sh HEAD --datasets cifar10
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-HEAD}; shift || true
snap=bench-out/study-src
rm -rf "$snap" && mkdir -p "$snap"
git archive "$rev" seta_stream | tar -x -C "$snap"
mkdir -p "$snap/tools" "$snap/benchmarks"; cp benchmarks/quality.py benchmarks/quality_checks.py "$snap/benchmarks/"; cp tools/text_to_shards.py "$snap/tools/"
exec env STUDY_REV="$(git rev-parse --short "$rev")" PYTHONPATH="$PWD/$snap" .venv/bin/python "$snap/benchmarks/quality.py" --results "$PWD/docs/quality-runs" \
    --data "$PWD/../shared/data" --out "$PWD/bench-out/quality" "$@"
