"""Builds the gradsync Python package (metadata in pyproject.toml).

The gRPC stubs are generated from the checkout's proto/ at build time, into
the built package's gradsync/_gen (where gradsync/_proto.py finds them):
with protoc and grpc_python_plugin (Debian: protobuf-compiler,
protobuf-compiler-grpc), or with grpcio-tools where that is installed.

The extension module gradsync._C (the process group backend "gradsync"
and gradsync.elastic) is built against the installed torch by Bazel
(`bazel build //python:gradsync/_C.so`) or CMake (BUILD_DIR/python/gradsync/
_C.so, where the Python headers and LibTorch's libtorch_python are found);
with GRADSYNC_EXTENSION naming that file it goes into the package, without
it the package is pure Python (gradsync.torch.process_groups_available() is
then False).
"""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
# The directory that holds proto/gradsync/v1 (the checkout's root).
PROTO_ROOT = os.path.dirname(HERE)


def protoc_command(out):
    """The command that writes the Python and gRPC stubs into `out`."""
    plugin = shutil.which("grpc_python_plugin")
    protoc = shutil.which("protoc")
    if protoc and plugin:
        return [protoc, f"--plugin=protoc-gen-grpc={plugin}",
                f"--python_out={out}", f"--grpc_out={out}"]
    try:
        import grpc_tools  # noqa: F401
    except ImportError:
        sys.exit("gradsync: generating the gRPC stubs needs protoc and "
                 "grpc_python_plugin (Debian: apt-get install protobuf-compiler "
                 "protobuf-compiler-grpc) or grpcio-tools")
    return [sys.executable, "-m", "grpc_tools.protoc",
            f"--python_out={out}", f"--grpc_python_out={out}"]


def generate_stubs(out):
    protos = sorted(glob.glob(os.path.join(PROTO_ROOT, "proto/gradsync/v1/*.proto")))
    if not protos:
        sys.exit(f"gradsync: no proto/gradsync/v1/*.proto under {PROTO_ROOT}; "
                 "build the package from a gradsync checkout (pip install ./python)")
    os.makedirs(out, exist_ok=True)
    relative = [os.path.relpath(p, PROTO_ROOT) for p in protos]
    subprocess.run(protoc_command(out) + ["-I", PROTO_ROOT] + relative,
                   check=True, cwd=PROTO_ROOT)


class BuildPyWithStubs(build_py):
    """build_py, then the stubs into the built package."""

    def run(self):
        super().run()
        package = os.path.join(os.path.abspath(self.build_lib), "gradsync")
        generate_stubs(os.path.join(package, "_gen"))
        extension = os.environ.get("GRADSYNC_EXTENSION")
        if extension:
            if not os.path.isfile(extension):
                sys.exit(f"gradsync: GRADSYNC_EXTENSION={extension} is not a "
                         "file (bazel build //python:gradsync/_C.so)")
            shutil.copyfile(extension, os.path.join(package, "_C.so"))


setup(cmdclass={"build_py": BuildPyWithStubs})
