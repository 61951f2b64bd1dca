"""Targets that exist only where CUDA and NCCL were found (see cuda_configure)."""

load("@local_cuda//:defs.bzl", "HAS_NCCL")

def nccl_cc_library(**kwargs):
    """A cc_library built only when CUDA and NCCL are present."""
    if HAS_NCCL:
        native.cc_library(**kwargs)

def nccl_cc_test(**kwargs):
    """A cc_test built only when CUDA and NCCL are present; it must skip
    itself (GTEST_SKIP) at run time on machines without a GPU."""
    if HAS_NCCL:
        native.cc_test(**kwargs)
