"""A killed rank ends the whole pipeline quickly, and every survivor names it."""


import pytest
import torch.distributed as dist

from pipeline_helpers import kill_when_running, start_ranks

pytestmark = pytest.mark.dist


@pytest.mark.timeout(180)
@pytest.mark.parametrize("victim", [pytest.param(0, marks=pytest.mark.slow), 2])
def test_killed_rank_ends_every_other_rank_within_60s_naming_it(tmp_path, victim):
    P = 3
    store = dist.TCPStore("127.0.0.1", 0, P + 1, True, wait_for_workers=False)
    procs = start_ranks(tmp_path, P, 1, store.port)
    try:
        for r, (rc, msg, elapsed) in kill_when_running(tmp_path, procs, victim).items():
            assert rc == 1 and elapsed < 60, msg
            assert f"rank {r} (stage {r}) stopped: rank {victim} failed" in msg, msg
            assert "Traceback" not in msg
    finally:
        for p, err in procs:
            if p.poll() is None:
                p.kill()
            err.close()
