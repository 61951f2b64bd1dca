#!/usr/bin/env bash
# Durable-state benchmark, side by side in one run: the coordinator serving
# from memory and from --state_dir (SQLite, WAL, synchronous=FULL), on the
# same load: 10,000 simulated workers ranked (goal <= 1 s with state), then
# key-value Set+Get calls with 64 in flight (goal: durable >= 0.5 of memory).
#   bench/state_bench.sh [--rounds=3]
# Rounds alternate the two backends so machine noise hits both; prints each
# round and the median ratio durable / in-memory.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3
for arg in "$@"; do
  case "$arg" in
    --rounds=*) rounds=${arg#*=} ;;
    *) echo "state_bench: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done
bazel build -c opt //bench:rendezvous_load 2>&1 | tail -n 1
load=bazel-bin/bench/rendezvous_load
state=$(mktemp -d)
trap 'rm -rf "$state"' EXIT

field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" <<<"$2"; }
run() {  # prints "ranked_s kv_calls_per_s" of one run, or fails
  local out
  out=$("$load" --workers=10000 --channels=8 --kv_ops=5000 "$@" | grep '^RESULT')
  [ "$(field wrong "$out")" = 0 ] && [ "$(field failed "$out")" = 0 ] || {
    echo "state_bench: wrong or failed results: $out" >&2; exit 1; }
  echo "$(field ranked_s "$out") $(field kv_calls_per_s "$out")"
}

printf "%5s %12s %12s %14s %14s\n" round memory_s state_s memory_kv/s state_kv/s
kv_ratios=()
for r in $(seq 1 "$rounds"); do
  read -r mr mk < <(run)
  rm -rf "$state/r$r"
  read -r sr sk < <(run --state_dir="$state/r$r")
  printf "%5d %12s %12s %14s %14s\n" "$r" "$mr" "$sr" "$mk" "$sk"
  kv_ratios+=("$(awk -v a="$sk" -v b="$mk" 'BEGIN { printf "%.3f", a / b }')")
  rank_ratios+=("$(awk -v a="$sr" -v b="$mr" 'BEGIN { printf "%.3f", a / b }')")
done
median() { printf "%s\n" "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "key-value throughput, durable / in-memory (median): $(median "${kv_ratios[@]}")  (goal >= 0.5)"
echo "time to rank 10,000 workers, durable / in-memory (median): $(median "${rank_ratios[@]}")"
