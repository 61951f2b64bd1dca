#!/usr/bin/env bash
# The coordinator's own memory while its members heartbeat, and `gradsync
# status` of a 100,000-member job under load. Every row starts a fresh
# gradsync-coordinator process (its own heap, logging at INFO to /dev/null)
# and loads it with bench/heartbeat_load --coordinator.
#   bench/coordinator_memory.sh
# Prints, per row, the coordinator's resident memory per member after the
# joins and at the end of 10 s of heartbeats at 1 Hz, each over its memory
# before the joins; then the wall time of 20 `gradsync status` runs, one
# after another (process start to exit), while 100,000 members heartbeat
# as 12,500 nodes of 8, and one of their outputs.
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build //bench:heartbeat_load //server:gradsync-coordinator \
  //cli:gradsync 2>&1 | tail -n 1
load=bazel-bin/bench/heartbeat_load
cli=bazel-bin/cli/gradsync

field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" <<<"$2"; }

dir=$(mktemp -d)
pid=""       # the coordinator
load_pid=""  # the load of the status part, while it runs
# Whatever ends the script, the processes it started end with it.
cleanup() {
  for p in $load_pid $pid; do kill "$p" 2>/dev/null || true; done
  for p in $load_pid $pid; do wait "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT

# Starts a fresh coordinator on a free loopback port: sets pid and port.
start_coordinator() {
  rm -f "$dir/port"
  bazel-bin/server/gradsync-coordinator --listen=127.0.0.1:0 \
    --port_file="$dir/port" --max_streams_per_connection=0 2>/dev/null &
  pid=$!
  for _ in $(seq 100); do [ -s "$dir/port" ] && break; sleep 0.1; done
  [ -s "$dir/port" ] || { echo "the coordinator did not start" >&2; exit 1; }
  port=$(cat "$dir/port")
}
stop_coordinator() { kill "$pid"; wait "$pid" || true; pid=""; }

echo "== the coordinator's memory per member: after the joins, and at the end"
echo "   of 10 s of heartbeats at 1 Hz (jobs of 10,000; a node stream carries 8)"
echo "   (x: the heartbeat interval the coordinator asked for at the end, in"
echo "   intervals: above 1 it was shedding load)"
printf "%8s %8s %18s %24s %3s %6s %7s\n" members streams joined_bytes/member \
  heartbeating_bytes/member x "#lost" "#stale"
failed=0
for spec in 10000:1 10000:8 40000:1 100000:8; do
  n=${spec%:*}; p=${spec#*:}
  start_coordinator
  r=$("$load" --members="$n" --nproc_per_node="$p" --duration=10s \
        --status_members=0 --coordinator="127.0.0.1:$port" \
        --coordinator_pid="$pid" | grep '^RESULT' || true)
  stop_coordinator
  printf "%8d %8d %18s %24s %3s %6s %7s\n" "$n" $((n / p)) \
    "$(field rss_bytes_per_member_joined "$r")" \
    "$(field rss_bytes_per_member_heartbeating "$r")" "$(field factor "$r")" \
    "$(field lost "$r")" "$(field stale "$r")"
  [ "$(field lost "$r")" = 0 ] && [ "$(field stale "$r")" = 0 ] &&
    [ "$(field failed "$r")" = 0 ] ||
    { echo "not every member live: $r" >&2; failed=1; }
done

echo
echo "== gradsync status of one 100,000-member job while it heartbeats"
echo "   (12,500 node streams of 8 at 1 Hz): 20 runs, process start to exit"
start_coordinator
"$load" --members=100000 --job_size=100000 --nproc_per_node=8 --duration=30s \
  --status_members=0 --coordinator="127.0.0.1:$port" --coordinator_pid="$pid" \
  >"$dir/load.out" 2>&1 &
load_pid=$!
job=load0-0  # heartbeat_load's first job of its first level
status() { "$cli" --coordinator="127.0.0.1:$port" status "$job"; }
# Until the round closed (the job list is cheap; the status of a job still
# forming lists every waiting member), then until every member was heard
# from: at most 3 minutes.
deadline=$((SECONDS + 180))
until "$cli" --coordinator="127.0.0.1:$port" jobs 2>/dev/null |
    awk -v job="$job" '$1 == job && $3 == 1 { found = 1 } END { exit !found }'; do
  [ "$SECONDS" -lt "$deadline" ] || { echo "round 1 did not close" >&2; exit 1; }
  sleep 1
done
until status 2>/dev/null | grep "100000 of 100000 heard from" >/dev/null; do
  [ "$SECONDS" -lt "$deadline" ] || { echo "members not heard from" >&2; exit 1; }
  sleep 0.5
done
: >"$dir/ns"
for _ in $(seq 20); do
  start=$(date +%s%N)
  status >"$dir/status.txt"
  echo $(($(date +%s%N) - start)) >>"$dir/ns"
done
sort -n "$dir/ns" | awk '{ ms[NR - 1] = $1 / 1e6 } END {
  printf "p50 %.1f ms, p90 %.1f ms, max %.1f ms (%d runs)\n",
    ms[int(NR / 2)], ms[int(0.9 * (NR - 1))], ms[NR - 1], NR }'
echo "lines printed: $(wc -l <"$dir/status.txt"); the last run's output:"
sed 's/^/    /' "$dir/status.txt"
wait "$load_pid" || true
load_pid=""
stop_coordinator
r=$(grep '^RESULT' "$dir/load.out" || true)
echo "the load meanwhile: $(field sent "$r") heartbeats/s sent of" \
  "$(field offered "$r") offered over its 30 s, interval x$(field factor "$r")," \
  "#lost $(field lost "$r"), #stale $(field stale "$r")"
[ "$(field lost "$r")" = 0 ] && [ "$(field stale "$r")" = 0 ] &&
  [ "$(field failed "$r")" = 0 ] ||
  { echo "not every member live: $r" >&2; failed=1; }
exit "$failed"
