"""The generated gRPC stubs of proto/gradsync/v1, imported in one place.

protoc names the modules after the .proto paths (proto.gradsync.v1.*), so
their folder, gradsync/_gen (python/build_stubs.sh, or the Bazel genrule
//python:stubs), goes on sys.path when they are not importable already.
"""
import os
import sys

try:
    from proto.gradsync.v1 import health_pb2  # noqa: F401
except ImportError:
    _gen = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_gen")
    if not os.path.isdir(os.path.join(_gen, "proto")):
        raise ImportError(
            "gradsync: the gRPC stubs are missing; run python/build_stubs.sh")
    sys.path.append(_gen)

from proto.gradsync.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from proto.gradsync.v1 import job_pb2  # noqa: E402
from proto.gradsync.v1 import jobs_pb2, jobs_pb2_grpc  # noqa: E402
from proto.gradsync.v1 import kv_pb2, kv_pb2_grpc  # noqa: E402
from proto.gradsync.v1 import rendezvous_pb2, rendezvous_pb2_grpc  # noqa: E402

__all__ = [
    "health_pb2", "health_pb2_grpc", "job_pb2", "jobs_pb2", "jobs_pb2_grpc",
    "kv_pb2", "kv_pb2_grpc", "rendezvous_pb2", "rendezvous_pb2_grpc",
]
