#!/usr/bin/env bash
# OpenCLIP end to end: OpenCLIP's own get_wds_dataset, create_model_and_transforms (a tiny model,
# no pretrained weights) and cosine_lr, trained through seta_stream's plans on img2dataset-shaped
# pair shards (tools/openclip_check.py lists the checks). Writes the result file
# docs/openclip-check.json (machine, commit, versions, every number) and regenerates
# docs/openclip.md's tables from it (tools/openclip_report.py). Builds its own venv,
# bench-out/openclip-venv, in ONE pip command that resolves seta_stream (this checkout) with
# open-clip-torch[training]==3.3.0 (which pins webdataset<=0.2.86).
# Not part of the test suite. Usage: bash tools/openclip_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=bench-out/openclip-venv
OUT=bench-out/openclip-check
RESULT=${RESULT:-docs/openclip-check.json}
mkdir -p bench-out
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
# torch and torchvision as a pair that lies on this machine's disk (PyPI's torchvision does not
# import beside the project's torch 2.13.0 CPU build); about 5.5 GB
"$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    "torch==2.14.1" "torchvision==0.29.1" -e . "open-clip-torch[training]==3.3.0"
"$VENV/bin/python" -m pip check
rm -rf "$OUT"
mkdir -p "$OUT"
"$VENV/bin/python" -m tools.make_pair_shards --out "$OUT/pairs" --train 1200 --test 100 --shard-size 200 \
    --noise 0.2 --workers 2
status=0
"$VENV/bin/python" tools/openclip_check.py --data "$OUT/pairs" --out "$OUT" --result "$RESULT" "$@" || status=$?
"$VENV/bin/python" tools/openclip_report.py --result "$RESULT" --doc docs/openclip.md
exit $status
