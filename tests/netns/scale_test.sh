#!/usr/bin/env bash
# //tests/netns:scale_test: 1,000 simulated members on a simulated host of
# their own (bench/heartbeat_load: one heartbeat stream each, over 8
# connections, 1 a second) and a coordinator on another (a heartbeat every
# 1 s, LOST after 5 missed), through the harness's switch
# (tests/netns/lib.sh).
#   blips: the members' host is cut off twice for 1 s, 6 s apart, while
#          they heartbeat for 20 s: nobody is LOST (the job stays in round
#          1), every member heard from within 2 intervals at the end;
#   slow:  the same 1,000 over links 200 ms late with 5% of the packets
#          lost, on a fresh coordinator: nobody LOST.
set -uo pipefail
cd "${TEST_SRCDIR}/${TEST_WORKSPACE}"
# shellcheck source=tests/netns/lib.sh
source tests/netns/lib.sh
netns_scenario scale_test

netns_init
netns_host coord
netns_host sims
netns_seed scale_test
netns_slow_links 200 0.05 "$seed"

# load AT: 1,000 members heartbeating for 20 s to a fresh coordinator on
# coord at address AT (the previous one stopped); the load's output in
# $tmp/load.AT.out.
load() {
  local at=$1 pid
  pid=$(ip netns pids "${netns_prefix}coord")
  [ -z "$pid" ] || { kill $pid; sleep 1; }
  netns_coordinator coord "$at" --heartbeat_interval=1s --missed_heartbeats=5 \
    --max_streams_per_connection=0
  pid=$(ip netns pids "${netns_prefix}coord" | head -1)
  netns_run sims timeout 180 "$bin/bench/heartbeat_load" --members=1000 \
    --job_size=1000 --duration=20s --status_members=0 \
    --coordinator="$address" --coordinator_pid="$pid" --netns_harness \
    >"$tmp/load.$at.out" 2>&1
}
# result AT FIELD: FIELD of the load's RESULT line (lost, stale, failed).
result() { sed -n "s/^RESULT .* $2=\([0-9]*\) .*/\1/p" "$tmp/load.$1.out"; }

plain=$(netns_addr coord)
load "$plain" &
loader=$!
sleep 10  # the joins, the 2 s warm-up, then into the measured 20 s
netns_cut sims; sleep 1; netns_mend sims
sleep 6
netns_cut sims; sleep 1; netns_mend sims
wait $loader || fail "blips: $(grep -h "^RESULT\|FAIL\|failed" "$tmp/load.$plain.out" | tail -3)"
[ "$(result "$plain" lost)" = 0 ] && [ "$(result "$plain" stale)" = 0 ] &&
  [ "$(result "$plain" failed)" = 0 ] ||
  fail "blips: $(grep -h "^RESULT" "$tmp/load.$plain.out")"
echo "scale_test: 1,000 members, two 1 s cuts of their host: nobody lost, none stale"

slow=$(netns_slow_addr coord)
load "$slow"
[ "$(result "$slow" lost)" = 0 ] && [ "$(result "$slow" failed)" = 0 ] ||
  fail "slow: $(grep -h "^RESULT" "$tmp/load.$slow.out") $(tail -3 "$tmp/load.$slow.out")"
echo "scale_test: 1,000 members over 200 ms / 5% loss links: nobody lost ($(result "$slow" stale) stale at the end)"
echo "scale_test: OK"
