"""A killed rank ends the whole pipeline quickly, and every survivor names it."""

import os
import signal
import time

import pytest
import torch.distributed as dist

from pipeline_helpers import start_ranks

pytestmark = pytest.mark.dist


@pytest.mark.timeout(180)
@pytest.mark.parametrize("victim", [pytest.param(0, marks=pytest.mark.slow), 2])
def test_killed_rank_ends_every_other_rank_within_60s_naming_it(tmp_path, victim):
    P = 3
    store = dist.TCPStore("127.0.0.1", 0, P + 1, True, wait_for_workers=False)
    out, procs = tmp_path / "run", start_ranks(tmp_path, P, 1, store.port)
    try:
        deadline = time.time() + 120
        metrics = out / "metrics.jsonl"
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
            assert time.time() < deadline, "the pipeline never got going"
            assert all(p.poll() is None for p, _ in procs), "a rank exited before the kill"
            time.sleep(0.2)
        os.kill(procs[victim][0].pid, signal.SIGKILL)
        killed = time.time()
        for r, (p, _) in enumerate(procs):
            if r == victim:
                continue
            rc = p.wait(timeout=60)
            elapsed = time.time() - killed
            msg = (tmp_path / f"rank{r}.err").read_text()
            print(f"rank {r} exited {elapsed:.2f} s after rank {victim} was killed")
            assert rc == 1, msg
            assert elapsed < 60
            assert f"rank {r} (stage {r}) stopped: rank {victim} failed" in msg, msg
            assert "Traceback" not in msg
    finally:
        for p, err in procs:
            if p.poll() is None:
                p.kill()
            err.close()
