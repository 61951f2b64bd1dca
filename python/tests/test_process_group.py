"""The process group backend "gradsync" (gradsync._C): torch.distributed's
collectives and DistributedDataParallel on gradsync's shared-memory
all-reduce and on Gloo, against torch's own Gloo process group run the same
way as the control; an abort. (test_torch.py bootstraps it through the
coordinator's store under `gradsync launch`.)"""
import json
import os
import subprocess
import sys
import tempfile

import pytest

import gradsync
import gradsync.torch
from conftest import HERE


def run_ranks(backend, world, env=None):
    """WORLD processes of process_group_script.py: each rank's output."""
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        outs = [os.path.join(tmp, f"rank{r}.json") for r in range(world)]
        environment = dict(os.environ, PYTHONPATH=os.path.dirname(HERE),
                           **(env or {}))
        processes = [subprocess.Popen(
            [sys.executable, os.path.join(HERE, "process_group_script.py"),
             backend, str(r), str(world), store, outs[r]],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=environment) for r in range(world)]
        for p in processes:
            try:
                out, _ = p.communicate(timeout=180)
            finally:
                if p.poll() is None:
                    p.kill()
            assert p.returncode == 0, out
        results = []
        for path in outs:
            with open(path) as f:
                results.append(json.load(f))
        return results


# The start of a script for run_rank0_of_two: both ranks make a gradsync
# group, then rank 1 never issues a collective.
RANK1_AWAY = """
import datetime, sys, threading, time
import torch, torch.distributed as dist
import gradsync.torch
rank = int(sys.argv[1])
dist.init_process_group("gradsync", store=dist.FileStore(sys.argv[2], 2),
                        rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=120))
if rank == 1:
    time.sleep(60)  # never joins; killed by the test
"""


def run_rank0_of_two(script):
    """`script` (python -c) as ranks 0 and 1, argv RANK STORE_FILE: rank 0's
    output within 60 s; both are killed then."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
        ranks = [subprocess.Popen(
            [sys.executable, "-c", script, str(r), os.path.join(tmp, "s")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=env) for r in range(2)]
        try:
            return ranks[0].communicate(timeout=60)[0]
        finally:
            for p in ranks:
                p.kill()
                p.wait()


def assert_close(params, reference):
    for got, want in zip(params, reference):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert abs(a - b) <= 1e-6 * max(1.0, abs(b)), (a, b)


@pytest.mark.parametrize("world,transport,env", [
    (2, "shm", {}),
    (3, "shm", {}),
    (2, "gloo", {"GRADSYNC_SHARED_MEMORY": "0",
                 "GRADSYNC_GLOO_ADDRESS": "127.0.0.1"}),
])
def test_ddp_on_gradsync_trains_as_on_gloo(world, transport, env):
    assert gradsync.torch.process_groups_available()
    ours = run_ranks("gradsync", world, env)
    control = run_ranks("gloo", world)
    for result in ours:
        assert result["transport"] == transport
    for result in ours + control:  # DDP kept every replica the same
        assert_close(result["params"], control[0]["params"])


def test_an_abort_fails_a_collective_a_peer_never_joins():
    script = RANK1_AWAY + """
threading.Timer(0.5, gradsync.torch.abort).start()
start = time.monotonic()
try:
    dist.all_reduce(torch.ones(8))
    print("completed")
except RuntimeError as e:
    print(f"failed after {time.monotonic() - start:.1f} s: {e}")
"""
    out = run_rank0_of_two(script)
    assert "failed after 0." in out, out
    assert "allreduce #" in out, out


def test_a_group_dropped_with_a_python_callback_pending_does_not_hang():
    # The last reference goes with the GIL held, while the collective's
    # future has a Python callback, which the group's completing thread
    # runs when the drop aborts the collective: it must get the GIL.
    script = RANK1_AWAY + """
work = dist.all_reduce(torch.ones(8), async_op=True)
called = []
future = work.get_future().then(lambda f: called.append(1))
start = time.monotonic()
dist.destroy_process_group()
del work
print(f"dropped after {time.monotonic() - start:.1f} s; callback ran: {called}")
"""
    out = run_rank0_of_two(script)
    assert "dropped after 0." in out, out
    assert "callback ran: [1]" in out, out


def test_the_backend_is_registered_for_cpu_tensors_without_a_warning():
    """torch 2.x asks which devices a backend serves and warns once per
    process when a backend does not say; "gradsync" serves CPU tensors
    (torch 1.13 has no such notion)."""
    code = "\n".join([
        "import warnings",
        "import torch.distributed as dist",
        "import gradsync.client",
        "with warnings.catch_warnings(record=True) as caught:",
        "    warnings.simplefilter('always')",
        "    import gradsync.torch",
        "print([str(w.message) for w in caught if 'gradsync' in str(w.message)])",
        "print(getattr(dist.Backend, 'backend_capability', {}).get('gradsync'))"])
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True,
        timeout=120, env=dict(os.environ, PYTHONPATH=os.path.dirname(HERE)))
    assert result.returncode == 0, result.stderr
    warned, capability = result.stdout.strip().splitlines()[-2:]
    assert warned == "[]", warned
    has_devices = hasattr(gradsync.torch.dist.Backend, "backend_capability")
    assert capability == ("['cpu']" if has_devices else "None"), result.stdout
