"""gradsync.torch: init_process_group through gradsync:// (no MASTER_ADDR),
under the launcher and without it."""
import os
import re
import subprocess
import sys

import pytest

import gradsync
from conftest import HERE, launch


# "gradsync": gradsync's own process group (gradsync._C), bootstrapped
# through gradsync.torch.Store, a Python store that C++ calls with the GIL
# released.
@pytest.mark.parametrize("backend", ["gloo", "gradsync"])
def test_init_method_gradsync_needs_no_master_addr(coordinator, backend,
                                                   monkeypatch):
    monkeypatch.setenv("INIT_BACKEND", backend)
    agent = launch(coordinator, "torchinit", 3,
                   [os.path.join(HERE, "init_script.py")])
    out, err = agent.communicate(timeout=180)
    assert agent.returncode == 0, err
    for rank in range(3):
        assert f"[rank{rank}]: rank {rank} of 3: sum 6" in out, out + err
    job = gradsync.Client(coordinator).get_job("torchinit")
    assert gradsync.Client.state_name(job.state) == "succeeded"


def standalone_env():
    """This environment without the launcher's variables: a process that
    joins by itself."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
           and not k.startswith("GRADSYNC_")}
    env["PYTHONPATH"] = os.path.dirname(HERE)
    return env


def run_standalone(coordinator, *extra):
    """Two plain processes of standalone_script.py: (returncode, output)s."""
    env = standalone_env()
    processes = [subprocess.Popen(
        [sys.executable, os.path.join(HERE, "standalone_script.py"),
         coordinator, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for _ in range(2)]
    return [(p.wait(timeout=180), p.stdout.read()) for p in processes]


def test_init_method_without_the_launcher_joins_the_job(coordinator):
    results = run_standalone(coordinator)
    for code, out in results:
        assert code == 0, out
    out = "".join(o for _, o in results)
    for rank in range(2):
        assert f"rank {rank} of 2: sum 3" in out, out
    job = gradsync.Client(coordinator).get_job("standalone")
    assert gradsync.Client.state_name(job.state) == "succeeded", job
    assert len(job.members) == 2


def test_an_uncaught_exception_fails_the_job(coordinator):
    results = run_standalone(coordinator, "--job", "failing",
                             "--fail_rank", "1")
    assert sorted(code for code, _ in results) == [0, 1], results
    job = gradsync.Client(coordinator).get_job("failing")
    assert gradsync.Client.state_name(job.state) == "failed", job
    assert "RuntimeError: boom: rank gave up" in job.reason, job.reason


def test_sys_exit_with_a_code_fails_the_job_with_it(coordinator):
    results = run_standalone(coordinator, "--job", "exiting",
                             "--exit_rank", "1", "--exit_code", "3")
    assert sorted(code for code, _ in results) == [0, 3], results
    job = gradsync.Client(coordinator).get_job("exiting")
    assert gradsync.Client.state_name(job.state) == "failed", job
    assert "exited with code 3" in job.reason, job.reason


def test_raise_system_exit_fails_the_job_with_its_code(coordinator):
    results = run_standalone(coordinator, "--job", "raising",
                             "--exit_rank", "1", "--exit_code", "4",
                             "--raise_exit")
    assert sorted(code for code, _ in results) == [0, 4], results
    job = gradsync.Client(coordinator).get_job("raising")
    assert gradsync.Client.state_name(job.state) == "failed", job
    assert "exited with code 4" in job.reason, job.reason


def test_sys_exit_zero_is_a_success(coordinator):
    results = run_standalone(coordinator, "--job", "exiting0",
                             "--exit_rank", "1", "--exit_code", "0")
    assert [code for code, _ in results] == [0, 0], results
    job = gradsync.Client(coordinator).get_job("exiting0")
    assert gradsync.Client.state_name(job.state) == "succeeded", job


def test_without_the_launcher_the_join_waits_as_long_as_the_init_timeout(
        coordinator):
    """init_process_group's timeout bounds a gradsync:// member's join, as
    it bounds TCPStore's wait for the other ranks: one node of a job of
    two gives up after it, naming the job, not after the default 10 min."""
    env = standalone_env()
    code = "\n".join([
        "import datetime, time",
        "import torch.distributed as dist",
        "import gradsync.torch",
        "start = time.monotonic()",
        "try:",
        "    dist.init_process_group(",
        f"        'gloo', init_method='gradsync://{coordinator}/alone?nnodes=2',",
        "        timeout=datetime.timedelta(seconds=2))",
        "except RuntimeError as error:",
        "    print(f'gave up after {time.monotonic() - start:.0f} s: {error}')"])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=120, env=env)
    assert "gave up after" in done.stdout, done.stdout + done.stderr
    seconds = int(done.stdout.split("gave up after ")[1].split(" s")[0])
    assert seconds < 60, done.stdout
    assert "alone" in done.stdout and "2s" in done.stdout, done.stdout



def test_a_process_group_made_again_joins_a_new_round(coordinator):
    # init, destroy, init again in both processes: each membership rejoins
    # (round 1 superseded), no second member per process, and nothing is
    # reported for the round left behind.
    results = run_standalone(coordinator, "--job", "twice", "--twice")
    for code, out in results:
        assert code == 0, out
        assert "could not report" not in out, out
    out = "".join(o for _, o in results)
    for rank in range(2):
        assert f"rank {rank} of 2: sum 3" in out, out
        assert f"again: rank {rank} of 2: sum 3" in out, out
    job = gradsync.Client(coordinator).get_job("twice")
    assert gradsync.Client.state_name(job.state) == "succeeded", job
    assert job.round == 2 and len(job.members) == 2, job


def test_a_process_group_made_again_waits_as_long_as_its_init_says(
        coordinator):
    """The second init_process_group's timeout bounds its rejoin: the other
    member never makes its group again, and the rejoin gives up after 2 s
    (RuntimeError saying "timeout"), not after the job's join timeout (the
    first init's, 120 s), withdrawing its join."""
    url = f"gradsync://{coordinator}/again-bounded?nnodes=2"
    common = [
        "import datetime, sys, time",
        "import torch.distributed as dist",
        "import gradsync.torch",
        f"dist.init_process_group('gloo', init_method='{url}', "
        "timeout=datetime.timedelta(seconds=120))",
        "print('joined', flush=True)"]
    silent = common + ["time.sleep(120)"]
    again = common + [
        "dist.destroy_process_group()",
        "start = time.monotonic()",
        "try:",
        f"    dist.init_process_group('gloo', init_method='{url}', "
        "timeout=datetime.timedelta(seconds=2))",
        "except RuntimeError as error:",
        "    print(f'gave up after {time.monotonic() - start:.1f} s: {error}')"]
    env = standalone_env()
    processes = [subprocess.Popen(
        [sys.executable, "-c", "\n".join(code)], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, env=env)
        for code in (silent, again)]
    try:
        out, _ = processes[1].communicate(timeout=100)
    finally:
        processes[0].kill()
        processes[0].communicate()
    found = re.search(r"gave up after ([0-9.]+) s: .*timeout", out)
    assert found, out
    assert float(found.group(1)) < 60, out


def test_a_process_joins_one_job(coordinator):
    env = standalone_env()
    code = "\n".join([
        "import torch.distributed as dist",
        "import gradsync.torch",
        f"dist.init_process_group('gloo', init_method='gradsync://{coordinator}/one?nnodes=1')",
        "dist.destroy_process_group()",
        "try:",
        f"    dist.init_process_group('gloo', init_method='gradsync://{coordinator}/two?nnodes=1')",
        "except ValueError as error:",
        "    print(f'refused: {error}')"])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=120, env=env)
    assert "refused: this process is a member of job 'one'" in done.stdout, (
        done.stdout + done.stderr)
    assert "it cannot join 'two'" in done.stdout, done.stdout
