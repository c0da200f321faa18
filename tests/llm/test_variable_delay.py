"""``--delay-dist`` in the simulator: a constant cycle is ``--delay tau`` bit for bit, a random
delay resumes bit for bit in mid-run (the draw's state rides in the checkpoint), sweeps keep the
distribution in their delayed modes only, and bad input is a one-line error with exit code 2."""

import json

import pytest
import torch

from delaylab.cli import main
from delaylab.llm import checkpoint
from delaylab.llm.config import Config
from delaylab.llm.run.trainer import train
from delaylab.llm.sweep import Cell


def model_of(folder):
    return checkpoint.read(folder)["model"]


@pytest.mark.parametrize("correction", ["none", "ef,predict"])
def test_a_constant_cycle_is_the_delay_flag_bit_for_bit(quick, corpus, tmp_path, correction):
    """Same flags but ``--delay-dist cycle:2`` for ``--delay 2``: the same weights, losses and tokens
    (the queue spends two more calls filling)."""
    common = dict(optimizer="muon", correction=correction, ckpt_final=True)
    dist = train(quick(delay_dist="cycle:2", **common), tmp_path / "d", dataset=corpus)
    queue = train(quick(delay=2, **common), tmp_path / "q", dataset=corpus)
    for key in ("val_loss", "train_loss", "steps", "tokens"):
        assert dist[key] == queue[key], key
    assert (dist["calls"], queue["calls"]) == (8, 10)
    a, b = model_of(tmp_path / "d"), model_of(tmp_path / "q")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert dist["delay_dist"] == "cycle:2" and dist["mode"] == "delayed"


def test_a_random_delay_resumes_bit_for_bit_in_mid_run(quick, corpus, tmp_path):
    cfg = quick(optimizer="adamw", delay_dist="uniform:0-3", correction="ef", steps=12, eval_every=6,
                ckpt_final=True)
    full = train(cfg, tmp_path / "full", dataset=corpus)
    train(cfg, tmp_path / "part", stop_at=5, dataset=corpus)
    saved = checkpoint.read(tmp_path / "part")["optimizer"]["delayed"]
    assert saved["delay_rng"] == {"seed": 0, "draws": 5}
    resumed = train(cfg, tmp_path / "part", resume=True, dataset=corpus)
    for key in ("val_loss", "train_loss", "steps", "calls", "tokens"):
        assert resumed[key] == full[key], key
    a, b = model_of(tmp_path / "full"), model_of(tmp_path / "part")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # another seed draws other delays: not the same run
    other = train(quick(optimizer="adamw", delay_dist="uniform:0-3", correction="ef", steps=12, eval_every=6,
                        seed=1), tmp_path / "other", dataset=corpus)
    assert other["val_loss"] != full["val_loss"]


def test_a_sweep_keeps_the_distribution_in_its_delayed_modes_only():
    base = Config.from_dict(preset="tiny", delay_dist="uniform:4")
    sync = Cell("adamw", "sync", 1e-3, None, 0).config(base)
    ef = Cell("adamw", "ef", 1e-3, None, 0).config(base)
    assert (sync.delay.delay_dist, sync.mode) == (None, "sync")
    assert (ef.delay.delay_dist, ef.delay.delay, ef.mode, ef.delay.correction) == ("uniform:0-4", 0, "delayed", "ef")


@pytest.mark.parametrize("argv,msg", [
    (["train", "--delay-dist", "uniform:4", "--delay", "1"], "not both"),
    (["train", "--delay-dist", "gauss:4"], "unknown delay distribution"),
    (["train", "--delay-dist", "uniform:4-1"], "LO <= HI"),
    (["train", "--delay-dist", "cycle:1,x"], "expected cycle"),
    (["train", "--delay-dist", "uniform:4", "--correction", "dc-asgd"], "not defined for a delay distribution"),
    (["train", "--delay-dist", "uniform:4", "--schedule", "2bw"], "for the simulator"),
    (["pipeline", "--delay-dist", "uniform:4", "--stages", "2"], "for the simulator"),
])
def test_bad_delay_dist_is_a_one_line_error_with_exit_2(tmp_path, capsys, argv, msg):
    code = main(["llm", *argv, "--preset", "tiny", "--steps", "2", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_the_cli_runs_a_random_delay_and_reports_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DELAYLAB_CACHE", str(tmp_path / "cache"))
    code = main(["llm", "train", "--preset", "tiny", "--delay-dist", "uniform:0-4", "--correction", "ef", "--steps",
                 "4", "--batch-size", "4", "--block-size", "32", "--eval-batches", "1", "--threads", "1", "--out",
                 str(tmp_path / "run"), "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["delay_dist"] == "uniform:0-4" and summary["calls"] == summary["steps"] == 4
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["delay"]["delay_dist"] == "uniform:0-4"
