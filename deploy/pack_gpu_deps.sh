#!/usr/bin/env bash
# Gathers, on this Debian 12 machine, the Debian packages deploy/gpu_run.sh
# needs on a GPU machine that has LibTorch (in PyTorch's wheel), CUDA, NCCL,
# CMake, ninja and a compiler but no network and none of these: protoc and
# the gRPC plugin, gRPC, protobuf, abseil, Gloo, GoogleTest, cpp-httplib,
# nlohmann-json, prometheus-cpp, nghttp2 (the benchmarks' load generator),
# etcd's v3 API .proto files (the coordinator's etcd client; with the two
# packages they import) and the libraries they load (c-ares, re2, OpenSSL,
# zlib, brotli, ibverbs, hiredis).
#   deploy/pack_gpu_deps.sh [--out=DIR]      (default .gpudeps, git-ignored)
# Each package is taken at apt's candidate version (the newest, as
# `apt-get install` would) from apt's cache when it is there, else with
# `apt-get download`. Writes DIR/*.deb and DIR/packages.txt
# (package, version, sha256), then checks that every program and shared
# library in them finds the libraries it needs among them or in the base
# system (glibc, libstdc++, libgcc). Carry DIR to the GPU machine and run
# deploy/gpu_run.sh --deps=DIR there.
set -euo pipefail
cd "$(dirname "$0")/.."

out=.gpudeps
for arg in "$@"; do
  case "$arg" in
    --out=*) out=${arg#*=} ;;
    *) echo "pack_gpu_deps: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

# Development packages (headers, CMake configurations, .so links) and the
# runtime packages those links point into. Torch, CUDA and NCCL are not here:
# the GPU machine's own are used.
packages=(
  protobuf-compiler libprotoc32 libprotobuf32 libprotobuf-lite32 libprotobuf-dev
  protobuf-compiler-grpc libgrpc29 libgrpc-dev libgrpc++1.51 libgrpc++-dev
  libabsl20220623 libabsl-dev
  libc-ares2 libc-ares-dev libre2-9 libre2-dev
  libssl3 libssl-dev zlib1g zlib1g-dev libbrotli1 libbrotli-dev
  libgtest-dev libgmock-dev libbenchmark1debian libbenchmark-dev
  nlohmann-json3-dev libcpp-httplib0.11 libcpp-httplib-dev
  libprometheus-cpp-core1.0 prometheus-cpp-dev libsqlite3-0 libsqlite3-dev
  libnghttp2-14 libnghttp2-dev
  libgloo0 libgloo-dev libibverbs1 libnl-3-200 libnl-route-3-200 libhiredis0.14
  golang-etcd-server-dev golang-github-gogo-protobuf-dev
  golang-github-grpc-ecosystem-grpc-gateway-dev
)
# Libraries every Linux with a C++ compiler has; the check allows these.
base_sonames='^(libc|libm|libdl|librt|libpthread|libresolv|libutil|libanl|ld-linux-x86-64)\.so|^(libstdc\+\+\.so\.6|libgcc_s\.so\.1)$'

mkdir -p "$out"
rm -f "$out"/*.deb
arch=$(dpkg --print-architecture)
: >"$out/packages.txt.new"
for p in "${packages[@]}"; do
  version=$(apt-cache policy "$p" | sed -n 's/^ *Candidate: //p')
  [ -n "$version" ] && [ "$version" != "(none)" ] || {
    echo "pack_gpu_deps: no version of $p known to apt (apt-get update?)" >&2; exit 1; }
  pkg_arch=$(apt-cache show "$p=$version" | sed -n 's/^Architecture: //p' | head -n 1)
  file="${p}_${version//:/%3a}_${pkg_arch:-$arch}.deb"
  if [ -f "/var/cache/apt/archives/$file" ]; then
    cp "/var/cache/apt/archives/$file" "$out/"
  else
    # (apt warns that it downloads as root, not as _apt, into this folder.)
    (cd "$out" && apt-get download -q "$p=$version" 2>&1 >/dev/null |
      grep -v 'Download is performed unsandboxed' >&2 || true)
  fi
  [ -f "$out/$file" ] || { echo "pack_gpu_deps: $file did not arrive" >&2; exit 1; }
  echo "$p $version $(sha256sum "$out/$file" | cut -d' ' -f1)" >>"$out/packages.txt.new"
done
mv "$out/packages.txt.new" "$out/packages.txt"

# Every ELF file's NEEDED libraries must be in the set or in the base system.
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
for deb in "$out"/*.deb; do dpkg-deb -x "$deb" "$root"; done
provided=$(find "$root" \( -type f -o -type l \) -name '*.so*' -printf '%f\n' | sort -u)
missing=$(find "$root" -type f \( -name '*.so*' -o -path '*/bin/*' \) -print0 |
  xargs -0 readelf -d 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u |
  grep -vxF "$provided" | grep -vE "$base_sonames" || true)
if [ -n "$missing" ]; then
  echo "pack_gpu_deps: libraries needed but not packed: $(echo $missing)" >&2
  exit 1
fi
echo "pack_gpu_deps: $(wc -l <"$out/packages.txt") packages, $(du -sh "$out" | cut -f1) in $out (list: $out/packages.txt)"
