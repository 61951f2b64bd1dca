#!/usr/bin/env bash
# Builds and checks gradsync on a GPU machine that has PyTorch (its LibTorch),
# CUDA, NCCL, CMake, ninja and a C++ compiler, but no Bazel and no network.
#   deploy/gpu_run.sh --deps=DIR --out=DIR [--build_dir=DIR] [--jobs=N]
#       [--python=PY] [--torch=auto|off|CMAKE_PREFIX] [--nccl=ON|AUTO|OFF]
#       [--steps=N] [--device=cuda|cpu] [--no_bench]
#
#   --deps   Debian packages for gRPC, protobuf, abseil, Gloo, GoogleTest, ...
#            from deploy/pack_gpu_deps.sh: .deb files, unpacked with dpkg-deb
#            (or ar + tar) into BUILD_DIR/deps-root, never into /; or a folder
#            already holding such an unpacked tree (usr/...). Empty: use the
#            machine's own.
#   --out    where the logs go (created): env.txt, build.log,
#            nccl_backend_test.log, ctest.log, worker.log,
#            worker_summary.json, bench.log, launch.log, launch_params.txt,
#            ddp_features.log, summary.txt (11 files)
#   --build_dir  default build/gpu;  --jobs  default: all cores
#   --python     the Python with torch (default python3); --torch=auto takes
#                LibTorch from it (torch.utils.cmake_prefix_path), off builds
#                without LibTorch (no DDP, no trainer), a folder is a CMake
#                prefix holding TorchConfig.cmake
#   --nccl   GRADSYNC_WITH_NCCL (default ON: fail if CUDA/NCCL is missing);
#            NCCL is taken from the nvidia-nccl wheel next to torch when
#            there (the library torch itself loads), else from CUDA_HOME
#            (default /usr/local/cuda or nvcc's folder)
#   --steps  training steps for the gradsync-worker run (default 200)
#   --device  what gradsync-worker and the benchmark train on (default cuda;
#            cpu only to try this script on a machine without a GPU)
#   --no_bench  leave out bench/ddp_bench.sh (it takes minutes)
#
# Steps: record the machine; unpack the packages; configure and build
# everything with deploy/cmake_build.sh; run the NCCL backend test binary
# (then the whole ctest suite); if built, run gradsync-worker --device=cuda
# end to end against a local gradsync-coordinator; if present, run
# bench/ddp_bench.sh --device=cuda on the CMake build (GRADSYNC_BIN); run a
# PyTorch DDP script and gradsync-worker under gradsync launch; run
# gradsync-worker's DDP features on the GPU (ResNet-50 with SyncBatchNorm,
# the fp16 and PowerSGD hooks, a checkpoint and --resume) and, when the
# benchmark runs, ResNet-18 side by side with PyTorch DDP. Each
# missing piece is said plainly in summary.txt. Exits 0 when everything that
# exists passed.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

deps=
out=
build_dir=build/gpu
jobs=$(nproc)
python=python3
torch=auto
nccl=ON
steps=200
device=cuda
bench=1
for arg in "$@"; do
  case "$arg" in
    --deps=*) deps=${arg#*=} ;;
    --out=*) out=${arg#*=} ;;
    --build_dir=*) build_dir=${arg#*=} ;;
    --jobs=*) jobs=${arg#*=} ;;
    --python=*) python=${arg#*=} ;;
    --torch=*) torch=${arg#*=} ;;
    --nccl=*) nccl=${arg#*=} ;;
    --steps=*) steps=${arg#*=} ;;
    --device=*) device=${arg#*=} ;;
    --no_bench) bench=0 ;;
    *) echo "gpu_run: unknown argument '$arg' (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "gpu_run: --out=DIR is required" >&2; exit 2; }
mkdir -p "$out" "$build_dir"
out=$(cd "$out" && pwd)
build_dir=$(cd "$build_dir" && pwd)

results=()   # one line per step for summary.txt
failed=0
note() { echo "== $*"; }
record() {   # record STEP RESULT [DETAIL]
  results+=("$(printf '%-22s %-8s %s' "$1" "$2" "${3:-}")")
  [ "$2" = FAIL ] && failed=1
  return 0
}
finish() {
  {
    echo "gradsync gpu_run on $(hostname) at $(date -u +%FT%TZ)"
    printf '%s\n' "${results[@]}"
  } >"$out/summary.txt"
  echo
  cat "$out/summary.txt"
  exit "$failed"
}

