#!/usr/bin/env bash
# Start-up benchmark of `gradsync launch` against torchrun, side by side in
# one run on this machine:
#   1. time from the command to the first training step of a PyTorch DDP
#      script (tests/worker/launch/ddp_script.py, Gloo on CPU), one node of
#      --nproc processes: torchrun --standalone vs gradsync launch against a
#      coordinator that is already running (it is a service); the median of
#      --rounds interleaved runs each, and their ratio (goal <= 1.0);
#   2. time until all of --many processes of a trivial program are ranked
#      and running (gradsync launch --nproc_per_node=MANY vs torchrun
#      --no_python), median of --rounds runs each, and their ratio.
#   bench/launch_bench.sh [--nproc=4] [--many=64] [--rounds=3] [--no_build]
set -euo pipefail
cd "$(dirname "$0")/.."

nproc=4 many=64 rounds=3 build=1
for arg in "$@"; do
  case "$arg" in
    --nproc=*) nproc=${arg#*=} ;;
    --many=*) many=${arg#*=} ;;
    --rounds=*) rounds=${arg#*=} ;;
    --no_build) build=0 ;;
    *) echo "launch_bench: unknown argument $arg" >&2; exit 2 ;;
  esac
done
if [ "$build" = 1 ]; then
  deploy/install_deps.sh
  bazel build //server:gradsync-coordinator //cli:gradsync >&2
fi
bin=bazel-bin
py=/usr/bin/python3
script=tests/worker/launch/ddp_script.py
work=$(mktemp -d)
coordinator_pid=
cleanup() {
  [ -n "$coordinator_pid" ] && kill "$coordinator_pid" 2>/dev/null && wait "$coordinator_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

"$bin/server/gradsync-coordinator" --listen=127.0.0.1:0 \
  --port_file="$work/port" >"$work/coordinator.log" 2>&1 &
coordinator_pid=$!
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
coordinator="127.0.0.1:$(cat "$work/port")"

now() { date +%s.%N; }
median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

# Seconds from the command to the script's first step (rank 0 prints it).
first_step() {  # LOG START
  local at
  at=$(grep -ho "first step done at [0-9.]*" "$1" | awk '{print $5}')
  awk -v a="$at" -v s="$2" 'BEGIN {printf "%.3f\n", a - s}'
}

run_torchrun() {  # ROUND
  local start; start=$(now)
  timeout 300 "$py" -m torch.distributed.run --standalone \
    --nproc_per_node="$nproc" --redirects=1 --tee=1 \
    --log_dir="$work/torchrun-$1" "$script" "$work/p-torchrun" \
    >"$work/torchrun-$1.log" 2>&1
  first_step "$work/torchrun-$1.log" "$start"
}

run_launch() {  # ROUND
  local start; start=$(now)
  timeout 300 "$bin/cli/gradsync" launch --coordinator="$coordinator" \
    --job="startup-$1" --nproc_per_node="$nproc" --python="$py" \
    "$script" "$work/p-launch" >"$work/launch-$1.log" 2>&1
  first_step "$work/launch-$1.log" "$start"
}

# Seconds until every process of a trivial program wrote its start time.
many_up() {  # DIR START
  local last
  last=$(cat "$1"/* | sort -g | tail -1)
  [ "$(ls "$1" | wc -l)" = "$many" ] || { echo "launch_bench: not all $many ran" >&2; exit 1; }
  awk -v a="$last" -v s="$2" 'BEGIN {printf "%.3f\n", a - s}'
}

trivial='date +%s.%N > "$OUT_DIR/$RANK"'
run_many_torchrun() {
  local dir="$work/many-torchrun-$1" start; mkdir -p "$dir"; start=$(now)
  OUT_DIR=$dir timeout 300 "$py" -m torch.distributed.run --standalone \
    --nproc_per_node="$many" --no_python --redirects=1 --tee=1 \
    --log_dir="$work/many-torchrun-logs-$1" /bin/sh -c "$trivial" \
    >"$work/many-torchrun-$1.log" 2>&1
  many_up "$dir" "$start"
}
run_many_launch() {
  local dir="$work/many-launch-$1" start; mkdir -p "$dir"; start=$(now)
  OUT_DIR=$dir timeout 300 "$bin/cli/gradsync" launch \
    --coordinator="$coordinator" --job="many-$1" --nproc_per_node="$many" \
    -- /bin/sh -c "$trivial" >"$work/many-launch-$1.log" 2>&1
  many_up "$dir" "$start"
}

: >"$work/t-torchrun"; : >"$work/t-launch"; : >"$work/m-torchrun"; : >"$work/m-launch"
for r in $(seq "$rounds"); do
  run_torchrun "$r" >>"$work/t-torchrun"
  run_launch "$r" >>"$work/t-launch"
  run_many_torchrun "$r" >>"$work/m-torchrun"
  run_many_launch "$r" >>"$work/m-launch"
done
t_torchrun=$(median <"$work/t-torchrun"); t_launch=$(median <"$work/t-launch")
m_torchrun=$(median <"$work/m-torchrun"); m_launch=$(median <"$work/m-launch")
echo "machine: $(nproc) cores; $rounds rounds each, medians"
echo "command to first DDP step, $nproc processes: torchrun $t_torchrun s," \
     "gradsync launch $t_launch s, ratio $(awk -v a="$t_launch" -v b="$t_torchrun" 'BEGIN {printf "%.2f", a / b}')" \
     "(runs: torchrun $(tr '\n' ' ' <"$work/t-torchrun")| launch $(tr '\n' ' ' <"$work/t-launch"))"
echo "all $many processes running: torchrun $m_torchrun s," \
     "gradsync launch $m_launch s, ratio $(awk -v a="$m_launch" -v b="$m_torchrun" 'BEGIN {printf "%.2f", a / b}')" \
     "(runs: torchrun $(tr '\n' ' ' <"$work/m-torchrun")| launch $(tr '\n' ' ' <"$work/m-launch"))"
