#!/usr/bin/env bash
# What a gradsync.elastic (Python) loop pays for one of its features, side by
# side in one run: a one-rank ResNet-18 loop run with the feature and
# without, alternating for --rounds rounds against one coordinator; prints
# each side's median steps, then the medians over rounds and their ratio.
#   --what=fingerprint: bench/elastic_fingerprint_bench.py, a fingerprint
#     after every step vs none, and the fingerprint's own time at the default
#     fingerprint_every=100 (divergence detection);
#   --what=observe: bench/elastic_observe_bench.py, a DDP step of 2
#     micro-batches run through observe() and micro_batches() vs DDP's own
#     all-reduce with no_sync by hand (straggler reporting).
#   bench/elastic_loop_bench.sh --what=fingerprint|observe [--steps=10]
#     [--rounds=3] [--no_build]
set -euo pipefail
cd "$(dirname "$0")/.."

what="" steps=10 rounds=3 build=1
for arg in "$@"; do
  case "$arg" in
    --what=*) what=${arg#*=} ;;
    --steps=*) steps=${arg#*=} ;;
    --rounds=*) rounds=${arg#*=} ;;
    --no_build) build=0 ;;
    *) echo "elastic_loop_bench: unknown argument $arg" >&2; exit 2 ;;
  esac
done
case "$what" in
  fingerprint) sides=(1 0) ;;  # fingerprint_every
  observe) sides=(observed plain) ;;
  *) echo "elastic_loop_bench: --what=fingerprint or --what=observe" >&2; exit 2 ;;
esac
script=bench/elastic_${what}_bench.py
if [ "$build" = 1 ]; then
  bazel build //server:gradsync-coordinator //python:gradsync/_C.so //python:stubs >&2
fi
bin=bazel-bin
source bench/lib.sh
python_package "$work/pkg"
start_coordinator "$what"

# Each side's JSON line; a side that fails stops the run with its stderr.
for ((i = 1; i <= rounds; i++)); do
  for side in "${sides[@]}"; do
    if ! PYTHONPATH="$work/pkg" timeout 600 /usr/bin/python3 "$script" \
        "$address" "$what-bench-$i-$side" "$side" "$steps" \
        >"$work/out" 2>"$work/err" || ! grep '^{' "$work/out" >>"$work/lines"; then
      echo "elastic_loop_bench: side $side of round $i failed:" >&2
      cat "$work/err" >&2
      exit 1
    fi
  done
done
/usr/bin/python3 "$script" --summarize <"$work/lines"
