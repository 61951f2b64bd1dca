"""Finds CUDA and NCCL on the build machine (offline) for the NCCL backend.

Looks in $CUDA_HOME (default /usr/local/cuda) for include/nccl.h,
include/cuda_runtime_api.h, lib64/libnccl.so and lib64/libcudart.so. Creates
the repository @local_cuda with:
  defs.bzl  HAS_NCCL (bool) and CUDA_HOME (str), for BUILD files to branch on;
  BUILD     cc_library :cuda_nccl (headers + link flags), empty without CUDA.
Without CUDA/NCCL the NCCL backend is simply not built.
"""

def _cuda_configure_impl(ctx):
    cuda_home = ctx.os.environ.get("CUDA_HOME", "/usr/local/cuda")
    needed = [
        "include/nccl.h",
        "include/cuda_runtime_api.h",
        "lib64/libnccl.so",
        "lib64/libcudart.so",
    ]
    has_nccl = all([ctx.path(cuda_home + "/" + f).exists for f in needed])
    ctx.file("defs.bzl", "HAS_NCCL = %s\nCUDA_HOME = %r\n" % (has_nccl, cuda_home))
    if not has_nccl:
        ctx.file("BUILD", "\n".join([
            "# No CUDA/NCCL under %s: the NCCL backend is left out." % cuda_home,
            "cc_library(name = 'cuda_nccl', visibility = ['//visibility:public'])",
            "",
        ]))
        return
    ctx.symlink(cuda_home + "/include", "include")
    lib = cuda_home + "/lib64"
    ctx.file("BUILD", "\n".join([
        "# CUDA runtime and NCCL from %s." % cuda_home,
        "cc_library(",
        "    name = 'cuda_nccl',",
        "    hdrs = glob(['include/**']),",
        "    includes = ['include'],",
        "    linkopts = ['-L%s', '-Wl,-rpath,%s', '-lnccl', '-lcudart']," % (lib, lib),
        "    visibility = ['//visibility:public'],",
        ")",
        "",
    ]))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_HOME"],
    local = True,
)
