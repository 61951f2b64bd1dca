"""py_extension: a Python extension module built with pybind11 against the
system Python (Debian 12: 3.11) and the installed torch (libtorch_python).
Not a cc_* rule, so cmake/check_mirror.py does not ask CMake for it:
python/CMakeLists.txt mirrors it by hand (same sources and deps), for the
Python and LibTorch a CMake build finds (a GPU machine's PyTorch)."""

def py_extension(name, srcs, deps, **kwargs):
    native.cc_binary(
        name = name,
        srcs = srcs,
        deps = deps,
        linkshared = True,
        copts = [
            "-isystem",
            "/usr/include/python3.11",
            "-fvisibility=hidden",
        ],
        linkopts = ["-ltorch_python"],
        **kwargs
    )
