#!/usr/bin/env bash
# deploy/gpu_run.sh's step python_elastic: a PyTorch training loop on the
# GPU through gradsync._C, recovering in place. In a build tree gpu_run.sh
# configured, it builds the extension (CMake target python_gradsync_C)
# against the machine's PyTorch, installs the package as a user would
# (`pip install ./python` with GRADSYNC_EXTENSION, into BUILD_DIR/pypkg),
# runs python/tests/extension_smoke.py --cuda, then python/tests/
# elastic_script.py under `gradsync launch --self_managed --device=auto
# --nproc_per_node=gpu` with ELASTIC_DEVICE=cuda and the failpoint
# nccl_async_error:20 in local rank 0: its 20th NCCL collective fails after
# the host moved on, the loop's backward() raises before the optimizer step,
# and the same process re-creates its communicator in round 2 and finishes.
#
#   deploy/gpu/python_elastic.sh BUILD_DIR PYTHON COORDINATOR_ADDRESS [DEVICE]
#
# DEVICE: cuda (default), or sim to try the same without a GPU (one
# simulated GPU; the smoke test's CUDA case is left out).
#
# Ends with "python_elastic: rounds=R failpoint_hit=H steps=S" and exit 0
# when the job succeeded after the failpoint fired; non-zero otherwise.
set -uo pipefail
cd "$(dirname "$0")/../.."
build_dir=$(cd "$1" && pwd) python=$2 coordinator=$3 device=${4:-cuda}
steps=40
case "$device" in
  cuda) launch_device=auto smoke_args=(--cuda) ;;
  sim) launch_device=sim smoke_args=(); export GRADSYNC_SIM_DEVICES=1 ;;
  *) echo "python_elastic: DEVICE must be cuda or sim, not '$device'" >&2; exit 2 ;;
esac

why=$(grep -o 'leaving out the Python extension: .*' "$build_dir/configure.log" 2>/dev/null)
[ -z "$why" ] || { echo "python_elastic: $why"; exit 1; }
cmake --build "$build_dir" --target python_gradsync_C || exit 1
extension=$build_dir/python/gradsync/_C.so
"$python" python/tests/extension_smoke.py "$extension" "${smoke_args[@]}" || exit 1

rm -rf "$build_dir/pypkg"
GRADSYNC_EXTENSION=$extension "$python" -m pip install --quiet --no-deps \
  --no-build-isolation --target "$build_dir/pypkg" ./python || exit 1

out=$build_dir/python_elastic
rm -rf "$out" && mkdir -p "$out"
start=$SECONDS
PYTHONPATH=$build_dir/pypkg ELASTIC_DEVICE=$device ELASTIC_STEPS=$steps \
  ELASTIC_FAILPOINT=nccl_async_error:20 ELASTIC_FAILPOINT_RANK=0 \
  ELASTIC_OUT=$out/params \
  "$build_dir/cli/gradsync" launch --coordinator="$coordinator" \
  --job=gpu-python-elastic --self_managed --max_restarts=1 --device=$launch_device \
  --nproc_per_node=gpu --python="$(command -v "$python")" \
  python/tests/elastic_script.py 2>&1 | tee "$out/launch.log"
code=${PIPESTATUS[0]}
rounds=$(grep -c 'pid [0-9]*: round [0-9]* rank' "$out/launch.log")
hit=$(grep -c 'failpoint nccl_async_error hit' "$out/launch.log")
echo "python_elastic: rounds=$rounds failpoint_hit=$hit steps=$steps seconds=$((SECONDS - start))"
[ "$code" -eq 0 ] || { echo "python_elastic: gradsync launch exited $code"; exit 1; }
[ "$hit" -gt 0 ] || { echo "python_elastic: the failpoint did not fire"; exit 1; }
grep -q 'round 2 rank 0 of .* on nccl' "$out/launch.log" ||
  { echo "python_elastic: no round 2 on NCCL after the injected error"; exit 1; }
