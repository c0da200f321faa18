import json

import pytest

from delaylab.cli import main

QUICK = ["--preset", "tiny", "--batch-size", "4", "--block-size", "32", "--eval-batches", "2", "--threads", "1"]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DELAYLAB_CACHE", str(tmp_path / "cache"))


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_train_json_prints_the_summary_and_writes_the_run(tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, err = run(capsys, "llm", "train", *QUICK, "--optimizer", "muon", "--delay", "1",
                            "--correction", "ef", "--steps", "6", "--out", str(out), "--json")
    assert code == 0
    summary = json.loads(stdout)  # exactly one JSON object
    for key in ("val_loss", "train_loss", "steps", "tokens", "tokens_per_s", "optimizer", "mode", "correction"):
        assert key in summary
    assert (summary["optimizer"], summary["mode"], summary["correction"], summary["steps"]) == ("muon", "delayed", "ef", 6)
    # 6 updates take 7 calls with tau = 1; tokens count the 6 batches whose gradients were applied
    assert (summary["tokens"], summary["calls"]) == (6 * 4 * 32, 7)
    assert json.loads((out / "summary.json").read_text()) == summary
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines][-1] == 6
    assert json.loads((out / "config.json").read_text())["optim"]["optimizer"] == "muon"


def test_cli_resume_matches_an_uninterrupted_run(tmp_path, capsys):
    args = [*QUICK, "--optimizer", "adamw", "--delay", "1", "--steps", "6", "--json"]
    run(capsys, "llm", "train", *args, "--out", str(tmp_path / "a"))
    full = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert run(capsys, "llm", "train", *args, "--out", str(tmp_path / "b"), "--stop-at", "3")[0] == 0
    code, stdout, _ = run(capsys, "llm", "train", "--resume", str(tmp_path / "b"), "--json")
    assert code == 0 and json.loads(stdout)["val_loss"] == full["val_loss"]


@pytest.mark.parametrize("argv,msg", [
    (["--preset", "huge"], "unknown preset"),
    (["--optimizer", "nadam"], "unknown optimizer"),
    (["--delay", "-1"], "delay must be an integer >= 0"),
    (["--lr", "0"], "lr must be > 0"),
    (["--steps", "0"], "steps must be >= 1"),
    (["--data", "/nonexistent/corpus.txt"], "not found"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, argv, msg):
    out = tmp_path / "run"
    code, stdout, err = run(capsys, "llm", "train", *QUICK, *argv, "--out", str(out))
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1 and stdout == ""
    assert not out.exists()


def test_bad_data_files_and_foreign_checkpoints(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    (tmp_path / "empty.txt").write_text("")
    pq.write_table(pa.table({"body": ["some text"] * 5}), tmp_path / "shard.parquet")
    for path, msg in ((tmp_path / "empty.txt", "empty"), (tmp_path / "shard.parquet", "no column 'text'")):
        code, _, err = run(capsys, "llm", "train", *QUICK, "--data", str(path), "--out", str(tmp_path / "x"))
        assert code == 2 and msg in err and len(err.strip().splitlines()) == 1
    run_dir = tmp_path / "run"
    assert run(capsys, "llm", "train", *QUICK, "--steps", "2", "--out", str(run_dir))[0] == 0
    def files():
        return {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}

    before = files()
    code, _, err = run(capsys, "llm", "train", "--resume", str(run_dir), "--lr", "0.5")
    assert code == 2 and "another config" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "llm", "train", *QUICK, "--steps", "2", "--out", str(run_dir))
    assert code == 2 and "already holds a run" in err
    assert files() == before


def test_sweep_cli_prints_gaps_json(tmp_path, capsys):
    code, stdout, _ = run(capsys, "llm", "sweep", *QUICK, "--optimizers", "adamw", "--modes", "sync,delayed",
                          "--lrs", "adamw=0.001,0.002", "--steps", "3", "--out", str(tmp_path / "sw"), "--json")
    assert code == 0
    gaps = json.loads(stdout)
    assert len(gaps["grid"]) == 2
    # The best lr, recomputed from what the runs recorded: each sync cell's lr (config.json) and its
    # last validation loss (metrics.jsonl).
    final = {}
    for cell in (tmp_path / "sw" / "cells").iterdir():
        config = json.loads((cell / "config.json").read_text())
        if config["delay"]["delay"] == 0:
            lines = [json.loads(line) for line in (cell / "metrics.jsonl").read_text().splitlines()]
            final[config["optim"]["lr"]] = [r["val_loss"] for r in lines if "val_loss" in r][-1]
    assert sorted(final) == [0.001, 0.002] and len(set(final.values())) == 2
    assert gaps["best"]["adamw"]["lr"] == min(final, key=final.get)
    assert gaps["best"]["adamw"]["sync"]["mean"] == min(final.values())
    code, _, err = run(capsys, "llm", "sweep", "--lrs", "adamw=-1", "--out", str(tmp_path / "s2"))
    assert code == 2 and "must be > 0" in err
