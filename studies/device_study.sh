#!/usr/bin/env bash
# Run on a lent GPU machine from a working tree that holds the CIFAR-10 and SST-2 shards under .gpu/ (copies of
# ../shared/data/cifar10 and sst2) and the wheels of webdataset, braceexpand and polars under .whl/ (git-ignored).
# One device call: the noise study on most CPU cores, and the ResNet-18 converged study on the GPU beside it.
# usage: bash studies/device_study.sh JOBS DEADLINE E P
set -u
JOBS=${1:-11}; DEADLINE=${2:-490}; E=${3:-15}; P=${4:-2}
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 STUDY_REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=/tmp/site || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH
mkdir -p /tmp/ns
( python3 -m studies noise_study --jobs "$JOBS" --deadline "$DEADLINE" --results /tmp/ns/res --out /tmp/ns/out \
    --label-data .gpu --no-report > /tmp/ns/noise-study.log 2>&1 ) &
ns=$!
( PY=python3 bash studies/device_resnet18.sh "$E" "$P" "$DEADLINE" cuda resnet18 > /tmp/ns/resnet18.log 2>&1 ) &
rn=$!
wait $ns; wait $rn
tar czf "$OUT/noise-study.tgz" -C /tmp/ns res noise-study.log
cp /tmp/ns/resnet18.log "$OUT/resnet18.log"
grep -E '^(==|   ->)' /tmp/ns/noise-study.log | tail -60
tail -30 /tmp/ns/resnet18.log
ls "$OUT"
