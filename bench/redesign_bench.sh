#!/usr/bin/env bash
# The coordinator before and after a change, side by side in one run: this
# tree's load clients (bench/rendezvous_load, bench/heartbeat_load) against
# this tree's gradsync-coordinator and another build of it (e.g. the one
# from before the round-lifecycle redesign, issue 23), alternately, ROUNDS
# times. Each run gets a fresh coordinator process:
#   rendezvous: 100,000 one-process workers joining one job over 8
#               connections, then 20,000 key-value calls;
#   heartbeats: 50,000 members heartbeating once a second for 10 s (what
#               the clients got sent, and members lost).
# Prints every run's figures and, per measure, the median over rounds of
# new / old (below 1: the new one takes less time; for rates, above 1 is
# better).
#   bench/redesign_bench.sh OLD_COORDINATOR [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?the other gradsync-coordinator binary}
rounds=${2:-2}
bazel build //server:gradsync-coordinator //bench:rendezvous_load \
  //bench:heartbeat_load 2>&1 | tail -n 1
new=bazel-bin/server/gradsync-coordinator
work=$(mktemp -d)
pid=0
cleanup() { [ "$pid" = 0 ] || kill -9 "$pid" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" <<<"$2"; }

# start BINARY: a coordinator on a free loopback port; sets pid and address.
start() {
  rm -f "$work/port"
  "$1" --listen=127.0.0.1:0 --port_file="$work/port" \
    --max_streams_per_connection=0 2>"$work/coordinator.log" &
  pid=$!
  for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
  address="127.0.0.1:$(cat "$work/port")"
}
stop() { kill "$pid"; wait "$pid" || true; pid=0; }

declare -A results=()
for round in $(seq "$rounds"); do
  for side in old new; do
    binary=$old; [ "$side" = new ] && binary=$new
    start "$binary"
    r=$(bazel-bin/bench/rendezvous_load --workers=100000 --channels=8 \
          --kv_ops=20000 --timeout=300s --coordinator="$address" \
          --coordinator_pid="$pid" | grep '^RESULT')
    stop
    [ "$(field wrong "$r")" = 0 ] && [ "$(field failed "$r")" = 0 ] || {
      echo "$side: wrong or failed joins: $r" >&2; exit 1; }
    start "$binary"
    h=$(bazel-bin/bench/heartbeat_load --members=50000 --duration=10s \
          --status_queries=0 --coordinator="$address" --coordinator_pid="$pid")
    stop
    # With an external coordinator the client sees what it sent (the
    # coordinator's flow control slows it) and the members it lost.
    hr=$(grep '^RESULT' <<<"$h")
    sent=$(field sent "$hr"); lost=$(field lost "$hr")
    echo "round $round $side: 100,000 ranked in $(field ranked_s "$r") s," \
      "$(field kv_calls_per_s "$r") KV calls/s," \
      "$(field rss_bytes_per_rank "$r") bytes/rank; heartbeats sent" \
      "${sent}/s (${lost} members lost)"
    results[$side,$round]="$(field ranked_s "$r") $(field kv_calls_per_s "$r") $sent"
  done
done
for round in $(seq "$rounds"); do
  echo "${results[old,$round]} ${results[new,$round]}"
done | /usr/bin/python3 -c '
import statistics, sys
rows = [[float(x) for x in line.split()] for line in sys.stdin]
names = ["rendezvous time", "KV calls/s", "heartbeats sent/s"]
for i, name in enumerate(names):
    ratios = [r[3 + i] / r[i] for r in rows if r[i] > 0 and r[3 + i] > 0]
    if ratios:
        print(f"new / old, {name}: {statistics.median(ratios):.3f}")
'
