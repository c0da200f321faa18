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
