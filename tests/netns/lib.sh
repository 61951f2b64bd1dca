# The fault-injection harness's simulated hosts (sourced by the scenarios
# in this folder): each host is a network namespace with one address on a
# switch (a bridge in a namespace of its own), all made by the scenario and
# removed when it exits. Needs root (ip netns, veth, bridge). No netem here:
# faults are cuts of a host's link (blips, partitions of one host from all
# the others); latency and loss in user space are still to come (issue 24).
#
#   source tests/netns/lib.sh
#   netns_init                 # the switch; traps EXIT to remove everything
#   netns_host NAME            # a host: NAME's address in $(netns_addr NAME)
#   netns_run NAME CMD...      # runs CMD on host NAME (in the background:
#                              # add &; netns_cleanup kills what remains)
#   netns_cut NAME / netns_mend NAME   # NAME's link down / up again
#   netns_partition "A B ..."  # the switch split: A B ... apart from the rest
#   netns_heal                 # one switch again
#
# Names of this run carry its pid ($$): parallel runs do not meet.

netns_prefix="gs$$"
netns_hosts=()
netns_switch="${netns_prefix}sw"

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

netns_cleanup() {
  local name ns pids
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
