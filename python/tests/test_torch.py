"""gradsync.torch: init_process_group through gradsync:// (no MASTER_ADDR)."""
import os

import gradsync
from conftest import HERE, launch


def test_init_method_gradsync_needs_no_master_addr(coordinator):
    agent = launch(coordinator, "torchinit", 3,
                   [os.path.join(HERE, "init_script.py")])
    out, err = agent.communicate(timeout=180)
    assert agent.returncode == 0, err
    for rank in range(3):
        assert f"[rank{rank}]: rank {rank} of 3: sum 6" in out, out + err
    job = gradsync.Client(coordinator).get_job("torchinit")
    assert gradsync.Client.state_name(job.state) == "succeeded"


def test_init_method_outside_the_launcher_says_what_is_missing(monkeypatch):
    import pytest
    import torch.distributed as dist
    import gradsync.torch  # noqa: F401
    monkeypatch.delenv("GRADSYNC_ROUND", raising=False)
    with pytest.raises(ValueError, match="run the program under `gradsync launch`"):
        dist.init_process_group("gloo", init_method="gradsync://127.0.0.1:1/j",
                                rank=0, world_size=1)
