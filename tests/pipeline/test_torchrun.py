"""The torchrun path: `torchrun -m delaylab llm pipeline` runs one rank per process, same result."""

import json
import os
import subprocess
import sys

import pytest

from pipeline_helpers import load_model, max_abs_diff, reference_model, small

pytestmark = pytest.mark.dist


@pytest.mark.timeout(180)
def test_torchrun_runs_the_ranks_and_only_the_last_prints_the_summary(tmp_path):
    out = tmp_path / "run"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd = [*torchrun,
           "-m", "delaylab", "llm", "pipeline", "--stages", "2", "--schedule", "2bw", "--microbatches", "2",
           "--preset", "small", "--batch-size", "2", "--block-size", "16", "--steps", "10", "--optimizer", "muon",
           "--eval-batches", "1", "--log-every", "5", "--ckpt-every", "0", "--threads", "1", "--device", "cpu",
           "--out", str(out), "--json"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=150, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(run.stdout)  # exactly one JSON object: rank 0 prints nothing
    assert summary["schedule"] == "2bw" and summary["steps"] == 10 and summary["backend"] == "gloo"
    cfg = small(schedule="2bw", stages=2, grad_accum=2, optimizer="muon")
    assert max_abs_diff(load_model(out), reference_model(cfg)) == 0.0
