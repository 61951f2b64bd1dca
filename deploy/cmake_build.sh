#!/usr/bin/env bash
# Builds gradsync with CMake and Ninja: the same libraries, binaries and tests
# as the Bazel build (CMakeLists.txt), for machines without Bazel.
#   deploy/cmake_build.sh [--build_dir=DIR] [--jobs=N] [--ctest[=REGEX]]
#                         [--ctest_exclude=REGEX] [--targets=A,B,...]
#                         [-DVAR=VALUE ...]
#
#   --build_dir  build tree (default build/cmake; /build/ is git-ignored and
#                Bazel ignores it, see .bazelignore)
#   --jobs       parallel compile and test jobs (default 2, or $JOBS)
#   --ctest      then run the tests with ctest (each gtest case is one ctest
#                test); =REGEX runs only the tests whose name matches, e.g.
#                --ctest=nccl_backend_test
#   --ctest_exclude  with --ctest, skip the tests whose name matches (ctest -E)
#   --targets    build only these targets (CMake names, e.g.
#                gradsync-worker,nccl_backend_test); default: everything
#   -D...        passed to cmake, e.g. -DGRADSYNC_WITH_NCCL=ON,
#                -DGRADSYNC_WITH_TORCH=OFF, -DCMAKE_PREFIX_PATH=...
# First checks that the CMake files still mirror every BUILD.bazel
# (cmake/check_mirror.py). Installs nothing: run deploy/install_deps.sh
# first on Debian. Binaries land where bazel-bin has them, e.g.
# DIR/server/gradsync-coordinator. With --ctest it ends with one line
# "ctest: N passed, N failed, N skipped".
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build/cmake
jobs=${JOBS:-2}
run_ctest=0
ctest_regex=
ctest_exclude=
targets=()
cmake_args=()
for arg in "$@"; do
  case "$arg" in
    --build_dir=*) build_dir=${arg#*=} ;;
    --jobs=*) jobs=${arg#*=} ;;
    --ctest) run_ctest=1 ;;
    --ctest=*) run_ctest=1; ctest_regex=${arg#*=} ;;
    --ctest_exclude=*) ctest_exclude=${arg#*=} ;;
    --targets=*) IFS=, read -r -a targets <<<"${arg#*=}" ;;
    -D*) cmake_args+=("$arg") ;;
    *) echo "cmake_build: unknown argument '$arg' (see the header of $0)" >&2; exit 2 ;;
  esac
done

python3 cmake/check_mirror.py

start=$SECONDS
mkdir -p "$build_dir"
cmake -S . -B "$build_dir" -G Ninja "${cmake_args[@]}" >"$build_dir/configure.log" 2>&1 || {
  cat "$build_dir/configure.log" >&2
  echo "cmake_build: configuring failed (log: $build_dir/configure.log)" >&2
  exit 1
}
grep -E '^-- gradsync:' "$build_dir/configure.log" || true
target_args=()
for t in "${targets[@]}"; do target_args+=(--target "$t"); done
cmake --build "$build_dir" -j "$jobs" "${target_args[@]}"
echo "cmake_build: configured and built $build_dir in $((SECONDS - start))s"

[ "$run_ctest" -eq 1 ] || exit 0
junit="$build_dir/ctest-junit.xml"
rm -f "$junit"
ctest_args=(--test-dir "$build_dir" -j "$jobs" --output-on-failure --output-junit "$(basename "$junit")")
[ -n "$ctest_regex" ] && ctest_args+=(-R "$ctest_regex")
[ -n "$ctest_exclude" ] && ctest_args+=(-E "$ctest_exclude")
status=0
ctest "${ctest_args[@]}" || status=$?
# Counts from ctest's JUnit report (one test case per gtest case).
if [ -f "$junit" ]; then
  suite=$(tr '\n\t' '  ' <"$junit" | grep -o '<testsuite [^>]*>' | head -n 1)
  count() { sed -n "s/.* $1=\"\([0-9]*\)\".*/\1/p" <<<"$suite"; }
  total=$(count tests); failed=$(count failures); skipped=$(count skipped)
  disabled=$(count disabled)
  echo "ctest: $((total - failed - skipped - disabled)) passed, ${failed} failed, ${skipped} skipped"
else
  echo "ctest: no report (ctest failed to run)"
  [ "$status" -ne 0 ] || status=1
fi
exit "$status"
