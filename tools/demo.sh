#!/usr/bin/env bash
# The first command: install, generate web-crawled-like image-text pairs with 20% mismatched captions,
# train a small CLIP on full data and with the noise rule plus random pruning (same seed and
# initialisation), then list the pairs the rule suspects. Everything lands under ./demo-out (gitignored).
#
#   bash tools/demo.sh          image-text pairs: full data against the noise rule + random pruning
#   bash tools/demo.sh words    clean word images: SeTa against full data
#
# Extra arguments go to the training script: the pairs demo's comparison of two runs is the noise study's
# training loop (python -m studies.engines.pairs: the mismatched share of the pairs trained, the comparison
# table), the words demo runs the example a user copies (examples/train_words.py) once per policy.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
what=pairs
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
    what=$1
    shift
fi
case $what in
pairs | words) ;;
*)
    echo "usage: bash tools/demo.sh [pairs|words] [example arguments...]" >&2
    exit 2
    ;;
esac

# What the demo needs (torch, the package, Pillow, matplotlib); `bash tools/setup.sh` adds the dev
# extra (tests, benchmarks) to the same .venv later.
if [ -x .venv/bin/seta-stream ] && .venv/bin/python -c "import torch, PIL, matplotlib" 2>/dev/null; then
    echo "== using .venv ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)')) =="
else
    echo "== installing into .venv: torch==2.13.0 (CPU build), seta_stream, Pillow, matplotlib =="
    [ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
    .venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[plot]" "pillow>=10"
fi
PY=.venv/bin/python
export PYTHONUNBUFFERED=1 # every line as it is printed, also through a pipe (| tee)
CLI=$PWD/.venv/bin/seta-stream
echo "== .venv ready after $(($(date +%s) - start))s =="

if [ "$what" = words ]; then
    echo
    echo "What this shows: SeTa on clean word images (no noise to leave out). SeTa trains about 30% fewer"
    echo "samples and ends about at or below full data's test accuracy: pruning saves compute here, it"
    echo "does not add accuracy. The default demo (bash tools/demo.sh) shows where pruning pays."
    echo
    if [ ! -f demo-out/data/info.json ]; then
        echo "== generating 24,000 train + 2,400 test word images as tar shards =="
        $PY -m tools.make_word_shards --out demo-out/data --train 24000 --test 2400 --seed 0
    fi
    echo "== training a small CNN for 6 epochs with SeTa, then with full data (same seed and initialisation) =="
    rm -rf demo-out/runs/seta demo-out/runs/full # a fresh run each time
    $PY examples/train_words.py --data demo-out/data --run-dir demo-out/runs/seta --epochs 6 --workers 1 \
        --policy seta --params '{"r": 0.1, "k": 5, "alpha": 0.6, "delta": 0.875}' "$@"
    $PY examples/train_words.py --data demo-out/data --run-dir demo-out/runs/full --epochs 6 --workers 1 \
        --policy full --params '{}' "$@"
    run=$PWD/demo-out/runs/seta
    if [ -d "$run" ]; then
        echo
        echo "== the plan of SeTa's last epoch (plot: $run.png) =="
        "$CLI" inspect "$run" --plot "$run.png"
    fi
    echo "== demo finished in $(($(date +%s) - start))s =="
    exit 0
fi

# The pairs demo. Data and schedule are the noise study's (studies/noise_study.py: 10,000 pairs in
# 10 shards, 1,000 clean held-out pairs, 10 epochs, batch 128). r = 0.19 is the study's calibration for
# the rule + random at 30% pruned (docs/quality-runs/noise-study-2core/pairs-n20-E10-cal-rule-random.json):
# the combined policy replayed over full data's training losses; neither the held-out pairs nor the
# noise rate were read to choose it.
DATA=demo-out/pairs
RUNS=demo-out/pair-runs
SETTINGS=(--policy random --params '{"r": 0.19}' --noise)
NAME=random-r0.19-noise
if [ $# -gt 0 ]; then # the run directory of the settings as the extra arguments change them
    NAME=$($PY - "${SETTINGS[@]}" "$@" <<'EOF'
import sys
from studies.engines.common import policy_params, run_name
from studies.engines.pairs import parser
args = parser().parse_args(sys.argv[1:])
print(run_name(args.policy, policy_params(args)))
EOF
)
fi
echo
echo "What this shows: web-crawled captions often belong to another image. On 10,000 pairs of which"
echo "20% carry a mismatched caption, the noise rule (noise=True) leaves out pairs whose loss stays"
echo "high, and random pruning (r=0.19) leaves out a share of the rest every epoch. Both runs train"
echo "10 epochs from the same seed and initialisation. Per epoch: 'mismatched' is the share of"
echo "mismatched pairs among the pairs trained, 'learnt from' the share among those trained with a"
echo "weight above 0 (the rule re-checks a tenth of its suspects with weight 0); R@1 is recall@1"
echo "(image->text, text->image) on 1,000 clean held-out pairs."
echo
if ! $PY - "$DATA" <<'EOF' 2>/dev/null; then
import json, sys
info = json.load(open(sys.argv[1] + "/info.json"))
assert (info["train"]["pairs"], info["test"]["pairs"], info["noise"], info["seed"], info["shard_size"]) == (10000, 1000, 0.2, 0, 1000)
EOF
    echo "== generating 10,000 train pairs (20% mismatched captions) + 1,000 held-out pairs as tar shards =="
    rm -rf "$DATA"
    $PY -m tools.make_pair_shards --out "$DATA" --train 10000 --test 1000 --shard-size 1000 --noise 0.2 --seed 0 \
        --workers 2
fi
echo "== training a small CLIP for 10 epochs: the noise rule + random pruning, then full data =="
$PY -m studies.engines.pairs --data "$DATA" --run-dir "$RUNS" --epochs 10 --batch-size 128 --workers 1 --quiet \
    "${SETTINGS[@]}" "$@"
echo "  (wall s: each run's own, one after the other on this machine; the cost figure is the pairs trained)"
run=$PWD/$RUNS/$NAME
if [ -d "$run" ]; then
    echo
    echo "== the pairs the rule suspects, against the known mismatched pairs (noise.parquet) =="
    "$CLI" suspects "$run" --out "$run-suspects.parquet" --truth "$PWD/$DATA/noise.parquet"
    echo
    echo "== the plan of the last epoch (plot: $run.png) =="
    "$CLI" inspect "$run" --plot "$run.png"
fi
echo "== demo finished in $(($(date +%s) - start))s =="
