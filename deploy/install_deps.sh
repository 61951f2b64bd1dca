#!/usr/bin/env bash
# Installs the Debian 12 packages gradsync needs, skipping those already there.
#   deploy/install_deps.sh [extra-package ...]
# Uses sudo when not root. Sourced or run by demo.sh, test.sh and the bench.
set -euo pipefail

packages=(
  bazel-bootstrap bazel-rules-java g++
  gcc  # also builds //tests/storage:power_loss_test's LD_PRELOAD shim
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev
  libtorch-dev libgloo-dev libcpp-httplib-dev python3-prometheus-client
  prometheus-cpp-dev libnghttp2-dev
  libsqlite3-dev sqlite3
  # --etcd: etcd's .proto files (and those they import) for the client, and
  # etcd itself for the tests
  golang-etcd-server-dev golang-github-gogo-protobuf-dev
  golang-github-grpc-ecosystem-grpc-gateway-dev etcd-server
  python3-torch python3-torchvision procps
  # the Python package (python/), its tests, and pip install ./python into a
  # venv (//python:install_test) and the python3-gradsync .deb
  python3-grpcio python3-protobuf python3-pytest
  python3-venv python3-pip python3-setuptools python3-wheel
  # its extension module gradsync._C (//python:gradsync/_C.so): pybind11
  # and Python's headers, beside libtorch-dev's
  pybind11-dev python3-dev
  openssl  # the TLS tests make their certificates with it
  cmake ninja-build  # the CMake build (deploy/cmake_build.sh)
  # the Debian package and its test (deploy/build_deb.sh, //deploy:package_test)
  fakeroot systemd
  chromium  # the status page's browser test
  clang-14 libclang-rt-14-dev  # the fuzzers (tests/fuzz/run.sh): libFuzzer
)
# kubectl for //deploy:package_test: Debian's, unless one is installed
# already (e.g. Google Cloud SDK's "kubectl" package, which owns the path).
command -v kubectl >/dev/null || packages+=(kubernetes-client)
# CUDA and NCCL are not Debian packages: where /usr/local/cuda (or
# $CUDA_HOME) has them, the NCCL backend is built too.
packages+=("$@")

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || {
    echo "install_deps: not root and no sudo; install as root: ${missing[*]}" >&2
    exit 1
  }
  sudo_cmd=(sudo)
fi
echo "install_deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q >/dev/null
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
