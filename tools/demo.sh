#!/usr/bin/env bash
# The main job: install, generate an ST+MJ-like word-image data set, train SeTa vs full data.
# Everything lands under ./demo-out (gitignored). Extra arguments go to examples/train_words.py.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
echo "== seta_stream demo: installing into .venv (torch==2.13.0 CPU) =="
bash tools/setup.sh
if [ ! -f demo-out/data/info.json ]; then
    echo "== generating 24,000 train + 2,400 test word images as tar shards =="
    .venv/bin/python tools/make_word_shards.py --out demo-out/data --train 24000 --test 2400 --seed 0
fi
echo "== training a small CNN for 6 epochs with SeTa, then with full data (same seed) =="
.venv/bin/python examples/train_words.py --data demo-out/data --run-dir demo-out/runs --epochs 6 "$@"
echo "== run directories: demo-out/runs/seta, demo-out/runs/full =="
.venv/bin/seta-stream inspect demo-out/runs/seta --epoch 4 --plot demo-out/runs/seta.png
echo "== demo finished in $(( $(date +%s) - start ))s =="
