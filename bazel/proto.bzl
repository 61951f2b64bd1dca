"""Compiles .proto files with the system protoc and grpc_cpp_plugin (offline)."""

def gradsync_cc_grpc_library(name, srcs, deps = [], **kwargs):
    """Generates C++ message and gRPC service code for `srcs`.

    Args:
      name: name of the resulting cc_library.
      srcs: .proto files of this package; imports resolve against the
        workspace root and /usr/include (well-known types).
      deps: other gradsync_cc_grpc_library targets whose protos are imported.
      **kwargs: forwarded to the cc_library (e.g. visibility).
    """
    outs = []
    for src in srcs:
        base = src[:-len(".proto")]
        outs += [
            base + ".pb.h",
            base + ".pb.cc",
            base + ".grpc.pb.h",
            base + ".grpc.pb.cc",
        ]
    native.genrule(
        name = name + "_codegen",
        srcs = srcs + [d + "_protos" for d in deps],
        outs = outs,
        cmd = " ".join([
            "/usr/bin/protoc",
            "--proto_path=.",
            "--proto_path=/usr/include",
            "--cpp_out=$(GENDIR)",
            "--grpc_out=$(GENDIR)",
            "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin",
        ] + ["$(location %s)" % s for s in srcs]),
    )
    native.filegroup(
        name = name + "_protos",
        srcs = srcs,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = ["//third_party/system:grpc"] + deps,
        **kwargs
    )