# ---- 1. The machine.
note "machine (details: $out/env.txt)"
{
  echo "uname: $(uname -srm)"
  echo "glibc: $(ldd --version 2>&1 | head -n 1)"
  echo "c++: $(c++ --version 2>&1 | head -n 1)"
  echo "cmake: $(cmake --version 2>&1 | head -n 1)"
  echo "ninja: $(ninja --version 2>&1)"
  echo "nvcc: $(nvcc --version 2>&1 | tail -n 1)"
  nvidia-smi -L 2>&1 | sed 's/^/gpu: /'
  "$python" - <<'EOF' 2>&1
import os
try:
    import torch
except ImportError as e:
    print("torch: not importable:", e)
    raise SystemExit
print("torch:", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available(), "devices", torch.cuda.device_count())
print("torch cxx11 abi:", torch.compiled_with_cxx11_abi())
print("torch cmake prefix:", torch.utils.cmake_prefix_path)
print("torch nccl:", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "n/a")
lib = os.path.join(os.path.dirname(torch.__file__), "lib")
print("torch lib:", lib)
EOF
  # Symbols LibTorch exports that the Debian libraries also define: if it
  # exports its own Gloo or protobuf, the two copies meet in one process.
  torch_cpu=$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))' 2>/dev/null)
  if [ -f "$torch_cpu" ] && command -v nm >/dev/null; then
    nm -DC --defined-only "$torch_cpu" >"$build_dir/torch_cpu.symbols" 2>/dev/null
    echo "libtorch_cpu exports: $(grep -c ' gloo::' "$build_dir/torch_cpu.symbols") gloo::," \
      "$(grep -c ' google::protobuf::' "$build_dir/torch_cpu.symbols") google::protobuf:: symbols"
  fi
} >"$out/env.txt"
cat "$out/env.txt"
for tool in cmake ninja c++; do
  command -v "$tool" >/dev/null || { record "tools" FAIL "$tool not found"; finish; }
done

# ---- 2. LibTorch, CUDA and NCCL.
cmake_args=(-DGRADSYNC_WITH_NCCL="$nccl" -DCMAKE_BUILD_TYPE=Release
            -DCMAKE_POLICY_VERSION_MINIMUM=3.5)  # CMake 4 and Debian's old configs
prefix_path=()
build_ld_path=
case "$torch" in
  off) cmake_args+=(-DGRADSYNC_WITH_TORCH=OFF) ;;
  auto)
    torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null) || {
      record "libtorch" FAIL "$python cannot import torch (use --torch=off or --torch=PREFIX)"
      finish
    }
    prefix_path+=("$torch_prefix") ;;
  *) prefix_path+=("$torch") ;;
