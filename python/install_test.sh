#!/usr/bin/env bash
# //python:install_test: `pip install ./python` as docs/pytorch.md says,
# offline, into a `python3 -m venv --system-site-packages` environment with
# Debian's setuptools, wheel, protoc and grpc_python_plugin. From there the
# package imports with the stubs its build generated, talks to a real
# coordinator, and a PyTorch script under `gradsync launch
# --python=VENV/bin/python` finds it with no PYTHONPATH. The extension
# module Bazel built (GRADSYNC_EXTENSION) goes in with it: the same script
# runs on the process group backend "gradsync".
set -euo pipefail
cd "${TEST_SRCDIR}/${TEST_WORKSPACE}"
here=$PWD
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "install_test: FAIL: $*" >&2; exit 1; }
unset PYTHONPATH

# A checkout's python/ and proto/ (pip builds in place, beside the sources).
src=$tmp/src
rm -rf "$src" && mkdir -p "$src/proto/gradsync"
cp -rL python "$src/python"
rm -rf "$src/python/gradsync/_gen"
cp -rL proto/gradsync/v1 "$src/proto/gradsync/v1"

venv=$tmp/venv
rm -rf "$venv"
/usr/bin/python3 -m venv --system-site-packages "$venv"
GRADSYNC_EXTENSION=$here/python/gradsync/_C.so \
  "$venv/bin/pip" install --quiet --no-build-isolation --no-index "$src/python" \
  || fail "pip install failed"
cd "$tmp"
"$venv/bin/python" - <<'PY' || fail "the installed package does not import"
import gradsync, gradsync.torch
from gradsync import _proto
assert "/venv/" in gradsync.__file__, gradsync.__file__
assert gradsync.torch.process_groups_available()
assert "/venv/" in _proto.kv_pb2.__file__, _proto.kv_pb2.__file__
print("install_test: imported", gradsync.__file__)
PY

"$here/server/gradsync-coordinator" --listen=127.0.0.1:0 \
  --port_file="$tmp/port" 2>"$tmp/coordinator.log" &
pid=$!
trap 'kill -9 $pid 2>/dev/null || true' EXIT
for _ in $(seq 300); do [ -s "$tmp/port" ] && break; sleep 0.1; done
[ -s "$tmp/port" ] || fail "the coordinator did not start: $(cat "$tmp/coordinator.log")"
address=127.0.0.1:$(cat "$tmp/port")
"$venv/bin/python" -c "import gradsync; print(gradsync.Client('$address').list_jobs())" \
  >/dev/null || fail "gradsync.Client could not list jobs"
timeout 120 "$here/cli/gradsync" launch --coordinator="$address" \
  --job=venv --nnodes=1 --nproc_per_node=2 --python="$venv/bin/python" \
  "$here/python/tests/init_script.py" >"$tmp/launch.log" 2>&1 \
  || fail "gradsync launch failed: $(cat "$tmp/launch.log")"
grep -q "rank 1 of 2: sum 3" "$tmp/launch.log" \
  || fail "the script did not all-reduce: $(cat "$tmp/launch.log")"
INIT_BACKEND=gradsync timeout 120 "$here/cli/gradsync" launch --coordinator="$address" \
  --job=venv-pg --nnodes=1 --nproc_per_node=2 --python="$venv/bin/python" \
  "$here/python/tests/init_script.py" >"$tmp/launch-pg.log" 2>&1 \
  || fail "gradsync launch on the backend 'gradsync' failed: $(cat "$tmp/launch-pg.log")"
grep -q "rank 1 of 2: sum 3" "$tmp/launch-pg.log" \
  || fail "no all-reduce on 'gradsync': $(cat "$tmp/launch-pg.log")"
kill -TERM $pid
wait $pid || fail "the coordinator exited $? on SIGTERM"
trap - EXIT
echo "install_test: OK"
