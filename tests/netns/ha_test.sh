#!/usr/bin/env bash
# //tests/netns:ha_test: coordinator replicas on etcd, each on a host of its
# own (tests/netns/lib.sh): etcd on e, replicas on c1 (leads) and c2 (stands
# by), a gradsync-worker on each of a and b told both replicas, 150 steps of
# 100 ms. Mid-training the leader is cut from etcd but not from its workers
# ({c1, a, b} | {e, c2}), until c2 leads; then the switch is whole again.
# Checked: no key-value answer of c1 was sent after c2's term began (each
# answer names its term: tests/netns/check_terms.py), and c1 stopped (it
# exits when it can no longer be sure of its lease) before c2 began to
# lead, by their logs' clocks (the same machine's): no two replicas served
# at one time; the workers moved to c2, nobody was
# LOST (c2 gives members its restart grace), and the job SUCCEEDED in
# round 1. Beside it, a job of one simulated worker writes a key a step
# through the failover and reads every write the coordinators acknowledged
# back at the end: none lost.
set -uo pipefail
cd "${TEST_SRCDIR}/${TEST_WORKSPACE}"
# shellcheck source=tests/netns/lib.sh
source tests/netns/lib.sh
netns_scenario ha_test

netns_etcd
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

netns_train "$replicas" ha a b
netns_await_step "$replicas" ha 20

netns_partition "c1 a b"
deadline=$((SECONDS + 30))
until leads c2; do
  [ $SECONDS -lt $deadline ] || fail "c2 never led: $(tail -5 "$tmp/c2.log")"
  sleep 0.1
done
netns_heal
netns_finish "$replicas" ha
# Per answer: none of c1's after c2's term began (the key-value checker
# reads through the failover; c1 answers reads from memory until it stops).
netns_check_terms "$tmp/c1.log" "$tmp/c2.log"

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

echo "ha_test: the workers moved to c2"
echo "ha_test: OK"
