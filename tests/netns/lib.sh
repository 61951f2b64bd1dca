# The fault-injection harness's simulated hosts (sourced by the scenarios
# in this folder): each host is a network namespace with one address on a
# switch (a bridge in a namespace of its own), all made by the scenario and
# removed when it exits. Needs root (ip netns, veth, bridge). No netem here:
# faults are cuts of a host's link, partitions of the switch, and slow
# links through a user-space switch (slow_switch.py: a TUN device per host,
# packets delayed or dropped by one process).
#
#   cd "${TEST_SRCDIR}/${TEST_WORKSPACE}"; source tests/netns/lib.sh
#   netns_scenario NAME        # sets $bin (the runfiles root), $tmp (the
#                              # test's scratch folder) and $py; fail MSG
#                              # exits 1 with "NAME: FAIL: MSG"
#   netns_init                 # the switch; traps EXIT to remove everything
#   netns_host NAME            # a host: NAME's address in $(netns_addr NAME)
#   netns_run NAME CMD...      # runs CMD on host NAME (in the background:
#                              # add &; netns_cleanup kills what remains)
#   netns_cut NAME / netns_mend NAME   # NAME's link down / up again
#   netns_partition "A B ..."  # the switch split: A B ... apart from the rest
#   netns_heal                 # one switch again
#   netns_pause NAME / netns_resume NAME  # SIGSTOP / SIGCONT every process
#                              # on host NAME
#   netns_coordinator NAME AT FLAGS...  # a coordinator on host NAME at
#                              # address AT; sets $address (HOST:PORT)
#   netns_status NAME JOB EXPR # EXPR (Python over JOB's status JSON `j`),
#                              # asked from host NAME
# The last two use the scenario's $bin (the runfiles root) and $tmp.
#   netns_train COORDS JOB HOST...  # a gradsync-worker of JOB on each HOST
#                              # (150 steps of 100 ms, --nnodes = the hosts),
#                              # and on the first host the key-value checker
#                              # (gradsync-sim-worker --kv_checks, job JOBkv)
#   netns_await_step COORDS JOB N  # until every member of JOB passed step N
#                              # (fails after 90 s, or at once when a worker
#                              # ended, with the last status and the logs'
#                              # ends: netns_log_tails)
#   netns_finish COORDS JOB    # waits for them; fails unless JOB succeeded
#                              # in round 1, nobody lost, and the checker
#                              # read back every acknowledged write
#   netns_check_terms LOG...   # (after netns_finish, replicas on etcd)
#                              # fails unless every key-value answer the
#                              # checker got names a term that no newer
#                              # term had begun before it was sent
#                              # (check_terms.py; LOG: the replicas' logs)
#   netns_slow_host NAME SECONDS  # NAME's processes run a third of the
#                              # time for SECONDS (a CPU-starved host)
#   netns_etcd                 # sets $etcd (the etcd binary) or fails
#   netns_seed TEST            # sets $seed (GRADSYNC_FAULT_SEED, or drawn)
#                              # and prints it: "TEST: seed N (replay: ...)"
#   netns_slow_links MS LOSS SEED  # (after the last netns_host) a second
#                              # network through slow_switch.py: every
#                              # packet MS ms late, LOSS (0-1) of them
#                              # dropped; NAME's address there is
#                              # $(netns_slow_addr NAME)
#
# Names of this run carry its pid ($$): parallel runs do not meet.

netns_prefix="gs$$"
netns_hosts=()
netns_switch="${netns_prefix}sw"

netns_scenario() {
  netns_name=$1
  bin=$PWD
  tmp=${TEST_TMPDIR:-$(mktemp -d)}
  py=/usr/bin/python3
}
fail() { echo "$netns_name: FAIL: $*" >&2; exit 1; }

netns_fail() {
  echo "netns: FAIL: $*" >&2
  exit 1
}

netns_init() {
  [ "$(id -u)" = 0 ] || netns_fail "the harness needs root (ip netns)"
  command -v ip >/dev/null || netns_fail "no ip command (iproute2)"
  trap netns_cleanup EXIT
  ip netns add "$netns_switch" || netns_fail "cannot create a network namespace"
  ip -n "$netns_switch" link add br0 type bridge || netns_fail "no bridge"
  ip -n "$netns_switch" link set br0 up
  ip -n "$netns_switch" link set lo up
}

# The address of host NAME (hosts are numbered in the order they were made).
netns_addr() {
  local i
  for i in "${!netns_hosts[@]}"; do
    [ "${netns_hosts[$i]}" = "$1" ] && { echo "10.77.0.$((i + 1))"; return; }
  done
  netns_fail "no host $1"
}

