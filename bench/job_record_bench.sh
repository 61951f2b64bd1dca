#!/usr/bin/env bash
# What keeping a job's record costs, per backend: bench/job_record_bench
# (a job of N members closing, every member completing, a recovery, a
# reload) in memory, in a --state_dir (SQLite) and on a one-member etcd on
# loopback that this script starts (when /usr/bin/etcd is there). Linear
# means the per-member columns stay flat as N grows.
#   bench/job_record_bench.sh [--members=1000,10000,100000] [BENCH FLAG...]
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build -c opt //bench:job_record_bench 2>&1 | tail -n 1
bin=bazel-bin
source bench/lib.sh
backends=memory,state
if [ -x /usr/bin/etcd ]; then
  start_etcd
  backends+=,etcd
fi
bazel-bin/bench/job_record_bench --backends="$backends" \
  --state_root="$work/state" --etcd="${etcd_endpoint:-}" "$@"
