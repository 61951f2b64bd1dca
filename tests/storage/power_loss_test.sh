#!/usr/bin/env bash
# //tests/storage:power_loss_test: what the coordinator acknowledged
# survives a power loss, not only a SIGKILL (which the page cache survives).
# The coordinator runs with --state_dir under power_loss_shim.c (LD_PRELOAD),
# which keeps each file's contents as of its last fsync/fdatasync; 30 jobs
# are created (each acknowledged); then SIGKILL, and every file of the state
# directory is replaced by its last synced contents (a file never synced is
# removed). Restarted on what is left, the coordinator must list all 30.
# With SQLite's `PRAGMA synchronous=OFF` in server/storage/sqlite_storage.cc
# it does not: all 30 are lost (mutation-checked by hand; a first version of
# the check passed under it, reading the job list wrong).
set -uo pipefail
cd "${TEST_SRCDIR}/${TEST_WORKSPACE}"
bin=$PWD
tmp=${TEST_TMPDIR:-$(mktemp -d)}
py=/usr/bin/python3
fail() { echo "power_loss_test: FAIL: $*" >&2; exit 1; }
pid=0
cleanup() { [ "$pid" = 0 ] || kill -9 "$pid" 2>/dev/null; wait 2>/dev/null; }
trap cleanup EXIT

gcc -shared -fPIC -O2 -o "$tmp/shim.so" tests/storage/power_loss_shim.c \
  -ldl -lpthread || fail "cannot build the shim (gcc is needed)"
state=$tmp/state
mkdir -p "$state" "$state.synced"

# start [ENV...]: a coordinator on $state; sets pid and address.
start() {
  rm -f "$tmp/port"
  env "$@" "$bin/server/gradsync-coordinator" --listen=127.0.0.1:0 \
    --port_file="$tmp/port" --state_dir="$state" 2>>"$tmp/coordinator.log" &
  pid=$!
  for _ in $(seq 200); do [ -s "$tmp/port" ] && break; sleep 0.1; done
  [ -s "$tmp/port" ] || fail "no coordinator: $(tail -5 "$tmp/coordinator.log")"
  address="127.0.0.1:$(cat "$tmp/port")"
}
cli() { timeout 30 "$bin/cli/gradsync" --coordinator="$address" "$@"; }

start LD_PRELOAD="$tmp/shim.so" POWER_LOSS_DIR="$state"
for i in $(seq 30); do
  cli create "job$i" --nnodes=1 >/dev/null || fail "job$i was not created"
done
{ kill -9 "$pid"; wait "$pid"; } 2>/dev/null
pid=0

[ -n "$(ls -A "$state.synced")" ] || fail "the shim saw no sync: not loaded?"
lost=0
for file in "$state"/*; do
  name=$(basename "$file")
  if [ -f "$state.synced/$name" ]; then
    cp "$state.synced/$name" "$file"
  else
    rm -f "$file"
    lost=$((lost + 1))
  fi
done
echo "power_loss_test: after the power loss: $(ls "$state" | tr '\n' ' ')($lost file(s) never synced, removed)"

start
cli jobs --json >"$tmp/jobs.json" || fail "no job list after the restart"
missing=$($py -c "
import json, sys
listed = {j['job'] for j in json.load(open(sys.argv[1]))['jobs']}
print(' '.join(f'job{i}' for i in range(1, 31) if f'job{i}' not in listed) or 'none')" "$tmp/jobs.json") ||
  fail "cannot read the job list: $(cat "$tmp/jobs.json")"
[ "$missing" = none ] || fail "acknowledged jobs lost at the power loss: $missing"
echo "power_loss_test: all 30 acknowledged jobs survived the power loss"
echo "power_loss_test: OK"
