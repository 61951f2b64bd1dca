#!/usr/bin/env bash
# How soon a real hang is named and healed: the self-set timeouts against
# fixed ones, side by side in one run. Three gradsync-workers (a small MLP,
# steps of a few milliseconds: --step_sleep=3ms, so that the 2000 steps
# before the hang bring the coordinator the 8 step times its timeout sets
# itself from, at its default 1 s heartbeats; shared memory) and a
# coordinator on loopback;
# one worker stands still before step 2000's first collective while its
# heartbeats go on (--failpoint=hang:2000). Each mode polls `gradsync status
# --json` until the hang is named, then until round 2 (the healed round)
# forms.
#   self-set: the defaults (coordinator hang timeout 10 x p99 of the step
#             times, at least 1 s; workers' collective timeout the same, at
#             least 10 s);
#   fixed:    --hang_timeout_factor=0 and --collective_timeout_factor=0 (the
#             coordinator's --hang_timeout of 30 s, the workers' --timeout).
# Both modes run with --timeout=60s (a fixed collective timeout shorter
# than PyTorch's 10-30 minutes, so that the fixed run ends in minutes).
#   bench/hang_bench.sh [BAZEL_BIN]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-bazel-bin}
py=/usr/bin/python3
source bench/lib.sh

now() { date +%s.%N; }

# run MODE COORDINATOR_FLAGS WORKER_FLAGS: prints "named N s, healed M s".
run() {
  local mode=$1 cflags=$2 wflags=$3
  # shellcheck disable=SC2086  # the flags are words
  start_coordinator "$mode" $cflags
  local coordinator=$coordinator_pid
  local workers=()
  for i in 0 1 2; do
    local fail=""
    [[ $i == 1 ]] && fail="--failpoint=hang:2000"
    "$bin/worker/gradsync-worker" --coordinator="$address" --job=hang \
      --nnodes=3 --node_id="n$i" --model=mlp --hidden=24 --dataset=synthetic \
      --synthetic_size=96 --batch_size=4 --steps=4000 --threads=1 \
      --log_every=0 --timeout=60s --step_sleep=3ms $wflags $fail \
      >"$work/$mode.$i.log" 2>&1 &
    workers+=("$!")
    pids+=("$!")
  done
  local deadline=$(( $(date +%s) + 300 ))
  until grep -q "failpoint hang hit" "$work/$mode.1.log"; do
    (( $(date +%s) < deadline )) || { echo "$mode: no hang"; return 1; }
    sleep 0.02
  done
  local hit; hit=$(now)
  local named="" healed=""
  while [[ -z $healed ]]; do
    (( $(date +%s) < deadline )) || { echo "$mode: not healed"; return 1; }
    local json
    json=$("$bin/cli/gradsync" --coordinator="$address" status hang \
      --json 2>/dev/null || true)
    local t; t=$(now)
    if [[ -z $named ]] && $py -c 'import json,sys; d=json.loads(sys.argv[1]); sys.exit(0 if d.get("diagnosis",{}).get("hang") else 1)' "$json" 2>/dev/null; then
      named=$($py -c "print(f'{$t - $hit:.2f}')")
    fi
    if $py -c 'import json,sys; d=json.loads(sys.argv[1]); sys.exit(0 if d.get("round",0) >= 2 else 1)' "$json" 2>/dev/null; then
      healed=$($py -c "print(f'{$t - $hit:.2f}')")
    fi
    sleep 0.05
  done
  for w in "${workers[@]}"; do wait "$w" || true; done
  kill "$coordinator"; wait "$coordinator" || true
  echo "$mode: hang named in status after ${named:-never} s, round re-formed after $healed s"
  results+=("${named:-nan}" "$healed")
}

results=()
run self-set "" ""
run fixed "--hang_timeout_factor=0" "--collective_timeout_factor=0"
$py -c "
n1, h1, n2, h2 = (float(x) for x in '${results[*]}'.split())
print(f'self-set / fixed: named {n1 / n2:.3f}, healed {h1 / h2:.3f}')"
