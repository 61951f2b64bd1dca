#!/usr/bin/env bash
# //tests/netns:ha_test: coordinator replicas on etcd, each on a host of its
# own (tests/netns/lib.sh): etcd on e, replicas on c1 (leads) and c2 (stands
# by), a gradsync-worker on each of a and b told both replicas, 150 steps of
# 100 ms. Mid-training the leader is cut from etcd but not from its workers
# ({c1, a, b} | {e, c2}), until c2 leads; then the switch is whole again.
# Checked: c1 stopped (it exits when it can no longer be sure of its lease)
# before c2 began to lead, by their logs' clocks (the same machine's): no
# two replicas served at one time; the workers moved to c2, nobody was
# LOST (c2 gives members its restart grace), and the job SUCCEEDED in
# round 1. Beside it, a job of one simulated worker writes a key a step
# through the failover and reads every write the coordinators acknowledged
# back at the end: none lost.
set -uo pipefail
cd "${TEST_SRCDIR}/${TEST_WORKSPACE}"
bin=$PWD
tmp=${TEST_TMPDIR:-$(mktemp -d)}
py=/usr/bin/python3
etcd=${GRADSYNC_ETCD:-/usr/bin/etcd}
# shellcheck source=tests/netns/lib.sh
source tests/netns/lib.sh
fail() { echo "ha_test: FAIL: $*" >&2; exit 1; }
[ -x "$etcd" ] || fail "no etcd binary at $etcd (etcd-server)"

netns_init
for host in e c1 c2 a b; do netns_host "$host"; done
e=$(netns_addr e)
netns_run e "$etcd" --name=e --data-dir="$tmp/etcd" \
  --listen-client-urls="http://$e:2379" --advertise-client-urls="http://$e:2379" \
  --listen-peer-urls="http://$e:2380" --initial-advertise-peer-urls="http://$e:2380" \
  --initial-cluster="e=http://$e:2380" --logger=zap \
  --log-outputs="$tmp/etcd.log" &

# replica NAME: a coordinator on host NAME, port 29400; its port file is
# written once it leads.
replica() {
  netns_run "$1" "$bin/server/gradsync-coordinator" \
    --listen="$(netns_addr "$1"):29400" --port_file="$tmp/$1.port" \
    --etcd="$e:2379" --heartbeat_interval=500ms --missed_heartbeats=6 \
    2>"$tmp/$1.log" &
}
leads() { [ -s "$tmp/$1.port" ]; }
replica c1
for _ in $(seq 300); do leads c1 && break; sleep 0.1; done
leads c1 || fail "c1 never led: $(tail -5 "$tmp/c1.log")"
c1_pid=$(ip netns pids "${netns_prefix}c1" | head -1)
replica c2
sleep 1
leads c2 && fail "two replicas lead at once"
replicas="$(netns_addr c1):29400,$(netns_addr c2):29400"

field() {
  netns_run a "$bin/cli/gradsync" --coordinator="$replicas" \
    status ha --json 2>/dev/null |
    $py -c "import json,sys; j=json.load(sys.stdin); print($1)" 2>/dev/null
}

workers=()
for host in a b; do
  netns_run "$host" timeout 150 "$bin/worker/gradsync-worker" \
    --coordinator="$replicas" --job=ha --nnodes=2 --node_id="$host" \
    --address="$(netns_addr "$host")" --shared_memory=false --model=mlp \
    --hidden=24 --dataset=synthetic --synthetic_size=96 --batch_size=4 \
    --steps=150 --step_sleep=100ms --threads=1 --log_every=0 \
    >"$tmp/$host.log" 2>&1 &
  workers+=("$!")
done
# The checker of acknowledged key-value writes: a job of its own on host a,
# one write a step across the failover, every acknowledged one read back
# at the end (gradsync-sim-worker --kv_checks).
netns_run a timeout 150 "$bin/worker/gradsync-sim-worker" \
  --coordinator="$replicas" --job=hakv --nnodes=1 --node_id=kv \
  --train_steps=150 --step_time=100ms --kv_checks >"$tmp/kv.log" 2>&1 &
kv=$!
deadline=$((SECONDS + 60))
until [ "$(field "min([m.get('step', 0) for m in j['members']] or [0]) if len(j['members']) == 2 else 0")" -ge 20 ] 2>/dev/null; do
  [ $SECONDS -lt $deadline ] || fail "the workers did not reach step 20"
  sleep 0.2
done

netns_partition "c1 a b"
deadline=$((SECONDS + 30))
until leads c2; do
  [ $SECONDS -lt $deadline ] || fail "c2 never led: $(tail -5 "$tmp/c2.log")"
  sleep 0.1
done
netns_heal
for w in "${workers[@]}"; do
  wait "$w" || fail "a worker failed: $(tail -5 "$tmp"/a.log "$tmp"/b.log)"
done
kv_verdict() { grep -h "kv checks\|gradsync-sim-worker:" "$tmp/kv.log" | tail -2; }
wait "$kv" || fail "key-value checks: $(kv_verdict)"
grep -q "kv checks: [1-9][0-9]* writes acknowledged, [0-9]* not, 0 lost" \
  "$tmp/kv.log" || fail "key-value checks: $(kv_verdict)"
echo "ha_test: $(grep "kv checks" "$tmp/kv.log")"

# The clocks of the two events: HH:MM:SS.micros of glog-style lines.
clock() { grep -m1 "$2" "$tmp/$1.log" | sed -n 's/^[IWEF][0-9]* \([0-9:.]*\) .*/\1/p'; }
stopped=$(clock c1 "lost the leadership")
led=$(clock c2 "leading the coordinators")
[ -n "$stopped" ] || fail "c1 did not stop: $(tail -5 "$tmp/c1.log")"
[ -n "$led" ] || fail "c2 has no 'leading' line: $(tail -5 "$tmp/c2.log")"
kill -0 "$c1_pid" 2>/dev/null && fail "c1 still runs"
[[ "$stopped" < "$led" ]] ||
  fail "c1 served until $stopped, after c2 began to lead at $led"
echo "ha_test: c1 stopped at $stopped, c2 led from $led"

netns_run a "$bin/cli/gradsync" --coordinator="$replicas" status ha --json \
  >"$tmp/ha.json" || fail "no status from c2"
$py -c "
import json, sys
j = json.load(open(sys.argv[1]))
ok = (j['state'] == 'succeeded' and j['round'] == 1 and
      j.get('recovery_count', 0) == 0 and
      all(m['state'] == 'exited' for m in j['members']))
sys.exit(0 if ok else 1)" "$tmp/ha.json" ||
  fail "the job did not end in round 1 with every member exited: $(cat "$tmp/ha.json")"
echo "ha_test: the workers moved to c2; nobody lost, round 1, succeeded"
echo "ha_test: OK"
