#!/usr/bin/env bash
# Run on a lent GPU machine from a working tree that holds the CIFAR-10 and SST-2 shards under .gpu/ (copies of
# ../shared/data/cifar10 and sst2) and the wheels of webdataset, braceexpand and polars under .whl/ (git-ignored).
# Device check (issue 28): CIFAR-10 ResNet-18 with augmentation through the converged study, seed 0,
# P processes sharing one GPU (each claims the study's next unclaimed run), until DEADLINE seconds.
# usage: bash studies/device_resnet18.sh E P DEADLINE [DEVICE] [MODEL]
set -u
E=${1:-20}; P=${2:-8}; DEADLINE=${3:-480}; DEVICE=${4:-cuda}; MODEL=${5:-resnet18}
OUTDIR=${OUT:-/tmp/out}; mkdir -p "$OUTDIR"
PY=${PY:-python3}
if [ -d .whl ] && [ "$PY" = python3 ] && [ ! -d /tmp/site/polars ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
RES=/tmp/gpu-res; SCR=/tmp/gpu-out; mkdir -p $RES $SCR
{ nvidia-smi -L 2>&1; nproc; $PY -c "import torch, webdataset, polars, numpy, pyarrow; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'wds', webdataset.__version__, 'polars', polars.__version__, 'numpy', numpy.__version__, 'pyarrow', pyarrow.__version__)"; } > "$OUTDIR/env.txt" 2>&1
cat "$OUTDIR/env.txt"
start=$(date +%s); end=$((start + DEADLINE))
for i in $(seq 1 "$P"); do
  ( while [ "$(date +%s)" -lt "$end" ]; do
      left=$((end - $(date +%s)))
      timeout --signal=INT --kill-after=10 "$left" $PY -m studies quality --study converged --model "$MODEL" \
        --device "$DEVICE" --workers 2 --threads 1 --epochs "$E" --seeds 1 \
        --results $RES --data .gpu --out $SCR ${SMOKE:+--smoke} > "$SCR/last$i.log" 2>&1
      cat "$SCR/last$i.log" >> "$SCR/proc$i.log"
      # nothing left to train and nothing being trained by another process: this worker is done
      grep -qE "^== |being trained by other processes" "$SCR/last$i.log" || break
      grep -q "^== " "$SCR/last$i.log" || sleep 5
    done ) &
  sleep 3
done
wait
echo "elapsed $(( $(date +%s) - start )) s"
for f in $SCR/proc*.log; do echo "## $f"; grep -E "^==|->|FAILED|Error|error" "$f" | tail -40; done > "$OUTDIR/procs.txt"
cat $SCR/proc*.log > "$OUTDIR/logs.txt"
tar czf "$OUTDIR/results.tgz" -C $RES .
ls -la $RES/converged | tail -30
cat "$OUTDIR/procs.txt" | tail -60
