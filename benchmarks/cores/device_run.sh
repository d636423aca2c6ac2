#!/bin/bash
# The lent device machine's check in one call of the device tool: tests/test_gpu.py where a GPU is there, then the
# core-per-worker benchmark with 4 workers a run (benchmarks/cores/main.py; extra arguments are passed to it).
#   here:   .venv/bin/python benchmarks/cores/device_kit.py     (packs .devkit: the wheels and data the device lacks)
#   device: run(command="bash benchmarks/cores/device_run.sh", carry=[".devkit"], timeout_s=600)
# MODELS (default alexnet,vgg16,s2vt: all seven take longer than one call), CORES_TIMEOUT (default 450 s) and
# GPU_TIMEOUT (default 90 s) are read from the environment. Results in $OUT: env.txt, test_gpu.log, cores.log,
# prediction_check.csv, compute_check.csv. The runs train without MLflow (PIPEDREAM_TRACKING=off).
set -u -o pipefail
KIT=${KIT:-.devkit} OUT=${OUT:-/tmp/device_out} PY=${PY:-python3} MODELS=${MODELS:-alexnet,vgg16,s2vt}
RESULTS=/tmp/device_cores
mkdir -p "$OUT"
if [ ! -d "$KIT/whl" ]; then
  echo "error: no $KIT/whl: run benchmarks/cores/device_kit.py here first and carry $KIT" >&2
  exit 2
fi
KIT=$(cd "$KIT" && pwd)
site=/tmp/devkit_site
rm -rf "$site" && mkdir -p "$site"
"$PY" -c "import glob, sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in glob.glob(sys.argv[2] + '/whl/*')]" \
  "$site" "$KIT" || exit 1
gunzip -c "$KIT/de-en.gz" > /tmp/devkit_de-en || exit 1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MLFLOW_DISABLE_TELEMETRY=true PIPEDREAM_TRACKING=off \
  PYTHONPATH="$PWD:$site" PIPEDREAM_FASHION_MNIST="$KIT/fashion-mnist" PIPEDREAM_DING=/tmp/devkit_de-en
# the workers on jemalloc, as make run's, where the kit's loads here
jemalloc="$KIT/lib/libjemalloc.so.2"
if [ -f "$jemalloc" ] && LD_PRELOAD="$jemalloc" "$PY" -c \
    "from pipedream.allocator import allocator_in_use; assert allocator_in_use() == 'jemalloc'" 2>/dev/null; then
  export PIPEDREAM_JEMALLOC="$jemalloc"
fi
{ lscpu; nvidia-smi -L; echo "PIPEDREAM_JEMALLOC=${PIPEDREAM_JEMALLOC:-}"; } > "$OUT/env.txt" 2>&1
if nvidia-smi -L > /dev/null 2>&1; then
  timeout "${GPU_TIMEOUT:-90}" "$PY" -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$OUT/test_gpu.log" | tail -3
fi
if ! timeout "${CORES_TIMEOUT:-450}" "$PY" benchmarks/cores/main.py --workers 4 --models "$MODELS" --out "$RESULTS" \
    "$@" 2>&1 | tee "$OUT/cores.log"; then
  # stopped early: the check of the runs that finished
  "$PY" -c "import sys; from pathlib import Path; from pipedream.table1.prediction import write_prediction_check as w
print(w(Path(sys.argv[1]), sys.argv[2].split(','), plot=False).to_string())" "$RESULTS" "$MODELS" | tee -a "$OUT/cores.log"
fi
cp "$RESULTS/prediction_check.csv" "$RESULTS/compute_check.csv" "$OUT/" 2>/dev/null
exit 0
