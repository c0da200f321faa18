"""A killed rank ends the whole pipeline quickly, and every survivor names it."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch.distributed as dist

pytestmark = pytest.mark.dist


def _start_ranks(tmp_path, P, store_port):
    """Start P ranks by hand, as torchrun would: env vars, and a store that outlives the ranks."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "delaylab", "llm", "pipeline", "--stages", str(P), "--schedule", "2bw",
           "--preset", "small", "--microbatches", "2", "--batch-size", "2", "--block-size", "16",
           "--steps", "5000", "--log-every", "1", "--ckpt-every", "0", "--timeout", "60", "--out", str(out)]
    procs = []
    for r in range(P):
        env = {**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(P),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store_port),
               "TORCHELASTIC_USE_AGENT_STORE": "True", "OMP_NUM_THREADS": "1"}
        err = open(tmp_path / f"rank{r}.err", "w")
        procs.append((subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err), err))
    return out, procs


@pytest.mark.timeout(180)
@pytest.mark.parametrize("victim", [pytest.param(0, marks=pytest.mark.slow), 2])
def test_killed_rank_ends_every_other_rank_within_60s_naming_it(tmp_path, victim):
    P = 3
    store = dist.TCPStore("127.0.0.1", 0, P + 1, True, wait_for_workers=False)
    out, procs = _start_ranks(tmp_path, P, store.port)
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
