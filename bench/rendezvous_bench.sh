#!/usr/bin/env bash
# Rendezvous benchmark, side by side in one run: gradsync's coordinator vs
# PyTorch's TCPStore (Debian python3-torch 1.13) handing ranks to N clients
# on this machine, then gradsync alone at 10,000 to 100,000 ranks, as
# one-process workers and as nodes of 8, and the coordinator's memory.
#   bench/rendezvous_bench.sh
# Prints each result and the ratio TCPStore time / gradsync time (> 1 means
# gradsync is faster).
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install_deps.sh python3-torch
bazel build //bench:rendezvous_load 2>&1 | tail -n 1
load=bazel-bin/bench/rendezvous_load

field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" <<<"$2"; }

echo "== one new connection per client (as real workers, and TCPStore, do)"
printf "%8s %14s %14s %10s\n" clients gradsync_s tcpstore_s ratio
for n in 1000 2000 5000; do
  g=$("$load" --workers="$n" --channels=0 --kv_ops=1000 | grep '^RESULT')
  t=$(/usr/bin/python3 bench/tcpstore_rendezvous.py --workers="$n" \
        --timeout=60 2>/dev/null | grep '^RESULT' || true)
  gs=$(field ranked_s "$g"); ts=$(field ranked_s "$t")
  [ -n "$ts" ] || ts=crashed  # e.g. TCPStore aborts on "too many open files"
  [ "$(field wrong "$g")" = 0 ] && [ "$(field failed "$g")" = 0 ] || {
    echo "gradsync gave wrong ranks: $g" >&2; exit 1; }
  ratio=$(awk -v a="$ts" -v b="$gs" 'BEGIN { if (a ~ /^[0-9.]+$/) printf "%.2f", a / b; else print "n/a" }')
  printf "%8d %14s %14s %10s\n" "$n" "$gs" "$ts" "$ratio"
done

echo
echo "== growth: N one-process workers sharing 8 connections, then 100,000"
echo "   ranks as 12,500 nodes x 8 (Rendezvous.JoinNode); goals: 10,000 <= 1 s,"
echo "   100,000 <= 10 s with time per join within 1.5x of 10,000's; nodes <= 3 s."
echo "   client h2: the simulated workers send the same HTTP/2 requests from a"
echo "   lean client (bench/h2_unary_client.h); grpc: from gRPC's C++ client,"
echo "   which takes about as much of the 2 cores as the coordinator does"
printf "%8s %6s %6s %10s %12s %10s %7s %7s\n" ranks nproc client ranked_s \
  per_join_us vs_10k wrong failed
declare -A base=()
for spec in 10000:1:h2 50000:1:h2 100000:1:h2 100000:8:h2 10000:1:grpc \
            100000:1:grpc; do
  IFS=: read -r n p client <<<"$spec"
  r=$("$load" --workers="$n" --nproc_per_node="$p" --channels=8 --kv_ops=2000 \
        --join_client="$client" --timeout=300s | grep '^RESULT')
  per=$(field per_join_us "$r")
  [ "$p" = 1 ] && [ -z "${base[$client]:-}" ] && base[$client]=$per
  ratio=-  # a node join carries 8 ranks: not comparable
  [ "$p" = 1 ] && ratio=$(awk -v a="$per" -v b="${base[$client]}" \
    'BEGIN { printf "%.2f", a / b }')
  printf "%8d %6d %6s %10s %12s %10s %7s %7s\n" "$n" "$p" "$client" \
    "$(field ranked_s "$r")" "$per" "$ratio" "$(field wrong "$r")" \
    "$(field failed "$r")"
  [ "$(field wrong "$r")" = 0 ] && [ "$(field failed "$r")" = 0 ] || {
    echo "gradsync gave wrong ranks: $r" >&2; exit 1; }
done

echo
echo "== the coordinator's memory per rank (gradsync-coordinator on its own,"
echo "   its resident memory before and after the joins)"
bazel build //server:gradsync-coordinator 2>&1 | tail -n 1
for spec in 10000:1 100000:1 100000:8; do
  n=${spec%:*}; p=${spec#*:}
  dir=$(mktemp -d)
  bazel-bin/server/gradsync-coordinator --listen=127.0.0.1:0 \
    --port_file="$dir/port" 2>/dev/null &
  pid=$!
  for _ in $(seq 100); do [ -s "$dir/port" ] && break; sleep 0.1; done
  r=$("$load" --workers="$n" --nproc_per_node="$p" --channels=8 --kv_ops=100 \
        --timeout=300s --coordinator="127.0.0.1:$(cat "$dir/port")" \
        --coordinator_pid="$pid" | grep '^RESULT')
  kill "$pid"; wait "$pid" || true
  rm -rf "$dir"
  printf "%8d ranks, %d per join: %s bytes per rank\n" "$n" "$p" \
    "$(field rss_bytes_per_rank "$r")"
done
