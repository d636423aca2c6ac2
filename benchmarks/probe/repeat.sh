#!/usr/bin/env bash
# Profile one model again and again, alternating the host probe's seconds, and print how far the figures every
# prediction takes from the probe (host.copy_step_s, host.oversubscribed, host.contention) move between profiles
# at each length: their spread (standard deviation of the logarithm) and range, and the profile's duration.
#
#   bash benchmarks/probe/repeat.sh [MODEL] [OPTIMIZER] [REPEATS] ["SECONDS ..."]
#   bash benchmarks/probe/repeat.sh resnet50 sgd 5 "6 12"      # the defaults; about 7 minutes on the 2-core VM
#
# Profiles go to $OUT (default /tmp/probe_repeat/<model>_<seconds>_<i>), as experiments/ci.yaml's profile rule
# takes them (batch 32, warm-up 2, 10 iterations, CPU, one thread a copy). Run it alone on the host: anything
# else running moves the figures it measures.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:-resnet50}
OPTIMIZER=${2:-sgd}
REPEATS=${3:-5}
SECONDS_LIST=${4:-"6 12"}
OUT=${OUT:-/tmp/probe_repeat}
mkdir -p "$OUT"
for i in $(seq 1 "$REPEATS"); do
  for s in $SECONDS_LIST; do
    dir="$OUT/${MODEL}_${s}_$i"
    start=$(date +%s.%N)
    if ! .venv/bin/python -m pipedream.cli profile --model "$MODEL" --preset reduced \
        --profiled-batch 32 --warmup 2 --iters 10 --device cpu --host-seconds "$s" --optimizers "$OPTIMIZER" \
        --out-dir "$dir" > "$dir.log" 2>&1; then
      echo "error: profiling $MODEL failed (see $dir.log)" >&2
      exit 1
    fi
    echo "$s $start $(date +%s.%N) $dir"
  done
done | .venv/bin/python -c '
import json, math, statistics, sys
rows = {}
for line in sys.stdin:
    seconds, start, end, folder = line.split()
    host = json.load(open(folder + "/meta.json"))["host"]
    got = (float(end) - float(start), host["copy_step_s"], host.get("oversubscribed", 1.0), host["contention"])
    rows.setdefault(float(seconds), []).append(got)
    print("--host-seconds %s: %.1f s, copy step %.1f ms, two a core %.3f, one a core %.3f"
          % (seconds, got[0], got[1] * 1e3, got[2], got[3]), flush=True)
def spread(xs):
    return statistics.stdev(math.log(x) for x in xs) if len(xs) > 1 else float("nan")
for seconds, got in sorted(rows.items()):
    d, c, o, k = zip(*got)
    print("--host-seconds %g, %d profiles of %.1f s: spread (sd of log) copy step %.3f (%.1f-%.1f ms), two a core "
          "%.3f (%.3f-%.3f), one a core %.3f" % (seconds, len(got), statistics.fmean(d), spread(c), min(c) * 1e3,
                                                   max(c) * 1e3, spread(o), min(o), max(o), spread(k)))
'
