#!/usr/bin/env bash
# Key-value Sets across a slow link with the coordinator's receive windows
# grown by gRPC's BDP probe (--grow_receive_windows=true, the default) and
# kept at HTTP/2's 64 KiB (false): what the smaller windows cost messages
# larger than 64 KiB. Two simulated hosts (tests/netns/lib.sh: network
# namespaces made and removed here; needs root), every packet between them
# DELAY_MS late through the harness's user-space switch (default 50: a
# 100 ms round trip, no loss); bench/kv_set_time on one, a coordinator on
# the other, one setting after the other.
#   bazel build //server:gradsync-coordinator //bench:kv_set_time
#   bench/receive_window_bench.sh [DELAY_MS]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
delay=${1:-50}
cd "$root/bazel-bin" || exit 1
TEST_TMPDIR=$(mktemp -d)
export TEST_TMPDIR
# shellcheck source=tests/netns/lib.sh
source "$root/tests/netns/lib.sh"
netns_scenario receive_window_bench
netns_init
for host in coord client; do netns_host "$host"; done
netns_slow_links "$delay" 0 1
for grow in true false; do
  netns_coordinator coord "$(netns_slow_addr coord)" \
    --grow_receive_windows="$grow"
  echo "--grow_receive_windows=$grow, every packet $delay ms late:"
  netns_run client timeout 300 "$bin/bench/kv_set_time" \
    --coordinator="$address" | tee "$TEST_TMPDIR/$grow.txt" ||
    fail "kv_set_time failed"
  # shellcheck disable=SC2046 # one word per process
  kill $(ip netns pids "${netns_prefix}coord") 2>/dev/null
  sleep 1
done
# The ratio per size, 64 KiB windows over grown ones.
paste "$TEST_TMPDIR/false.txt" "$TEST_TMPDIR/true.txt" | awk '{
  printf "set %s bytes: 64 KiB / grown windows = %.2f\n", $2, $5 / $16 }'
rm -rf "$TEST_TMPDIR"
