#!/usr/bin/env bash
# gradsync-worker before and after a change, side by side in one run: the
# DDP step of this tree's worker and of another build of it (e.g. the one
# from before the round-lifecycle redesign, issue 23), alternately, ROUNDS
# times (default 5). Each run: a fresh coordinator (this tree's), two
# workers of one node over shared memory, the MLP 784-2800-2800-10, batch
# 32, 40 steps (the first 5 not counted); its figure is rank 0's median step
# time (--summary_json). Prints each pair and the median of new / old
# (below 1: the new worker's step is shorter).
#   bench/worker_redesign_bench.sh OLD_WORKER [ROUNDS] [BAZEL_BIN]
set -euo pipefail
cd "$(dirname "$0")/.."
old=$1
rounds=${2:-5}
bin=${3:-bazel-bin}
source bench/lib.sh

# run WORKER NAME: one DDP job with WORKER's binary; its median step (ms)
# in $work/NAME.ms.
run() {
  local worker=$1 name=$2 workers=() r
  start_coordinator "$name"
  for r in 0 1; do
    "$worker" --coordinator="$address" --job=ddp --nnodes=1 --nproc_per_node=2 \
      --last_call_timeout=0s --shared_memory=true --model=mlp --hidden=2800 \
      --batch_size=32 --steps=40 --synthetic_size=8192 --lr=0.01 --threads=1 \
      --warmup_steps=5 --log_every=0 --summary_json="$work/$name.json" \
      >"$work/$name.$r.log" 2>&1 &
    workers+=("$!")
    pids+=("$!")
  done
  for r in "${workers[@]}"; do
    wait "$r" || { cat "$work/$name".*.log >&2; return 1; }
  done
  kill "$coordinator_pid" 2>/dev/null || true
  wait "$coordinator_pid" 2>/dev/null || true
  /usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["median_step_ms"])' \
    "$work/$name.json" >"$work/$name.ms"
}

ratios=()
for i in $(seq "$rounds"); do
  run "$bin/worker/gradsync-worker" "new$i"
  run "$old" "old$i"
  new=$(cat "$work/new$i.ms")
  before=$(cat "$work/old$i.ms")
  ratio=$(awk -v a="$new" -v b="$before" 'BEGIN {printf "%.3f", a / b}')
  ratios+=("$ratio")
  echo "round $i: median step ${new} ms new, ${before} ms old: ${ratio}x"
done
median=$(printf '%s\n' "${ratios[@]}" | sort -n |
  awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}')
echo "median new / old: $median"
