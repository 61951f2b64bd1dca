#!/usr/bin/env bash
# Step time with a slow rank, its micro-batches rebalanced vs not, side by
# side in one run. Three gradsync-workers (a small MLP, an exact global
# batch of 24 micro-batches of 16, shared memory) and a coordinator on
# loopback; one worker computes F times slower (--slowdown=F, default 2).
#   report:    --straggler_policy=report (the slow rank is only named);
#   rebalance: the default policy (its micro-batches move to the others in
#              a planned re-form once it is flagged; --straggler_threshold=3ms).
# Each job runs 600 steps; the figure is the median of rank 0's last 300
# step times (after the rebalance, which comes within the first ~200). The
# modes alternate, PAIRS times (default 3), each pair's ratio printed, then
# the median ratio (goal: rebalanced <= 0.75 of not, for F = 2).
#   bench/rebalance_bench.sh [BAZEL_BIN] [F] [PAIRS]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-bazel-bin}
slowdown=${2:-2}
pairs=${3:-3}
source bench/lib.sh

# The median of the last 300 "step ... step X ms" lines of file $1.
median_ms() {
  grep '^step ' "$1" | tail -300 | sed -E 's/.*  step ([0-9.]+) ms.*/\1/' |
    sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'
}

# run NAME POLICY: prints rank 0's median step time, ms.
run() {
  local name=$1 policy=$2
  start_coordinator "$name"
  local workers=()
  for i in 0 1 2; do
    local slow=""
    [[ $i == 1 ]] && slow="--slowdown=$slowdown"
    "$bin/worker/gradsync-worker" --coordinator="$address" --job=bench \
      --nnodes=3 --node_id="n$i" --model=mlp --hidden=24 --dataset=synthetic \
      --synthetic_size=3840 --batch_size=16 --global_batch_size=384 \
      --steps=600 --threads=1 --log_every=1 --straggler_threshold=3ms \
      --straggler_policy="$policy" $slow >"$work/$name.$i.log" 2>&1 &
    workers+=("$!")
    pids+=("$!")
  done
  for w in "${workers[@]}"; do
    wait "$w" || { echo "$name: a worker failed" >&2; tail "$work/$name".*.log >&2; return 1; }
  done
  kill "$coordinator_pid" 2>/dev/null || true
  local rank0
  rank0=$(grep -l "rank 0 of 3" "$work/$name".[012].log | head -1)
  if [[ $policy == rebalance ]]; then
    grep -h "rebalancing: " "$work/$name.coordinator.log" | sed 's/.*rebalancing: /  /' >&2 || true
  fi
  median_ms "$rank0"
}

echo "rebalance_bench: 3 ranks, one ${slowdown}x slow, 24 micro-batches a step ($(nproc) cores)"
ratios=()
for p in $(seq "$pairs"); do
  report=$(run "report$p" report)
  rebalanced=$(run "rebalance$p" rebalance)
  ratio=$(awk -v a="$rebalanced" -v b="$report" 'BEGIN {printf "%.2f", a / b}')
  ratios+=("$ratio")
  echo "pair $p: median step ${report} ms not rebalanced, ${rebalanced} ms rebalanced: ${ratio}x"
done
printf '%s\n' "${ratios[@]}" | sort -n |
  awk '{v[NR]=$1} END {print "median ratio, rebalanced / not: " v[int((NR+1)/2)]}'