esac
# The NCCL torch loads (the nvidia-nccl wheel) keeps one libnccl.so.2 per
# process; else CUDA_HOME's.
nccl_root=$("$python" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
if [ -n "$nccl_root" ] && [ -f "$nccl_root/include/nccl.h" ]; then
  cmake_args+=(-DNCCL_ROOT="$nccl_root")
fi
cuda_home=${CUDA_HOME:-}
if [ -z "$cuda_home" ]; then
  if [ -d /usr/local/cuda ]; then cuda_home=/usr/local/cuda
  elif command -v nvcc >/dev/null; then cuda_home=$(dirname "$(dirname "$(command -v nvcc)")")
  fi
fi
if [ -n "$cuda_home" ]; then
  cmake_args+=(-DCUDA_HOME="$cuda_home")
  # LibTorch's CMake configuration enables the CUDA language: name nvcc.
  [ -x "$cuda_home/bin/nvcc" ] && cmake_args+=(-DCMAKE_CUDA_COMPILER="$cuda_home/bin/nvcc")
fi

# ---- 3. gRPC, protobuf, abseil, ... from the packages, in a private prefix.
if [ -n "$deps" ]; then
  deps=$(cd "$deps" && pwd)
  if [ -d "$deps/usr" ]; then
    root=$deps
  else
    root=$build_dir/deps-root
    # Unpacked already from the same files: keep it (and the build's
    # timestamps).
    stamp=$(cd "$deps" && ls -l --time-style=+%s -- *.deb 2>/dev/null | md5sum)
    if [ -f "$root/.unpacked" ] && [ "$(cat "$root/.unpacked")" = "$stamp" ]; then
      skip_unpack=1
    else
      skip_unpack=0
      rm -rf "$root"
      mkdir -p "$root"
    fi
    n=0
    for deb in "$deps"/*.deb; do
      [ "$skip_unpack" -eq 0 ] || break
      [ -f "$deb" ] || continue
      if command -v dpkg-deb >/dev/null; then
        dpkg-deb -x "$deb" "$root"
      else  # a .deb is an ar archive holding data.tar.*
        tmp=$(mktemp -d)
        (cd "$tmp" && ar x "$deb" && tar -xf data.tar.* -C "$root")
        rm -rf "$tmp"
      fi || { record "unpack" FAIL "$deb"; finish; }
      n=$((n + 1))
    done
    if [ "$skip_unpack" -eq 0 ]; then
      [ "$n" -gt 0 ] || { record "unpack" FAIL "no .deb in $deps"; finish; }
      echo "$stamp" >"$root/.unpacked"
      note "unpacked $n packages into $root"
    fi
  fi
  [ -f "$deps/packages.txt" ] && cp "$deps/packages.txt" "$build_dir/packages.txt"
  prefix_path=("$root/usr" "${prefix_path[@]}")
  lib_dirs="$root/usr/lib/x86_64-linux-gnu:$root/usr/lib"
  # protoc and grpc_cpp_plugin run during the build and load their libraries
  # from there (only during the build, see below).
  export PATH="$root/usr/bin:$PATH"
  build_ld_path="$lib_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The programs find the prefix's libraries by their RPATH, which (unlike a
  # RUNPATH) also serves the libraries' own dependencies, e.g. libgrpc.so's
  # libabsl_*.so: no LD_LIBRARY_PATH at run time, so the Python side of the
  # benchmark keeps the machine's own libraries. (No LIBRARY_PATH either:
  # CMake would take its folders for the compiler's own and leave them out
  # of the RPATH.)
  cmake_args+=(-DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags)
  record "unpack" OK "$root"
fi
if [ ${#prefix_path[@]} -gt 0 ]; then
  cmake_args+=(-DCMAKE_PREFIX_PATH="$(IFS=';'; echo "${prefix_path[*]}")")
fi

# ---- 4. Build everything.
note "building in $build_dir (log: $out/build.log)"
start=$SECONDS
if LD_LIBRARY_PATH=${build_ld_path:-${LD_LIBRARY_PATH:-}} \
     deploy/cmake_build.sh --build_dir="$build_dir" --jobs="$jobs" "${cmake_args[@]}" \
     >"$out/build.log" 2>&1; then
  record "build" OK "$((SECONDS - start))s"
else
  tail -n 40 "$out/build.log"
  record "build" FAIL "see build.log"
  finish
fi
grep -E '^-- gradsync:' "$build_dir/configure.log" | sed 's/^-- /   /'
# Which copies were found: the prefix's, the machine's?
grep -E '^(GRADSYNC_PROTOC|GRADSYNC_GRPC_CPP_PLUGIN|Protobuf_LIBRARY(_RELEASE)?|gRPC_DIR|absl_DIR|GLOO_LIBRARY|HTTPLIB_INCLUDE_DIR|Torch_DIR|NCCL_LIBRARY|CUDART_LIBRARY):' \
  "$build_dir/CMakeCache.txt" | sed 's/^/   /' | tee -a "$out/env.txt"

# ---- 5. The NCCL backend's tests, then the whole suite.
nccl_test=$build_dir/tests/worker/backend/nccl_backend_test
if [ -x "$nccl_test" ]; then
  note "NCCL backend tests (log: $out/nccl_backend_test.log)"
  "$nccl_test" >"$out/nccl_backend_test.log" 2>&1
  status=$?
  tail -n 25 "$out/nccl_backend_test.log"
  passed=$(grep -c '^\[       OK \]' "$out/nccl_backend_test.log")
  skipped=$(grep -c '^\[  SKIPPED \]' "$out/nccl_backend_test.log")
  failures=$(grep -c '^\[  FAILED  \] [A-Za-z]' "$out/nccl_backend_test.log")
  [ "$status" -eq 0 ] && r=OK || r=FAIL
  record "nccl_backend_test" "$r" "$passed passed, $failures failed, $skipped skipped (exit $status)"
else
  record "nccl_backend_test" MISSING "not built (--nccl=$nccl; see the NCCL line in build.log)"
fi
note "ctest, all tests (log: $out/ctest.log)"
(cd "$build_dir" && ctest -j "$jobs" --output-on-failure) >"$out/ctest.log" 2>&1
status=$?
tail -n 15 "$out/ctest.log"
[ "$status" -eq 0 ] && r=OK || r=FAIL
record "ctest" "$r" "$(grep -E 'tests passed' "$out/ctest.log" | tail -n 1)"

# A gradsync-coordinator on a free loopback port for steps 6 and 8: sets
# $coordinator_address (empty when it did not start) and $coordinator_pid.
start_coordinator() {  # LOG
  local port_file=$build_dir/coordinator.port
  rm -f "$port_file"
  "$build_dir/server/gradsync-coordinator" --listen=127.0.0.1:0 \
    --port_file="$port_file" > >(sed -u 's/^/[coordinator] /' >>"$1") 2>&1 &
  coordinator_pid=$!
  for _ in $(seq 100); do [ -s "$port_file" ] && break; sleep 0.1; done
  coordinator_address=
  [ -s "$port_file" ] && coordinator_address="127.0.0.1:$(cat "$port_file")"
}
stop_coordinator() {
  kill "$coordinator_pid" 2>/dev/null
  wait "$coordinator_pid" 2>/dev/null
}

# ---- 6. The trainer on the GPU, end to end with a local coordinator.
worker=$build_dir/worker/gradsync-worker
if [ ! -x "$worker" ]; then
  why="worker/BUILD.bazel has no gradsync-worker yet, or it was left out (see build.log)"
  echo "MISSING: $worker: $why"
  record "gradsync-worker" MISSING "$why"
else
  note "gradsync-worker --device=$device, $steps steps (log: $out/worker.log)"
  start_coordinator "$out/worker.log"
  if [ -z "$coordinator_address" ]; then
    record "gradsync-worker" FAIL "the coordinator did not start (worker.log)"
  else
    start=$SECONDS
    timeout 600 "$worker" --coordinator="$coordinator_address" --job=gpu-smoke \
      --nnodes=1 --device="$device" --steps="$steps" --summary_json="$out/worker_summary.json" \
      > >(tee -a "$out/worker.log") 2>&1
    status=$?
    [ "$status" -eq 0 ] && r=OK || r=FAIL
    record "gradsync-worker" "$r" "exit $status in $((SECONDS - start))s; summary: worker_summary.json"
  fi
  stop_coordinator
fi

# ---- 7. The DDP benchmark on the GPU, handed the CMake build (no Bazel
# here) and the Python with torch; one rank per GPU (NCCL refuses two ranks
# on one device).
if [ "$bench" -eq 0 ]; then
  record "ddp_bench" SKIPPED "--no_bench"
elif [ ! -x bench/ddp_bench.sh ]; then
  echo "MISSING: bench/ddp_bench.sh (not in this checkout yet)"
  record "ddp_bench" MISSING "bench/ddp_bench.sh not in this checkout"
else
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  [ "$gpus" -ge 1 ] || gpus=1
  note "bench/ddp_bench.sh --device=$device --world_size=$gpus (log: $out/bench.log)"
  GRADSYNC_BIN=$build_dir PYTHON=$(command -v "$python") timeout 1800 \
    bench/ddp_bench.sh --device="$device" --world_size="$gpus" --no_build \
    > >(tee "$out/bench.log") 2>&1
  status=$?
  [ "$status" -eq 0 ] && r=OK || r=FAIL
  record "ddp_bench" "$r" "exit $status, $gpus rank(s); results in bench.log"
fi
# ---- 8. gradsync launch on the GPU(s): a PyTorch DDP script written for
# torchrun (NCCL, device_ids=[local_rank]) with --nproc_per_node=gpu, then
# gradsync-worker --device=$device under the launcher.
launcher=$build_dir/worker/cli/gradsync
if [ ! -x "$launcher" ]; then
  record "launch" MISSING "$launcher was not built (see build.log)"
else
  note "gradsync launch (log: $out/launch.log)"
  start_coordinator "$out/launch.log"
  if [ -z "$coordinator_address" ]; then
    record "launch" FAIL "the coordinator did not start (launch.log)"
  else
    nproc=gpu backend=nccl
    [ "$device" = cuda ] || { nproc=1; backend=gloo; }
    start=$SECONDS
    timeout 600 "$launcher" launch --coordinator="$coordinator_address" \
      --job=gpu-launch-torch --nproc_per_node="$nproc" \
      --python="$(command -v "$python")" tests/worker/launch/ddp_script.py \
      "$out/launch_params.txt" --backend="$backend" \
      > >(tee -a "$out/launch.log") 2>&1
    status=$?
    [ "$status" -eq 0 ] && r=OK || r=FAIL
    record "launch-torch" "$r" "exit $status in $((SECONDS - start))s ($backend)"
    if [ -x "$worker" ]; then
      start=$SECONDS
      timeout 600 "$launcher" launch --coordinator="$coordinator_address" \
        --job=gpu-launch-worker --nproc_per_node="$nproc" -- "$worker" \
        --device="$device" --steps="$steps" > >(tee -a "$out/launch.log") 2>&1
      status=$?
      [ "$status" -eq 0 ] && r=OK || r=FAIL
      record "launch-worker" "$r" "exit $status in $((SECONDS - start))s"
    fi
  fi
  stop_coordinator
fi
# ---- 9. gradsync-worker's DDP features on the GPU (NCCL, world size 1:
# every code path but SyncBatchNorm's collectives, which need 2 ranks:
# PyTorch's SyncBatchNorm does the same at world size 1): ResNet-50 with
# SyncBatchNorm under each hook, then a checkpoint and a resumed run.
if [ -x "$worker" ]; then
  note "DDP features on $device (log: $out/ddp_features.log)"
  start_coordinator "$out/ddp_features.log"
  ckpt=$build_dir/gpu_checkpoints
  rm -rf "$ckpt"
  features_failed=0
  run_feature() {  # NAME FLAGS...
    local name=$1
    shift
    timeout 600 "$worker" --coordinator="$coordinator_address"       --job="gpu-$name" --nnodes=1 --device="$device" --model=resnet50       --sync_batchnorm --batch_size=32 --synthetic_size=2048 --log_every=5 "$@"       > >(sed -u "s/^/[$name] /" >>"$out/ddp_features.log") 2>&1 || features_failed=1
  }
  if [ -n "$coordinator_address" ]; then
    run_feature allreduce --steps=20
    run_feature fp16 --steps=20 --comm_hook=fp16_compress
    run_feature bf16 --steps=20 --comm_hook=bf16_compress
    run_feature powersgd --steps=20 --comm_hook=powersgd --powersgd_start_iter=5
    run_feature checkpoint --steps=10 --checkpoint_dir="$ckpt" --checkpoint_every=5
    run_feature resume --steps=20 --checkpoint_dir="$ckpt" --resume
    grep -q "resumed from the checkpoint of step 10" "$out/ddp_features.log" || features_failed=1
  else
    features_failed=1
  fi
  stop_coordinator
  [ "$features_failed" -eq 0 ] && r=OK || r=FAIL
  record "ddp-features" "$r" "resnet50 + SyncBatchNorm: allreduce, fp16, bf16, powersgd, checkpoint, resume (ddp_features.log)"
  if [ "$bench" -eq 1 ] && [ -x bench/ddp_bench.sh ]; then
    GRADSYNC_BIN=$build_dir PYTHON=$(command -v "$python") timeout 1800 \
      bench/ddp_bench.sh --device="$device" --world_size="$gpus" --no_build \
      --model=resnet18 --hooks > >(tee -a "$out/bench.log") 2>&1
    status=$?
    [ "$status" -eq 0 ] && r=OK || r=FAIL
    record "ddp_bench-resnet18" "$r" "exit $status; results in bench.log"
  fi
fi
cd "$repo"
finish
