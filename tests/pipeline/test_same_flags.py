"""The same flags give the same run: `llm train` simulates what `llm pipeline` runs."""

import json

import pytest

from delaylab.cli import main

pytestmark = pytest.mark.dist

FLAGS = ["--schedule", "2bw", "--stages", "2", "--preset", "tiny", "--steps", "6", "--batch-size", "4",
         "--block-size", "32", "--eval-batches", "2", "--device", "cpu", "--threads", "1", "--json"]


@pytest.mark.timeout(180)
def test_train_and_pipeline_with_the_same_flags_reach_the_same_loss(tmp_path, capsys):
    assert main(["llm", "pipeline", *FLAGS, "--out", str(tmp_path / "pipe")]) == 0
    pipe = json.loads(capsys.readouterr().out)
    assert main(["llm", "train", *FLAGS, "--eval-every", "6", "--out", str(tmp_path / "sim")]) == 0
    sim = json.loads(capsys.readouterr().out)
    for key in ("delay", "microbatches", "stages", "schedule", "optimizer", "lr", "steps"):
        assert pipe[key] == sim[key], key
    assert (sim["delay"], sim["microbatches"]) == (1, 4)  # 2bw's delay; the pipeline's default M
    assert pipe["val_loss"] == sim["val_loss"]  # float32, the same operations: bit for bit
    saved = [json.loads((tmp_path / d / "config.json").read_text()) for d in ("pipe", "sim")]
    assert saved[0] == {**saved[1], "run": {**saved[1]["run"], "eval_every": saved[0]["run"]["eval_every"]}}


@pytest.mark.timeout(180)
def test_compile_runs_in_the_pipeline_and_reports_flops(tmp_path, capsys, monkeypatch):
    """--compile in the pipeline compiles each weight slot's blocks (aot_eager here: no C++ compiler
    needed); the run reaches the simulator's compiled loss, and reports FLOPs per token (no MFU on
    the CPU without --peak-tflops)."""
    monkeypatch.setenv("DELAYLAB_COMPILE_BACKEND", "aot_eager")
    flags = [*FLAGS, "--compile", "true"]
    assert main(["llm", "pipeline", *flags, "--out", str(tmp_path / "pipe")]) == 0
    pipe = json.loads(capsys.readouterr().out)
    assert main(["llm", "train", *flags, "--eval-every", "6", "--out", str(tmp_path / "sim")]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert abs(pipe["val_loss"] - sim["val_loss"]) < 1e-6
    assert pipe["flops_per_token"] == sim["flops_per_token"] > 0 and pipe["mfu"] is None and sim["mfu"] is None
