#!/usr/bin/env bash
# Generates the gradsync Python package's gRPC stubs from proto/ into
# python/gradsync/_gen (Debian's protoc and grpc_python_plugin; protobuf and
# grpcio at run time: python3-protobuf, python3-grpcio). Run once after a
# checkout or a change to proto/; then `PYTHONPATH=python python3 -c 'import
# gradsync'` works. The Bazel build generates the same files for its tests.
set -euo pipefail
cd "$(dirname "$0")/.."
out=python/gradsync/_gen
mkdir -p "$out"
protoc -I. --python_out="$out" --grpc_out="$out" \
  --plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin proto/gradsync/v1/*.proto
echo "build_stubs: wrote $out/proto/gradsync/v1"
