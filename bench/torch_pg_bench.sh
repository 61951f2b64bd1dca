#!/usr/bin/env bash
# The process group backend "gradsync" (gradsync._C: the shared-memory
# all-reduce on one host) against torch's Gloo, side by side in one run on
# this machine: --world ranks on this host, alternating backends for
# --rounds rounds; per round the median all_reduce of ResNet-18's gradient
# size and the median ResNet-18 DDP step (bench/torch_pg_bench.py), and at
# the end the medians over rounds and their ratios gradsync / gloo (goal
# for the DDP step: <= 0.9).
#   bench/torch_pg_bench.sh [--world=2] [--steps=10] [--rounds=2] [--no_build]
set -euo pipefail
cd "$(dirname "$0")/.."

world=2 steps=10 rounds=2 build=1
for arg in "$@"; do
  case "$arg" in
    --world=*) world=${arg#*=} ;;
    --steps=*) steps=${arg#*=} ;;
    --rounds=*) rounds=${arg#*=} ;;
    --no_build) build=0 ;;
    *) echo "torch_pg_bench: unknown argument $arg" >&2; exit 2 ;;
  esac
done
if [ "$build" = 1 ]; then
  bazel build //python:gradsync/_C.so //python:stubs >&2
fi
bin=bazel-bin
source bench/lib.sh
tmp=$work
python_package "$tmp/pkg"

run() {  # BACKEND ROUND: the JSON lines of rank 0
  local pids=() r
  for ((r = 0; r < world; r++)); do
    PYTHONPATH="$tmp/pkg" timeout 900 /usr/bin/python3 bench/torch_pg_bench.py \
      "$1" "$r" "$world" "$tmp/store.$1.$2" "$steps" >"$tmp/out.$1.$2.$r" 2>&1 &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r" || { cat "$tmp"/out.$1.$2.*; exit 1; }; done
  cat "$tmp/out.$1.$2.0"
}
for ((i = 1; i <= rounds; i++)); do
  for backend in gradsync gloo; do run "$backend" "$i"; done
done | /usr/bin/python3 -c '
import json, statistics, sys
rows = [json.loads(line) for line in sys.stdin if line.startswith("{")]
for what in ("allreduce", "ddp"):
    ours = [r["seconds"] for r in rows if r["what"] == what and r["backend"] == "gradsync"]
    gloo = [r["seconds"] for r in rows if r["what"] == what and r["backend"] == "gloo"]
    print(f"{what}: gradsync {statistics.median(ours) * 1e3:.1f} ms "
          f"(rounds: {[round(s * 1e3, 1) for s in ours]}), gloo "
          f"{statistics.median(gloo) * 1e3:.1f} ms "
          f"(rounds: {[round(s * 1e3, 1) for s in gloo]}), ratio "
          f"{statistics.median(ours) / statistics.median(gloo):.2f}")
'
