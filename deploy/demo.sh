#!/usr/bin/env bash
# gradsync demo: starts a coordinator and three worker processes that join a
# job (nodes 2:3), bootstrap through the coordinator's key-value store and
# report their ranks; a fourth arrives late and waits as a spare; then the
# CLI shows the job. Installs what it needs first.
#   deploy/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install_deps.sh

echo "== building (first build on 2 cores: a few minutes)"
bazel build //server:gradsync-coordinator //worker:gradsync-sim-worker \
  //worker/cli:gradsync 2>&1 | tail -n 2
bin=bazel-bin
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

echo "== starting the coordinator on 127.0.0.1 (log: coordinator lines below)"
"$bin/server/gradsync-coordinator" --listen=127.0.0.1:0 \
  --port_file="$work/port" 2> >(sed -u 's/^/  [coordinator] /' >&2) &
coordinator_pid=$!
pids+=("$coordinator_pid")
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
[ -s "$work/port" ] || { echo "coordinator did not start" >&2; exit 1; }
address="127.0.0.1:$(cat "$work/port")"
cli=("$bin/worker/cli/gradsync" "--coordinator=$address")

echo "== three workers join job 'demo' (nodes 2:3)"
workers=()
for i in 0 1 2; do
  "$bin/worker/gradsync-sim-worker" --coordinator="$address" --job=demo \
    --nnodes=2:3 --node_id="node-$i" | sed -u "s/^/  [worker node-$i] /" &
  workers+=($!)
done
for w in "${workers[@]}"; do wait "$w"; done

echo "== a fourth worker arrives after the round closed: it waits as a spare"
"$bin/worker/gradsync-sim-worker" --coordinator="$address" --job=demo \
  --nnodes=2:3 --node_id=node-3 >/dev/null 2>&1 &
spare_pid=$!
pids+=("$spare_pid")
for _ in $(seq 100); do
  "${cli[@]}" status demo --json | grep -q '"spares": \[$' && break
  sleep 0.1
done

echo "== gradsync jobs"
"${cli[@]}" jobs
echo "== gradsync status demo"
"${cli[@]}" status demo
echo "== gradsync status demo --json (first lines)"
"${cli[@]}" status demo --json | head -n 16

echo "== stopping the spare, then the coordinator"
kill "$spare_pid" 2>/dev/null || true
wait "$spare_pid" 2>/dev/null || true
kill -TERM "$coordinator_pid"
wait "$coordinator_pid"
