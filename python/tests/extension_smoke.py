"""The extension module gradsync._C as a build made it (CMake's ctest
python.extension_smoke; deploy/gpu_run.sh on a GPU machine): it loads into
this Python beside its torch, makes a one-rank process group of backend
"gradsync" through torch's FileStore, and all-reduces, broadcasts and
all-gathers with it; with --cuda, on a CUDA tensor too (that group's
backend is the CPU one, so the CUDA tensor must be refused, naming why
and the ways to CUDA).

    python3 extension_smoke.py BUILD/python/gradsync/_C.so [--cuda]

Prints "extension_smoke: ok" and exits 0, or raises."""
import datetime
import importlib.util
import os
import sys
import tempfile

import torch
import torch.distributed as dist


def load(path):
    spec = importlib.util.spec_from_file_location("_C", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    extension = load(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        group = extension.create_process_group(
            store, 0, 1, datetime.timedelta(seconds=30))
        assert extension.transport(group) in ("shm", "gloo")
        tensor = torch.arange(6, dtype=torch.float32)
        group.allreduce([tensor]).wait()
        assert tensor.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], tensor
        options = dist.BroadcastOptions()
        options.rootRank = 0
        group.broadcast([tensor], options).wait()
        gathered = [torch.zeros(6)]
        group.allgather([gathered], [tensor]).wait()
        assert gathered[0].equal(tensor), gathered
        if "--cuda" in sys.argv[2:]:
            on_gpu = torch.ones(4, device="cuda")
            try:
                group.allreduce([on_gpu])
                raise AssertionError("a CUDA tensor was taken by a CPU backend")
            except RuntimeError as e:
                assert "expected cpu" in str(e), e
                assert 'device="cuda"' in str(e), e
    print(f"extension_smoke: ok (torch {torch.__version__})")


if __name__ == "__main__":
    main()
