#!/usr/bin/env bash
# gradsync demo: starts a coordinator and two gradsync-worker processes on
# this machine (one node, 2 processes, CPU, Gloo) that join job "demo",
# build their process group through the coordinator and train an MLP with
# DistributedDataParallel on a synthetic dataset; rank 0 prints the loss as it
# falls while `gradsync watch` shows live per-rank metrics until the job ends.
# Then the CLI shows the finished job. Installs and builds what it needs first.
#   deploy/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install_deps.sh

echo "== building (the first build on 2 cores takes a while)"
bazel build //server:gradsync-coordinator //worker:gradsync-worker \
  //cli:gradsync 2>&1 | tail -n 2
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
cli=("$bin/cli/gradsync" "--coordinator=$address")

echo "== two workers join job 'demo' (1 node x 2 processes) and train"
train=(--coordinator="$address" --job=demo --nnodes=1 --nproc_per_node=2
       --model=mlp --hidden=128 --dataset=synthetic --batch_size=32
       --steps=600 --lr=0.05 --log_every=60 --threads=1)
workers=()
for i in 0 1; do
  "$bin/worker/gradsync-worker" "${train[@]}" \
    > >(sed -u "s/^/  [worker $i] /") 2> >(sed -u "s/^/  [worker $i] /" >&2) &
  workers+=($!)
done

# The job exists once the first worker has joined.
for _ in $(seq 100); do "${cli[@]}" status demo >/dev/null 2>&1 && break; sleep 0.1; done
echo "== gradsync watch demo (live per-rank metrics, ends with the job)"
"${cli[@]}" watch demo --interval=1s | sed -u 's/^/  [watch] /'
for w in "${workers[@]}"; do wait "$w"; done

echo "== gradsync jobs"
"${cli[@]}" jobs
echo "== gradsync status demo"
"${cli[@]}" status demo

echo "== stopping the coordinator"
kill -TERM "$coordinator_pid"
wait "$coordinator_pid"
