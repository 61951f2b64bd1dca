#!/usr/bin/env bash
# What divergence detection costs a gradsync.elastic (Python) loop, side by
# side in one run: the same one-rank ResNet-18 loop
# (bench/elastic_fingerprint_bench.py) with a fingerprint after every step
# and with none, alternating for --rounds rounds against one coordinator;
# prints each round's median step and report_step, then the medians over
# rounds, the fingerprint's own time (report_step with it minus without) and
# what it costs a step at the default fingerprint_every=100.
#   bench/elastic_fingerprint_bench.sh [--steps=10] [--rounds=3] [--no_build]
set -euo pipefail
cd "$(dirname "$0")/.."

steps=10 rounds=3 build=1
for arg in "$@"; do
  case "$arg" in
    --steps=*) steps=${arg#*=} ;;
    --rounds=*) rounds=${arg#*=} ;;
    --no_build) build=0 ;;
    *) echo "elastic_fingerprint_bench: unknown argument $arg" >&2; exit 2 ;;
  esac
done
if [ "$build" = 1 ]; then
  bazel build //server:gradsync-coordinator //python:gradsync/_C.so //python:stubs >&2
fi
bin=bazel-bin
source bench/lib.sh
python_package "$work/pkg"
start_coordinator fingerprint

for ((i = 1; i <= rounds; i++)); do
  for every in 1 0; do
    PYTHONPATH="$work/pkg" timeout 600 /usr/bin/python3 \
      bench/elastic_fingerprint_bench.py "$address" "fp-bench-$i-$every" \
      "$every" "$steps" 2>"$work/err" | grep '^{' ||
      { cat "$work/err" >&2; exit 1; }
  done
done | /usr/bin/python3 bench/elastic_fingerprint_bench.py --summarize
