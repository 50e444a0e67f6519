#!/usr/bin/env bash
# Run the accuracy study (python -m studies quality) from a frozen copy of the library and of the
# studies at one commit (default HEAD), so a study that runs for hours is not affected by
# edits to the working tree meanwhile. Each invocation gets its own copy under bench-out/study-src/
# (a running study's copy is never replaced). Results still land in this checkout's
# docs/quality-runs/. Extra arguments go to the study.
#   bash studies/snapshot.sh HEAD --datasets cifar10
#   nohup bash studies/snapshot.sh HEAD --study converged --threads 1 > bench-out/converged-study.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
rev=${1:-HEAD}; shift || true
short=$(git rev-parse --short "$rev")
snap=$root/bench-out/study-src/$short-$(date -u +%Y%m%dT%H%M%S)
mkdir -p "$snap"
git archive "$rev" seta_stream studies tools | tar -x -C "$snap"
cd "$snap"
exec env STUDY_REV="$short" PYTHONPATH="$snap" "$root/.venv/bin/python" -m studies quality \
    --results "$root/docs/quality-runs" --data "$root/../shared/data" --out "$root/bench-out/quality" "$@"
