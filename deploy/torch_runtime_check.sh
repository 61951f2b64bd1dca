#!/usr/bin/env bash
# Builds gradsync against Debian 13's PyTorch 2.6 and runs everything of it
# that uses PyTorch, on this machine (no GPU): the GPU machines run PyTorch
# 2.x, Debian 12 has 1.13, and torch_headers_check.sh only compiles. Here
# the code runs: the LibTorch tests (DDP, checkpoints, the trainer's process
# tests, the process group), the Python package's pytest suite against
# torch 2.6's torch.distributed (its Store trampoline, DDP, weights_only
# loads), the extension and python_elastic on a simulated GPU.
#   deploy/torch_runtime_check.sh [--root=DIR] [--jobs=N] [--pytest_args=ARGS]
#
#   --root         the Debian 13 system it builds and runs in (default
#                  build/torch-runtime/root, git-ignored; made once with
#                  debootstrap, then reused: 4.5 GB with its packages and
#                  the build tree)
#   --jobs         compile jobs (default 2)
#   --pytest_args  more arguments for pytest (e.g. "-k store")
# Needs root (chroot, mounts), Debian's package archive (debootstrap and
# apt-get inside the root, about 400 MB the first time), rsync, and this
# machine's etcd .proto files (golang-etcd-server-dev, deploy/install_deps.sh;
# mounted into the root): Debian 13 has etcd 3.5's, whose layout the etcd
# client does not compile against. The root gets this machine's /etc/hosts, so that the host name
# resolves as on a configured machine. Debian 13's torch is built without
# libuv, which env:// and tcp:// ask for by default from torch 2.4 (its own
# torchrun fails so): USE_LIBUV=0 for everything run here, as its users
# must set it. Prints one line per part, then "torch_runtime_check: N of M
# parts failed"; exits 1 when any did (logs in ROOT/src/gradsync/build/t26
# and ROOT/tmp), 2 on bad usage. A run after a small change took 9 minutes on
# 2 cores (the tests 7 of them); the first run also makes the root and
# builds about 450 steps (not timed end to end: tens of minutes).
# Not part of the test command: it downloads, and needs root.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

root=build/torch-runtime/root
jobs=2
pytest_args=
for arg in "$@"; do
  case "$arg" in
    --root=*) root=${arg#*=} ;;
    --jobs=*) jobs=${arg#*=} ;;
    --pytest_args=*) pytest_args=${arg#*=} ;;
    *) echo "torch_runtime_check: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "torch_runtime_check: needs root (chroot, mounts)" >&2; exit 2; }
mkdir -p "$root" && root=$(cd "$root" && pwd)
gocode=/usr/share/gocode/src
[ -f "$gocode/go.etcd.io/etcd/etcdserver/etcdserverpb/rpc.proto" ] || {
  echo "torch_runtime_check: etcd's .proto files are missing here (apt-get install golang-etcd-server-dev)" >&2
  exit 1
}

# --- The Debian 13 root and its packages (once).
packages=(
  g++ cmake ninja-build procps iproute2 openssl
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev
  libgloo-dev libcpp-httplib-dev prometheus-cpp-dev libnghttp2-dev
  libsqlite3-dev libtorch-dev python3-torch python3-torchvision python3-numpy
  python3-grpcio python3-protobuf python3-pytest python3-dev pybind11-dev
  python3-venv python3-pip python3-setuptools python3-wheel
)
if [ ! -f "$root/.packages-installed" ]; then
  command -v debootstrap >/dev/null ||
    apt-get install -y -q debootstrap >/dev/null ||
    { echo "torch_runtime_check: cannot install debootstrap" >&2; exit 1; }
  if [ ! -f "$root/etc/debian_version" ]; then
    echo "torch_runtime_check: making a Debian 13 root in $root" >&2
    debootstrap --variant=minbase trixie "$root" http://deb.debian.org/debian \
      >"$root.debootstrap.log" 2>&1 ||
      { echo "torch_runtime_check: debootstrap failed ($root.debootstrap.log)" >&2; exit 1; }
  fi
  echo "deb http://deb.debian.org/debian trixie main" >"$root/etc/apt/sources.list"
  chroot "$root" bash -c "export DEBIAN_FRONTEND=noninteractive; apt-get update -q &&
    apt-get install -y -q --no-install-recommends ${packages[*]}" \
    >"$root/tmp/apt.log" 2>&1 ||
    { echo "torch_runtime_check: installing the packages failed ($root/tmp/apt.log)" >&2; exit 1; }
  touch "$root/.packages-installed"
