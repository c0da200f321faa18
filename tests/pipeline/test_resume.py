"""Checkpoint and resume: a run resumed from a flush-free checkpoint equals the uninterrupted run."""

import json
import shutil
import subprocess
import sys

import pytest

from delaylab.llm.checkpoint import latest_complete, load_part, steps_on_disk
from delaylab.llm.run.rank import train_pipeline
from pipeline_helpers import load_model, max_abs_diff, small

pytestmark = pytest.mark.dist


def _without_time(path):
    return [{k: v for k, v in json.loads(line).items() if k != "time"} for line in open(path)]


@pytest.mark.timeout(300)
def test_resume_from_a_mid_run_checkpoint_equals_the_uninterrupted_run(tmp_path):
    # AdamW + EF: both weight versions, Adam moments and the EF buffer must come back;
    # dropout: the per-microbatch RNG seeding must too.
    cfg = small(schedule="2bw", stages=2, grad_accum=2, optimizer="adamw", correction="ef",
                dropout=0.1, ckpt_every=4, log_every=3)
    full = tmp_path / "full"
    summary = train_pipeline(cfg, full)
    assert summary["status"] == "finished"
    root = full / "ckpt"
    assert steps_on_disk(root) == [8, 10]  # every stage keeps its last two
    sd = load_part(root, 8, 0)
    assert len(sd["executor"]["slots"]) == 2 and sd["step"] == 8
    buffers = sd["executor"]["optimizer"]["delayed"]["buffers"]
    assert buffers and all("ef_buffer" in b for b in buffers.values())

    # A crash after update 8: the step-10 checkpoint and the results never got written.
    crashed = tmp_path / "crashed"
    shutil.copytree(full, crashed)
    shutil.rmtree(crashed / "ckpt" / "step_0000010")
    for name in ("model.pt", "summary.json"):
        (crashed / name).unlink()
    assert latest_complete(crashed / "ckpt", 2) == 8
    run = subprocess.run(
        [sys.executable, "-m", "delaylab", "llm", "pipeline", "--resume", str(crashed), "--json"],
        capture_output=True, text=True, timeout=240,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    resumed = json.loads(run.stdout)
    assert resumed["resumed_from"] == 8 and resumed["steps"] == 10
    assert max_abs_diff(load_model(crashed), load_model(full)) == 0.0
    assert _without_time(crashed / "metrics.jsonl") == _without_time(full / "metrics.jsonl")
    assert resumed["val_loss"] == summary["val_loss"]


def test_resume_refuses_another_config_and_a_missing_checkpoint(tmp_path):
    from delaylab.cli import main

    with pytest.raises(FileNotFoundError, match="no complete pipeline checkpoint"):
        train_pipeline(small(), tmp_path / "empty", resume=True)
    folder = tmp_path / "run"
    (folder / "ckpt" / "step_0000004").mkdir(parents=True)
    for s in range(2):
        (folder / "ckpt" / "step_0000004" / f"stage_{s}.pt").write_bytes(b"")
    (folder / "config.json").write_text(json.dumps(small(optimizer="muon").to_dict()))
    with pytest.raises(ValueError, match="another config: optimizer='adamw' vs 'muon'"):
        train_pipeline(small(optimizer="adamw"), folder, resume=True)
    assert main(["llm", "pipeline", "--resume", str(folder), "--optimizer", "sgd"]) == 2
