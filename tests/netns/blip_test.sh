#!/usr/bin/env bash
# //tests/netns:blip_test: the harness's first scenarios, over three
# simulated hosts (tests/netns/lib.sh): a coordinator on one, a
# gradsync-worker on each of the two others (Gloo over the switch), 100
# steps of 100 ms (--step_sleep). The coordinator hears heartbeats every
# 500 ms and finds a member lost after 6 missed (3 s).
#   blip: worker b's link is cut for 1 s mid-training: nobody is LOST, no
#         recovery, the job SUCCEEDS in round 1;
#   loss: the same cut for 6 s: b is found lost (the harness can cut), the
#         job re-forms and still SUCCEEDS (--nnodes=1:2);
#   reset: b's TCP connections to the coordinator are reset (`ss -K`: its
#         heartbeat stream breaks, as at a proxy restart): b reconnects
#         within the coordinator's reconnect grace (its log says its
#         heartbeats reach the coordinator again), nobody is LOST, round 1.
#         With --reconnect_grace=0s b is lost at once ("heartbeat stream
#         broke"; mutation-checked by hand).
#   slow: b's processes run a third of the time for 5 s (SIGSTOP/SIGCONT:
#         a CPU-starved host): nobody is LOST, no recovery, SUCCEEDS.
#   death: b's link cut, then b SIGKILLed (no reset reaches a: a machine
#         that lost power): a's all-reduce in flight ends on the
#         coordinator's abort once b is found lost; a SUCCEEDS alone.
set -uo pipefail
cd "${TEST_SRCDIR}/${TEST_WORKSPACE}"
# shellcheck source=tests/netns/lib.sh
source tests/netns/lib.sh
netns_scenario blip_test

netns_init
netns_host coord
netns_host a
netns_host b
coord=$(netns_addr coord)
netns_coordinator coord "$coord" --heartbeat_interval=500ms \
  --missed_heartbeats=6
field() { netns_status coord "$@"; }

# scenario JOB FAULT...: trains JOB on hosts a and b, runs FAULT (a command)
# once both passed step 20, waits for both workers (2 min at most; b's may
# fail when $b_dies is set); leaves the status JSON in $tmp/JOB.json.
b_dies=""
scenario() {
  local job=$1 workers=() host
  shift
  for host in a b; do
    netns_run "$host" timeout 120 "$bin/worker/gradsync-worker" \
      --coordinator="$address" --job="$job" --nnodes=1:2 --node_id="$host" \
      --address="$(netns_addr "$host")" --shared_memory=false --model=mlp \
      --hidden=24 --dataset=synthetic --synthetic_size=96 --batch_size=4 \
      --steps=100 --step_sleep=100ms --threads=1 --log_every=0 \
      >"$tmp/$job.$host.log" 2>&1 &
    workers+=("$!")
  done
  local deadline=$((SECONDS + 60))
  until [ "$(field "$job" "min([m.get('step', 0) for m in j['members']] or [0]) if len(j['members']) == 2 else 0")" -ge 20 ] 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || fail "$job: the workers did not reach step 20"
    sleep 0.2
  done
  "$@"
  wait "${workers[0]}" || fail "$job: a failed: $(tail -5 "$tmp/$job".a.log)"
  wait "${workers[1]}" || [ -n "$b_dies" ] ||
    fail "$job: b failed: $(tail -5 "$tmp/$job".b.log)"
  netns_run coord "$bin/cli/gradsync" --coordinator="$address" \
    status "$job" --json >"$tmp/$job.json"
}

check() { $py -c "import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if ($2) else 1)" "$tmp/$1.json"; }

# cut SECONDS: b's link down for SECONDS.
cut() { netns_cut b; sleep "$1"; netns_mend b; }
# reset: b's TCP connections to the coordinator aborted (RST).
reset() { netns_run b ss -K dst "$coord" >/dev/null 2>&1; }

scenario blip cut 1
check blip "j['state'] == 'succeeded'" || fail "blip: $(cat "$tmp/blip.json")"
check blip "j.get('recovery_count', 0) == 0 and j['round'] == 1" ||
  fail "blip: a 1 s cut re-formed the job: $(cat "$tmp/blip.json")"
check blip "all(m['state'] == 'exited' for m in j['members'])" ||
  fail "blip: a member was lost: $(cat "$tmp/blip.json")"
echo "blip_test: a 1 s cut of host b: no loss, round 1, succeeded"

scenario loss cut 6
check loss "j['state'] == 'succeeded'" || fail "loss: $(cat "$tmp/loss.json")"
check loss "j.get('recovery_count', 0) >= 1 and 'lost' in j['recoveries'][0]['cause']" ||
  fail "loss: a 6 s cut was not a loss: $(cat "$tmp/loss.json")"
echo "blip_test: a 6 s cut of host b: $($py -c "import json; print(json.load(open('$tmp/loss.json'))['recoveries'][0]['cause'])"); succeeded"
scenario reset reset
check reset "j['state'] == 'succeeded'" || fail "reset: $(cat "$tmp/reset.json")"
check reset "j.get('recovery_count', 0) == 0 and j['round'] == 1" ||
  fail "reset: a broken stream cost a round: $(cat "$tmp/reset.json")"
grep -q "heartbeats reach the coordinator at .* again" "$tmp/reset.b.log" ||
  fail "reset: b's heartbeats never broke (did the reset do anything?)"
echo "blip_test: b's connections to the coordinator reset: no loss, round 1, succeeded"

# slow: host b runs a third of the time for 5 s (a CPU-starved host): its
# heartbeats come up to 200 ms late and its steps slow down, the job
# waiting for it; nobody is found lost.
scenario slow netns_slow_host b 5
check slow "j['state'] == 'succeeded'" || fail "slow: $(cat "$tmp/slow.json")"
check slow "all(m['state'] == 'exited' for m in j['members'])" ||
  fail "slow: a member was lost: $(cat "$tmp/slow.json")"
check slow "j.get('recovery_count', 0) == 0" ||
  fail "slow: a slow host cost a recovery: $(cat "$tmp/slow.json")"
echo "blip_test: host b starved of CPU for 5 s: no loss, round $($py -c "import json; print(json.load(open('$tmp/slow.json'))['round'])"), succeeded"

# silent death: b's link is cut, then b is SIGKILLed, so no reset ever
# reaches a (a machine that lost power): a's all-reduce in flight ends when
# the coordinator finds b lost (its abort), and a finishes alone.
# (b's link stays down: its kernel would send a's connection a FIN.)
silent_death() {
  netns_cut b
  kill -9 $(ip netns pids "${netns_prefix}b") 2>/dev/null
}
b_dies=1
scenario death silent_death
check death "j['state'] == 'succeeded' and j.get('recovery_count', 0) >= 1 and 'missed' in j['recoveries'][0]['cause']" ||
  fail "death: $(cat "$tmp/death.json")"
echo "blip_test: b cut off and killed: a's collective ended, $($py -c "import json; print(json.load(open('$tmp/death.json'))['recoveries'][0]['cause'])"); succeeded alone"
echo "blip_test: OK"