netns_host() {
  local name=$1 ns="${netns_prefix}$1" port="${netns_prefix}$1"
  netns_hosts+=("$name")
  local addr; addr=$(netns_addr "$name")
  ip netns add "$ns" || netns_fail "cannot create host $name"
  ip link add "$port" type veth peer name eth0 netns "$ns" ||
    netns_fail "cannot link host $name"
  ip link set "$port" netns "$netns_switch"
  ip -n "$netns_switch" link set "$port" master br0
  ip -n "$netns_switch" link set "$port" up
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
}

netns_run() {
  local name=$1
  shift
  ip netns exec "${netns_prefix}${name}" "$@"
}

# The host's port on the switch goes down: no packet to or from it passes
# (TCP connections are not reset; they stall, as behind a dead switch).
netns_cut() { ip -n "$netns_switch" link set "${netns_prefix}$1" down; }
netns_mend() { ip -n "$netns_switch" link set "${netns_prefix}$1" up; }

netns_pause() {
  local pids; pids=$(ip netns pids "${netns_prefix}$1")
  [ -z "$pids" ] || kill -STOP $pids 2>/dev/null
}
netns_resume() {
  local pids; pids=$(ip netns pids "${netns_prefix}$1")
  [ -z "$pids" ] || kill -CONT $pids 2>/dev/null
}

# Sets $etcd, the etcd binary ($GRADSYNC_ETCD, or Debian's etcd-server's),
# or fails.
# Every process on host NAME runs a third of the time (stopped 200 ms of
# every 300 ms) for SECONDS, as on a host whose CPU a noisy neighbour takes;
# returns when done.
netns_slow_host() {
  local end=$((SECONDS + $2))
  while [ $SECONDS -lt $end ]; do
    netns_pause "$1"; sleep 0.2
    netns_resume "$1"; sleep 0.1
  done
}

netns_etcd() {
  etcd=${GRADSYNC_ETCD:-/usr/bin/etcd}
  [ -x "$etcd" ] || netns_fail "no etcd binary at $etcd (etcd-server)"
}

netns_seed() {
  seed=${GRADSYNC_FAULT_SEED:-$(( $(date +%s) % 100000 ))}
  echo "$1: seed $seed (replay: GRADSYNC_FAULT_SEED=$seed)"
}

netns_trainers=()
netns_kv_pid=0
netns_train() {
  local coords=$1 job=$2 host
  shift 2
  for host in "$@"; do
    netns_run "$host" timeout 150 "$bin/worker/gradsync-worker" \
      --coordinator="$coords" --job="$job" --nnodes=$# --node_id="$host" \
      --address="$(netns_addr "$host")" --shared_memory=false --model=mlp \
      --hidden=24 --dataset=synthetic --synthetic_size=96 --batch_size=4 \
      --steps=150 --step_sleep=100ms --threads=1 --log_every=0 \
      >"$tmp/$host.log" 2>&1 &
    netns_trainers+=("$!")
  done
  # One key-value write a step, every acknowledged one read back at the end.
  netns_run "$1" timeout 150 "$bin/worker/gradsync-sim-worker" \
    --coordinator="$coords" --job="${job}kv" --nnodes=1 --node_id=kv \
    --train_steps=150 --step_time=100ms --kv_checks >"$tmp/kv.log" 2>&1 &
  netns_kv_pid=$!
}

netns_await_step() {
  local deadline=$((SECONDS + 90)) step status w
  until status=$(netns_run "${netns_hosts[-1]}" "$bin/cli/gradsync" \
        --coordinator="$1" status "$2" --json 2>&1) &&
      step=$(/usr/bin/python3 -c "import json,sys; j=json.load(sys.stdin); print(min([m.get('step', 0) for m in j['members']] or [0]) if len(j['members']) > 0 else 0)" \
        <<<"$status" 2>/dev/null) && [ "$step" -ge "$3" ] 2>/dev/null; do
    for w in "${netns_trainers[@]}"; do
      kill -0 "$w" 2>/dev/null ||
        netns_fail "$2: a worker ended before step $3; $(netns_log_tails)"
    done
    [ $SECONDS -lt $deadline ] || netns_fail "$2: the workers did not reach \
step $3 in 90 s; the last status: $(tail -c 1500 <<<"$status"); $(netns_log_tails)"
    sleep 0.2
  done
}

