#!/usr/bin/env bash
# Rendezvous benchmark, side by side in one run: gradsync's coordinator vs
# PyTorch's TCPStore (Debian python3-torch 1.13) handing ranks to N clients
# on this machine, then gradsync alone at 10,000 workers.
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
echo "== 10,000 workers sharing 8 connections (coordinator capacity; goal <= 1 s)"
"$load" --workers=10000 --channels=8
