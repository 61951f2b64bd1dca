#!/usr/bin/env bash
# DDP benchmark, side by side in one run on this machine: gradsync-worker
# against PyTorch's DistributedDataParallel (python3-torch, Gloo on CPU or
# NCCL on CUDA) on the same model, batch and data, then gradsync's bucketed
# gradient sync against a raw all-reduce of the same bytes.
#   bench/ddp_bench.sh [--hidden=2800] [--batch_size=32] [--steps=60]
#                      [--world_size=2] [--threads=1] [--rounds=3]
#                      [--device=cpu|cuda] [--may_grow] [--gloo] [--no_build]
# Each configuration runs --rounds times, interleaved with its peer's runs so
# that machine noise hits both; the median of the runs' median step times is
# reported. Prints:
#   - step time of gradsync DDP and PyTorch DDP, and their ratio (goal <= 0.95);
#   - each one's overhead over one process training alone without sync
#     (goal: gradsync's <= half of PyTorch's);
#   - bucketed sync vs raw all-reduce throughput, Gloo and shared memory
#     (goal >= 97%; CPU only);
#   - with --may_grow: the step time of a round that may grow (--nnodes=1:2,
#     one node running: the ranks agree after every step whether to re-form
#     at the step boundary, a one-element all-reduce) over the fixed round's.
# --gloo runs gradsync's ranks over Gloo TCP instead of shared memory.
set -euo pipefail
cd "$(dirname "$0")/.."

hidden=2800 batch=32 steps=60 world=2 threads=1 rounds=3 device=cpu build=1
may_grow=0 shm=true
for arg in "$@"; do
  case "$arg" in
    --hidden=*) hidden=${arg#*=} ;;
    --batch_size=*) batch=${arg#*=} ;;
    --steps=*) steps=${arg#*=} ;;
    --world_size=*) world=${arg#*=} ;;
    --threads=*) threads=${arg#*=} ;;
    --rounds=*) rounds=${arg#*=} ;;
    --device=*) device=${arg#*=} ;;
    --may_grow) may_grow=1 ;;
    --gloo) shm=false ;;
    --no_build) build=0 ;;
    *) echo "ddp_bench: unknown argument $arg" >&2; exit 2 ;;
  esac
done
# Where the binaries are: Bazel's output, or a CMake build dir (GPU machines).
bin=${GRADSYNC_BIN:-bazel-bin}
python=${PYTHON:-/usr/bin/python3}
if [ "$build" = 1 ] && [ "$bin" = bazel-bin ]; then
  deploy/install_deps.sh python3-torch
  bazel build //server:gradsync-coordinator //worker:gradsync-worker \
    //bench:allreduce_bench 2>&1 | tail -n 1
fi
# find_bin DIR NAME: $bin/DIR/NAME or $bin/NAME, whichever exists.
find_bin() {
  for f in "$bin/$1/$2" "$bin/$2"; do [ -x "$f" ] && { echo "$f"; return; }; done
  return 0
}
coordinator_bin=$(find_bin server gradsync-coordinator)
worker_bin=$(find_bin worker gradsync-worker)
allreduce_bin=$(find_bin bench allreduce_bench)
[ -n "$coordinator_bin" ] && [ -n "$worker_bin" ] || {
  echo "ddp_bench: no gradsync-coordinator / gradsync-worker under $bin" >&2; exit 1; }

