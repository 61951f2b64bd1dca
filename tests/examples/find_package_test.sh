#!/usr/bin/env bash
# The installed package, as a user meets it: installs gradsync's package from
# a CMake build tree into a fresh prefix, builds examples/ on its own against
# it (find_package(gradsync)), and trains 10 steps of the example through the
# build tree's coordinator. CMake only (Bazel installs nothing); registered by
# tests/examples/CMakeLists.txt.
#   find_package_test.sh SOURCE_DIR BUILD_DIR SCRATCH_DIR
set -euo pipefail
src=$1 build=$2 tmp=$3
rm -rf "$tmp"
mkdir -p "$tmp"
cmake --install "$build" --prefix "$tmp/prefix" --component gradsync >"$tmp/install.log"
cmake -S "$src/examples" -B "$tmp/examples" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$tmp/prefix${CMAKE_PREFIX_PATH:+;$CMAKE_PREFIX_PATH}" \
  >"$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/examples" -j 2 >"$tmp/build.log" 2>&1 || {
  tail -n 60 "$tmp/build.log"; exit 1; }

"$build/server/gradsync-coordinator" --listen=127.0.0.1:0 --port_file="$tmp/port" \
  >"$tmp/coordinator.log" 2>&1 &
coordinator=$!
trap 'kill "$coordinator" 2>/dev/null; wait "$coordinator" 2>/dev/null' EXIT
for _ in $(seq 200); do [ -s "$tmp/port" ] && break; sleep 0.05; done
[ -s "$tmp/port" ] || { cat "$tmp/coordinator.log"; exit 1; }
timeout 120 "$tmp/examples/train_ddp" --coordinator="127.0.0.1:$(cat "$tmp/port")" \
  --job=installed --steps=10 >"$tmp/run.log" 2>&1 || { cat "$tmp/run.log"; exit 1; }
grep -q "train_ddp: done after 10 steps" "$tmp/run.log" || { cat "$tmp/run.log"; exit 1; }
echo "find_package_test: examples/ built against the installed package and trained 10 steps"
