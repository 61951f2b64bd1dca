#!/usr/bin/env bash
# ctest's python.python_elastic_sim: deploy/gpu/python_elastic.sh (the GPU
# check's step python_elastic) run end to end without a GPU, on one
# simulated GPU, against a CMake build tree: the extension built and
# pip-installed there, the uninterrupted run, the run with an injected
# asynchronous NCCL error that heals in place, and the comparison, so that
# the step's script works before a GPU machine first runs it.
#
#   deploy/gpu/python_elastic_test.sh BUILD_DIR PYTHON
set -uo pipefail
cd "$(dirname "$0")/../.."
build_dir=$(cd "$1" && pwd) python=$2
tmp=$(mktemp -d)
port_file=$tmp/port
"$build_dir/server/gradsync-coordinator" --listen=127.0.0.1:0 \
  --port_file="$port_file" >"$tmp/coordinator.log" 2>&1 &
coordinator=$!
trap 'kill "$coordinator" 2>/dev/null; wait "$coordinator" 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do [ -s "$port_file" ] && break; sleep 0.1; done
[ -s "$port_file" ] || { echo "python_elastic_test: the coordinator did not start"; exit 1; }
timeout -k 5 240 deploy/gpu/python_elastic.sh "$build_dir" "$python" \
  "127.0.0.1:$(cat "$port_file")" sim >"$tmp/step.log" 2>&1
code=$?
tail -n 20 "$tmp/step.log"
[ "$code" -eq 0 ] || { echo "python_elastic_test: the step failed (exit $code)"; exit 1; }
grep -q '^python_elastic: rounds=2 failpoint_hit=1 ' "$tmp/step.log" ||
  { echo "python_elastic_test: not the result line of a healed run"; exit 1; }
echo "python_elastic_test: OK"