work=$(mktemp -d)
cleanup() { [ -n "${coord_pid:-}" ] && kill "$coord_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
"$coordinator_bin" --listen=127.0.0.1:0 --port_file="$work/port" \
  >"$work/coordinator.log" 2>&1 &
coord_pid=$!
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
port=$(cat "$work/port")

common=(--model=mlp --hidden="$hidden" --batch_size="$batch" --steps="$steps"
        --synthetic_size=8192 --lr=0.01 --threads="$threads" --device="$device"
        --warmup_steps=5 --log_every=0)
torch_common=(--hidden="$hidden" --batch_size="$batch" --steps="$steps"
              --synthetic_size=8192 --threads="$threads" --device="$device"
              --warmup=5 --world_size="$world")
# gradsync_ddp ROUND [NNODES]: one DDP run as job "bench-ROUND" (runs in a
# subshell, so the job id comes from the caller), on one node of NNODES
# (default 1).
gradsync_ddp() {
  local job=$1 nnodes=${2:-1} pids=()
  for r in $(seq "$world"); do
    "$worker_bin" --coordinator="127.0.0.1:$port" --job="bench-$job" \
      --nnodes="$nnodes" --last_call_timeout=0s --shared_memory="$shm" \
      --nproc_per_node="$world" "${common[@]}" \
      --summary_json="$work/gs.json" >"$work/gs-$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { cat "$work"/gs-*.log >&2; exit 1; }; done
  json_field median_step_ms "$work/gs.json"
}
gradsync_local() {
  "$worker_bin" --standalone "${common[@]}" --summary_json="$work/gl.json" \
    >"$work/gl.log" 2>&1 || { cat "$work/gl.log" >&2; exit 1; }
  json_field median_step_ms "$work/gl.json"
}
torch_run() {
  "$python" bench/torch_ddp.py "${torch_common[@]}" "$@" 2>"$work/t.err" \
    | sed -n 's/.*median_step_ms=\([0-9.]*\).*/\1/p' | grep . \
    || { cat "$work/t.err" >&2; exit 1; }
}
json_field() { "$python" -c "import json,sys; print(json.load(open(sys.argv[2]))[sys.argv[1]])" "$1" "$2"; }
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

params=$("$python" -c "h=$hidden; print(784*h + h + h*h + h + 10*h + 10)")
echo "== $device, MLP 784-$hidden-$hidden-10 ($params parameters), batch $batch per rank," \
     "$world ranks, $threads thread(s) per rank, $steps steps (5 warm-up), $rounds rounds," \
     "gradsync over $([ "$shm" = true ] && echo "shared memory" || echo "Gloo TCP")"
gs_ddp=() gs_local=() t_ddp=() t_local=() gs_grow=()
for round in $(seq "$rounds"); do
  gs_ddp+=("$(gradsync_ddp "$round")")
  if [ "$may_grow" = 1 ]; then
    gs_grow+=("$(gradsync_ddp "grow-$round" 1:2)")
    echo "round $round: gradsync ddp in a round that may grow ${gs_grow[-1]} ms"
  fi
  t_ddp+=("$(torch_run)")
  gs_local+=("$(gradsync_local)")
  t_local+=("$(torch_run --local)")
  echo "round $round: gradsync ddp ${gs_ddp[-1]} ms, torch ddp ${t_ddp[-1]} ms," \
       "gradsync alone ${gs_local[-1]} ms, torch alone ${t_local[-1]} ms"
done
g=$(echo "${gs_ddp[*]}" | median); t=$(echo "${t_ddp[*]}" | median)
gl=$(echo "${gs_local[*]}" | median); tl=$(echo "${t_local[*]}" | median)
awk -v g="$g" -v t="$t" -v gl="$gl" -v tl="$tl" 'BEGIN {
  printf "%-28s %12s %12s\n", "median step time (ms)", "gradsync", "pytorch"
  printf "%-28s %12.2f %12.2f\n", "DDP, all ranks", g, t
  printf "%-28s %12.2f %12.2f\n", "one process, no sync", gl, tl
  go = (g - gl) / gl * 100; to = (t - tl) / tl * 100
  printf "%-28s %11.1f%% %11.1f%%\n", "DDP overhead", go, to
  printf "step-time ratio gradsync/pytorch: %.3f (goal <= 0.95)\n", g / t
  if (to > 0) printf "overhead ratio gradsync/pytorch: %.2f (goal <= 0.5)\n", go / to
  printf "RESULT gradsync_ms=%.3f torch_ms=%.3f gradsync_alone_ms=%.3f torch_alone_ms=%.3f step_ratio=%.3f\n", g, t, gl, tl, g / t
}'

if [ "$may_grow" = 1 ]; then
  gg=$(echo "${gs_grow[*]}" | median)
  awk -v g="$g" -v gg="$gg" 'BEGIN {
    printf "round that may grow: %.2f ms vs fixed %.2f ms, ratio %.3f\n", gg, g, gg / g
    printf "RESULT may_grow_ms=%.3f fixed_ms=%.3f may_grow_ratio=%.3f\n", gg, g, gg / g
  }'
fi

if [ "$device" = cpu ] && [ -n "$allreduce_bin" ]; then
  echo
  echo "== bucketed gradient sync vs one raw all-reduce of the same bytes ($world ranks;"
  echo "   gradsync-worker uses shm on one node, gloo across nodes)"
  "$allreduce_bin" --hidden="$hidden" --world_size="$world" --iterations=20 \
    --backend=gloo,shm
fi