# The last lines of every log of this scenario (a failure's evidence).
netns_log_tails() {
  local log
  echo "the logs' ends:"
  for log in "$tmp"/*.log; do
    [ -f "$log" ] || continue
    echo "-- $log"
    tail -n 6 "$log" | cut -c1-300
  done
}

netns_finish() {
  local w verdict
  for w in "${netns_trainers[@]}"; do
    wait "$w" || netns_fail "a worker failed: $(tail -3 "$tmp"/*.log)"
  done
  verdict=$(grep -h "kv checks\|gradsync-sim-worker:" "$tmp/kv.log" | tail -2)
  wait "$netns_kv_pid" || netns_fail "key-value checks: $verdict"
  grep -q "kv checks: [1-9][0-9]* writes acknowledged, [0-9]* not, 0 lost" \
    "$tmp/kv.log" || netns_fail "key-value checks: $verdict"
  echo "netns: $verdict"
  netns_run "${netns_hosts[-1]}" "$bin/cli/gradsync" --coordinator="$1" \
    status "$2" --json >"$tmp/$2.json" || netns_fail "no status of $2"
  /usr/bin/python3 -c "
import json, sys
j = json.load(open(sys.argv[1]))
ok = (j['state'] == 'succeeded' and j['round'] == 1 and
      j.get('recovery_count', 0) == 0 and
      all(m['state'] == 'exited' for m in j['members']))
sys.exit(0 if ok else 1)" "$tmp/$2.json" ||
    netns_fail "$2 did not end in round 1 with every member exited: $(cat "$tmp/$2.json")"
  echo "netns: $2: nobody lost, round 1, succeeded"
}

netns_check_terms() {
  local here verdict
  here=$(dirname "${BASH_SOURCE[0]}")
  verdict=$(/usr/bin/python3 "$here/check_terms.py" "$tmp/kv.log" "$@") ||
    netns_fail "$verdict"
  echo "netns: $verdict"
}

netns_coordinator() {
  local host=$1 at=$2 i
  shift 2
  rm -f "$tmp/port"
  netns_run "$host" "$bin/server/gradsync-coordinator" --listen="$at:0" \
    --port_file="$tmp/port" "$@" 2>>"$tmp/coordinator.log" &
  for i in $(seq 200); do [ -s "$tmp/port" ] && break; sleep 0.1; done
  [ -s "$tmp/port" ] ||
    netns_fail "no coordinator: $(tail -5 "$tmp/coordinator.log")"
  address="$at:$(cat "$tmp/port")"
}
netns_status() {
  netns_run "$1" "$bin/cli/gradsync" --coordinator="$address" \
    status "$2" --json 2>/dev/null |
    /usr/bin/python3 -c "import json,sys; j=json.load(sys.stdin); print($3)" \
      2>/dev/null
}

# The address of host NAME on the slow network (netns_slow_links).
netns_slow_addr() { netns_addr "$1" | sed 's/^10\.77\./10.78./'; }

netns_slow_pid=0
netns_slow_links() {
  local here name specs=()
  here=$(dirname "${BASH_SOURCE[0]}")
  for name in "${netns_hosts[@]}"; do
    specs+=("${netns_prefix}${name}=$(netns_slow_addr "$name")")
  done
  coproc netns_slow { exec /usr/bin/python3 -u "$here/slow_switch.py" \
    --delay_ms="$1" --loss="$2" --seed="$3" "${specs[@]}" 2>&1; }
  netns_slow_pid=$netns_slow_PID
  local ready=""
  read -r -t 10 ready <&"${netns_slow[0]}" || true
  [ "$ready" = ready ] || netns_fail "the slow switch did not start: $ready"
  for name in "${netns_hosts[@]}"; do
    ip -n "${netns_prefix}${name}" addr add "$(netns_slow_addr "$name")/24" \
      dev gsnet0 || netns_fail "no slow link on $name"
    ip -n "${netns_prefix}${name}" link set gsnet0 up
  done
}

netns_cleanup() {
  local name ns pids
  [ "$netns_slow_pid" = 0 ] || kill -9 "$netns_slow_pid" 2>/dev/null
  for name in "${netns_hosts[@]}" ""; do
    ns="${netns_prefix}${name}"
    [ -z "$name" ] && ns=$netns_switch
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  wait 2>/dev/null
  return 0
}

# The switch splits in two: the hosts named in SET_A (a quoted list) reach
# each other, the others reach each other, nobody across (their ports move
# to a second bridge; TCP connections across stall, nothing resets).
# netns_heal puts every host back on one switch.
netns_partition() {
  local name
  ip -n "$netns_switch" link show br1 >/dev/null 2>&1 || {
    ip -n "$netns_switch" link add br1 type bridge || netns_fail "no bridge"
    ip -n "$netns_switch" link set br1 up
  }
  for name in "${netns_hosts[@]}"; do
    case " $1 " in
      *" $name "*) ;;
      *) ip -n "$netns_switch" link set "${netns_prefix}${name}" master br1 ;;
    esac
  done
}
netns_heal() {
  local name
  for name in "${netns_hosts[@]}"; do
    ip -n "$netns_switch" link set "${netns_prefix}${name}" master br0
  done
}
