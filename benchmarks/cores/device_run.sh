#!/bin/bash
# The lent device machine's check of issue 18, in one call of the device tool: the reduced Table 1's runs with a
# core per worker (benchmarks/cores/main.py; extra arguments are passed to it), then tests/test_gpu.py.
#   here:   .venv/bin/python benchmarks/cores/device_kit.py        (packs .devkit: wheels and data the device lacks)
#   device: run(command="bash benchmarks/cores/device_run.sh", carry=[".devkit"], timeout_s=600)
# Results in $OUT (the tool's folder; default /tmp/device_out): env.txt, host.log (HOST_BENCH=0 skips it), cores.log, cores.tar.gz (main.py's OUT
# without model files: every CSV), prediction_check.csv, test_gpu.log, inflight.log, ddp.log. Runs train without
# MLflow (PIPEDREAM_TRACKING=off). CORES_TIMEOUT (default 480 s) bounds the runs, GPU_TIMEOUT (75 s) the tests,
# BUDGET_S (570 s) the whole script, the two benchmarks after the tests taking what is left.
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
models=vgg16,resnet50,alexnet,gnmt8,gnmt16,awd_lm,s2vt
if ! "$PY" -c "from fairseq.models import lstm" >> "$OUT/env.txt" 2>&1; then
  echo "fairseq does not import (env.txt): GNMT-8 and GNMT-16 left out" | tee -a "$OUT/env.txt"
  models=vgg16,resnet50,alexnet,awd_lm,s2vt
fi
echo "set up in $(( $(date +%s) - t0 )) s"
# first, on the idle machine: a step's CPU after a sleep and after a busy wait, on one core and four (benchmarks/host),
# and one copy against sixteen at once (every core busy)
four=$("$PY" -c 'import os; print(",".join(map(str, sorted(os.sched_getaffinity(0))[:4])))')
if [ "${HOST_BENCH:-1}" = 1 ]; then
  timeout 100 taskset -c "$four" "$PY" benchmarks/host/main.py --model alexnet --copies 1 4 --gaps 0 0.05 \
    --spin-gaps 0.05 --steps 20 --repeats 2 2>&1 | grep -v -i "warn\|^INFO" | tee "$OUT/host.log"
  timeout 40 "$PY" benchmarks/host/main.py --model alexnet --copies 1 16 --gaps 0 --steps 20 --repeats 2 2>&1 \
    | grep -v -i "warn\|^INFO" | tee -a "$OUT/host.log"
  echo "host benchmark done at $(( $(date +%s) - t0 )) s"
fi
timeout "$CORES_TIMEOUT" "$PY" benchmarks/cores/main.py --out /tmp/device_cores --tar "$OUT/cores.tar.gz" \
  --models "$models" --deadline-s $(( CORES_TIMEOUT - 40 )) "$@" 2>&1 | tee "$OUT/cores.log"
cp /tmp/device_cores/prediction_check.csv "$OUT/" 2>/dev/null
echo "runs done at $(( $(date +%s) - t0 )) s"
timeout "$GPU_TIMEOUT" "$PY" -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$OUT/test_gpu.log" | tail -5
# in the time left of BUDGET_S (default 570 s): what a run's compute does that the profile's copies do not, on every
# core (benchmarks/inflight: 1F1B's minibatches in flight) and on 4 (benchmarks/ddp: DDP's passes beside plain ones)
left=$(( ${BUDGET_S:-570} - ($(date +%s) - t0) ))
if [ "$left" -gt 100 ]; then
  timeout $(( left * 6 / 10 )) "$PY" benchmarks/inflight/main.py --models resnet50 gnmt8 --rounds 4 2>&1 \
    | grep -v -i "warn\|^INFO" | tee "$OUT/inflight.log"
  left=$(( ${BUDGET_S:-570} - ($(date +%s) - t0) ))
  if [ "$left" -gt 40 ]; then
    timeout "$left" taskset -c "$four" "$PY" benchmarks/ddp/main.py --model alexnet --processes 4 2>&1 \
      | grep -v -i "warn\|^INFO" | tee "$OUT/ddp.log"
  fi
fi
echo "all done at $(( $(date +%s) - t0 )) s"