fi

# --- This tree (tracked and new files), and this machine's host names.
mkdir -p "$root/src/gradsync" "$root/opt/gocode"
(git ls-files -z -co --exclude-standard | rsync -a --from0 --files-from=- ./ "$root/src/gradsync/") ||
  { echo "torch_runtime_check: copying the tree failed" >&2; exit 1; }
cp /etc/hosts "$root/etc/hosts"

mounted=()
cleanup() {
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null; done
}
trap cleanup EXIT
for m in proc sys dev dev/pts; do
  mountpoint -q "$root/$m" || { mount --bind "/$m" "$root/$m" && mounted+=("$root/$m"); }
done
# This machine's etcd .proto files, read-only, where CMake looks for them.
mountpoint -q "$root/opt/gocode" ||
  { mount --bind -o ro "$gocode" "$root/opt/gocode" && mounted+=("$root/opt/gocode"); }
mountpoint -q "$root/dev/shm" || { mount -t tmpfs tmpfs "$root/dev/shm" && mounted+=("$root/dev/shm"); }

# --- Build and run, inside the root.
chroot "$root" env JOBS="$jobs" PYTEST_ARGS="$pytest_args" USE_LIBUV=0 \
    bash -s <<'EOF'
cd /src/gradsync || exit 1
build=build/t26
failed=0 parts=0
part() {  # part NAME LOG COMMAND...: one line for it
  local name=$1 log=$2 start=$SECONDS
  shift 2
  parts=$((parts + 1))
  if "$@" >"$log" 2>&1; then
    echo "ok   $name ($((SECONDS - start))s)"
  else
    failed=$((failed + 1))
    echo "FAIL $name ($((SECONDS - start))s; $log)"
  fi
}
echo "torch_runtime_check: $(python3 -c 'import torch; print("PyTorch", torch.__version__)'), Python $(python3 -c 'import platform; print(platform.python_version())')"
part configure /tmp/configure.log cmake -S . -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DGRADSYNC_GOCODE_DIR=/opt/gocode \
  -DGRADSYNC_WITH_PYTHON=ON -DPython3_EXECUTABLE=/usr/bin/python3
# What uses LibTorch or the Python extension, the binaries they run, and the
# checks of what Debian 13's libraries changed (abseil's Mutex, Gloo).
targets=$(ninja -C "$build" -t targets all | sed -n 's/^\(tests\/worker\/\(ddp\|torch\|trainer\)\/[a-z0-9_]*_test\):.*/\1/p;
  s/^\(tests\/worker\/\(data\/torch_sampler\|launch\/launch_process\)_test\):.*/\1/p' | sort -u)
part build /tmp/build.log ninja -C "$build" -j "$JOBS" $targets \
  server/gradsync-coordinator cli/gradsync worker/gradsync-worker \
  python_gradsync_C tests/common/mutex_checks_test \
  tests/worker/backend/gloo_backend_test
cp "$build/python/gradsync/_C.so" python/gradsync/ 2>/dev/null
part stubs /tmp/stubs.log python/build_stubs.sh
regex='^(python\.|(checkpoint|comm_hook|ddp_equivalence|ddp_wrapper|failed_step|overlap|reducer|replica_fingerprint|state_dict|sync_batch_norm|torch_file|torch_reference|training_state|process_group|torch_sampler|launch_process|models|global_batch_training|recovery_process|trainer_process|failpoint_flags_process|checkpoint_process|hang_process|mutex_checks|gloo_backend)_test\.)'
# Left out: the case that runs Debian 13's own torchrun beside `gradsync
# launch`, which fails there whatever USE_LIBUV says (its rendezvous store
# asks for libuv).
part ctest /tmp/ctest.log bash -c "cd $build && ctest -j2 --timeout 900 --output-on-failure -R '$regex' -E 'ATorchrunScriptEndsAsUnderTorchrun'"
grep -E '^[0-9]+% tests passed|\(Failed\)|\(SEGFAULT\)|\(Timeout\)' /tmp/ctest.log | sed 's/^/     /'
part pytest /tmp/pytest.log env GRADSYNC_BIN="$PWD/$build" PYTHONDONTWRITEBYTECODE=1 \
  python3 -m pytest -q -p no:cacheprovider -W ignore python/tests $PYTEST_ARGS
tail -n 1 /tmp/pytest.log | sed 's/^/     /'
echo "torch_runtime_check: $failed of $parts parts failed"
[ "$failed" -eq 0 ]
EOF
