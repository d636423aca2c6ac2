#!/bin/bash
# The lent device machine's check of issue 18, in one call of the device tool: the reduced Table 1's runs with a
# core per worker, one model at a time (benchmarks/cores/main.py; extra arguments are passed to it), then
# tests/test_gpu.py.
#   here:   .venv/bin/python benchmarks/cores/device_kit.py        (packs .devkit: wheels and data the device lacks)
#   device: run(command="bash benchmarks/cores/device_run.sh", carry=[".devkit"], timeout_s=600)
# Settings (environment): MODELS (comma-separated, default all seven, longest first; all seven one at a time take
# longer than one call, so a session splits them over two, e.g. MODELS=gnmt16,awd_lm,gnmt8,resnet50 GPU_TIMEOUT=0
# CORES_TIMEOUT=570, then the rest: benchmarks/cores/README.md), CORE_GROUPS (models at once, default 1: on this
# machine a core's speed depends on how many cores are busy), HOST_SECONDS (the profile's host probe per copy
# count, default 3; experiments/ci.yaml's is 24), CORES_TIMEOUT (default 480 s) bounds the runs, GPU_TIMEOUT (75 s; 0
# skips) the tests, HOST_BENCH=1 (default 0) first runs benchmarks/host on the idle machine (about 105 s).
# The workers run on the kit's jemalloc where it loads (else glibc; env.txt says which).
# Results in $OUT (the tool's folder; default /tmp/device_out): env.txt, cores.log, cores.tar.gz (main.py's OUT
# without model files: every CSV), prediction_check.csv, test_gpu.log, host.log. Runs train without MLflow
# (PIPEDREAM_TRACKING=off).
set -u
KIT=${KIT:-.devkit}
OUT=${OUT:-/tmp/device_out}
PY=${PY:-python3}
CORES_TIMEOUT=${CORES_TIMEOUT:-480}
GPU_TIMEOUT=${GPU_TIMEOUT:-75}
mkdir -p "$OUT"
if [ ! -d "$KIT/whl" ]; then
  echo "error: no $KIT/whl: run benchmarks/cores/device_kit.py here first and carry $KIT" >&2
  exit 2
fi
KIT=$(cd "$KIT" && pwd)
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MLFLOW_DISABLE_TELEMETRY=true PIPEDREAM_TRACKING=off
t0=$(date +%s)
site=/tmp/devkit_site
rm -rf "$site" && mkdir -p "$site"
"$PY" -c "import glob, sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in glob.glob(sys.argv[2] + '/whl/*')]" \
  "$site" "$KIT" || exit 1
gunzip -c "$KIT/de-en.gz" > /tmp/devkit_de-en || exit 1
export PYTHONPATH="$PWD:$site" PIPEDREAM_FASHION_MNIST="$KIT/fashion-mnist" PIPEDREAM_DING=/tmp/devkit_de-en
{ date; lscpu; nvidia-smi -L; "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"; } \
  > "$OUT/env.txt" 2>&1
# the workers' allocator, as make run's: the kit's jemalloc (device_kit.py) where a process here starts on it
jemalloc="$KIT/lib/libjemalloc.so.2"
if [ -f "$jemalloc" ] && LD_PRELOAD="$jemalloc" "$PY" -c \
    "from pipedream.allocator import allocator_in_use; assert allocator_in_use() == 'jemalloc'" >> "$OUT/env.txt" 2>&1; then
  export PIPEDREAM_JEMALLOC="$jemalloc"
fi
"$PY" -c "from pipedream.allocator import jemalloc_library; print('workers on', jemalloc_library() or 'glibc (no jemalloc)')" \
  | tee -a "$OUT/env.txt"
models=${MODELS:-gnmt16,awd_lm,gnmt8,resnet50,s2vt,vgg16,alexnet}
if ! "$PY" -c "from fairseq.models import lstm" >> "$OUT/env.txt" 2>&1; then
  echo "fairseq does not import (env.txt): GNMT-8 and GNMT-16 left out" | tee -a "$OUT/env.txt"
  models=$(echo ",$models," | sed 's/,gnmt16,/,/; s/,gnmt8,/,/; s/^,//; s/,$//')
fi
echo "set up in $(( $(date +%s) - t0 )) s"
if [ "${HOST_BENCH:-0}" = 1 ]; then
  # on the idle machine: a step's CPU after a sleep and after a busy wait, on one core and four, and one copy
  # against sixteen at once (every core busy)
  four=$("$PY" -c 'import os; print(",".join(map(str, sorted(os.sched_getaffinity(0))[:4])))')
  timeout 100 taskset -c "$four" "$PY" benchmarks/host/main.py --model alexnet --copies 1 4 --gaps 0 0.05 \
    --spin-gaps 0.05 --steps 20 --repeats 2 2>&1 | grep -v -i "warn\|^INFO" | tee "$OUT/host.log"
  timeout 40 "$PY" benchmarks/host/main.py --model alexnet --copies 1 16 --gaps 0 --steps 20 --repeats 2 2>&1 \
    | grep -v -i "warn\|^INFO" | tee -a "$OUT/host.log"
  echo "host benchmark done at $(( $(date +%s) - t0 )) s"
fi
timeout "$CORES_TIMEOUT" "$PY" benchmarks/cores/main.py --out /tmp/device_cores --tar "$OUT/cores.tar.gz" \
  --models "$models" --groups "${CORE_GROUPS:-1}" --host-seconds "${HOST_SECONDS:-3}" \
  --deadline-s $(( CORES_TIMEOUT - 40 )) --min-left-s 100 "$@" 2>&1 | tee "$OUT/cores.log"
cp /tmp/device_cores/prediction_check.csv "$OUT/" 2>/dev/null
echo "runs done at $(( $(date +%s) - t0 )) s"
if [ "$GPU_TIMEOUT" -gt 0 ]; then
  timeout "$GPU_TIMEOUT" "$PY" -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$OUT/test_gpu.log" | tail -5
fi
echo "all done at $(( $(date +%s) - t0 )) s"
