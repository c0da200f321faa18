"""`delaylab theory check RUN_DIR` on a tiny `llm train` run: the verdict, its numbers recomputed, the errors;
which theorem covers which optimizer."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch

from delaylab.cli import main

TINY = ["--preset", "tiny", "--batch-size", "2", "--block-size", "16", "--steps", "4", "--ckpt-every", "2",
        "--eval-every", "4", "--eval-batches", "1", "--log-every", "2", "--device", "cpu", "--threads", "1",
        "--progress", "false"]
FAST = ["--iters", "3", "--samples", "2", "--held", "1"]


@pytest.fixture(scope="module")
def lmo_run(tmp_path_factory):
    """The analysed method (LMOMomentum, spectral norm) on every parameter, delay 1: Theorem 1 covers it."""
    run = tmp_path_factory.mktemp("check") / "run"
    assert main(["llm", "train", *TINY, "--optimizer", "lmo", "--lr", "0.01", "--delay", "1", "--out", str(run)]) == 0
    return run


def test_check_prints_its_verdict_and_its_numbers_are_the_runs(lmo_run, capsys, tmp_path):
    png = tmp_path / "check.png"
    capsys.readouterr()
    assert main(["theory", "check", str(lmo_run), *FAST, "--json", "--figure", str(png)]) == 0
    out, err = capsys.readouterr()
    assert out.count("\n") == 1 and "update 0/4" in err  # one JSON object; progress lines on stderr
    r = json.loads(out)
    c = r["constants"]
    assert r["theorem"] == "Theorem 1" and r["bound"] == "lmo-delayed" and r["norm"] == "spectral"
    assert r["gaps"] == [] and r["verdict"] == "holds" and png.stat().st_size > 1000
    # the replay reproduced both checkpoints bit for bit
    assert r["replay"] == {"checkpoints": [2, 4], "max_weight_diff": 0.0}
    # f(x_0) on the held-out batch, from the run's seed, computed here independently
    from delaylab.llm.config import Config
    from delaylab.llm.data import load_dataset
    from delaylab.llm.model import GPT

    cfg = Config.from_dict(json.loads((lmo_run / "config.json").read_text()))
    data = load_dataset()
    torch.manual_seed(cfg.run.seed)
    model = GPT(cfg.model_config(data.vocab_size)).double().eval()
    (x, y), = data.val_batches(1, cfg.data.batch_size, cfg.model.block_size)
    with torch.no_grad():
        f0 = float(model(torch.as_tensor(x), torch.as_tensor(y))[1])
    assert c["Delta"] == pytest.approx(f0, rel=1e-10)
    # the step norms are the schedule's lrs (exact LMO, no decay): warmup 0 of 4 updates, cosine to 0.1;
    # measured as differences of float32 weights, so to about 1e-7 |w| / step
    lrs = [0.01 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 3))) for k in range(4)]
    assert r["along"]["eta"] == pytest.approx(lrs, rel=1e-4)
    assert c["eta"] == pytest.approx(0.01, rel=1e-4) and c["T_eff"] == pytest.approx(sum(lrs) / 0.01, rel=1e-4)
    # the measured mean: the eta-weighted mean of the measured norms
    w, g = np.array(r["along"]["eta"]), np.array(r["along"]["grad_norm"])
    assert r["measured_mean"] == pytest.approx(float((w * g).sum() / w.sum()), rel=1e-12)
    # Theorem 1 by hand at the larger L (delay 1, beta 0.95, zero init)
    L, b, eta, T = max(c["L"].values()), c["beta"], c["eta"], c["T_eff"]
    want = (c["Delta"] / (eta * T) + L * eta / 2 + 2 * L * eta * b / (1 - b) + 2 * L * eta * 1
            + 2 * c["rho"] * c["sigma"] * math.sqrt((1 - b) / (1 + b))
            + 2 * b / ((1 - b) * T) * (c["G0"] + L * eta * b / (1 - b)))
    top = max(c["L"], key=c["L"].get)
    assert r["bound_at"][top]["value"] == pytest.approx(want, rel=1e-10) and want >= r["measured_mean"]
    assert set(c["L"]) == {"secant", "curvature"} and all(v > 0 for v in c["L"].values())
    # the text form (what the command prints without --json): the bound at each L, one verdict line
    from delaylab.llm.bound_check import render

    text = render(r)
    assert "bound at the secant L" in text and "bound at the curvature L" in text
    assert text.splitlines()[-1].startswith("verdict: holds: the measured mean")


def test_a_folder_without_checkpoints_or_a_bad_flag_is_one_line_exit_2(lmo_run, capsys, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(lmo_run, bare)
    shutil.rmtree(bare / "ckpt")
    capsys.readouterr()
    for argv in ([str(bare)], [str(tmp_path / "nothing")], [str(lmo_run), "--samples", "1"],
                 [str(lmo_run), "--every", "0"]):
        with pytest.raises(SystemExit) as exc:
            raise SystemExit(main(["theory", "check", *argv]))
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.strip().count("\n") == 0 and "Traceback" not in err
    assert main(["theory", "check", str(bare)]) == 2 and "no checkpoint" in capsys.readouterr().err
    # a config that no longer gives the checkpoints' weights: the replay is refused, not measured
    changed = tmp_path / "changed"
    shutil.copytree(lmo_run, changed)
    cfg = json.loads((changed / "config.json").read_text())
    cfg["optim"]["lr"] = 0.02
    (changed / "config.json").write_text(json.dumps(cfg))
    assert main(["theory", "check", str(changed), *FAST, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "does not reproduce the checkpoint of update 2" in err and err.strip().count("\n") == 0


def _coverage(**optim):
    from delaylab.llm.bound_check import coverage
    from delaylab.llm.config import Config
    from delaylab.llm.model import GPT
    from delaylab.llm.run.setup import build_delayed_optimizer

    cfg = Config.from_dict({"preset": "tiny", "steps": 10, **optim}).resolved("simulator")
    model = GPT(cfg.model_config(256))
    return coverage(cfg, model, build_delayed_optimizer(model, cfg))


def test_which_theorem_covers_which_run():
    muon = _coverage(optimizer="muon", delay=1)
    assert muon.bound.name == "lmo-nesterov-delayed" and muon.norm == "spectral" and muon.beta == 0.95
    assert len(muon.gaps) == 1 and "AdamW moves" in muon.gaps[0]
    assert all(p.ndim == 2 for p in muon.params) and any("Newton-Schulz" in c for c in muon.caveats)
    lion = _coverage(optimizer="lion", weight_decay=0.0)
    assert lion.bound.name == "lmo-lion" and lion.norm == "sign" and lion.gaps == [] and lion.beta == 0.99
    assert "weight decay" in _coverage(optimizer="lion").gaps[0]  # Lion's default decay 0.1
    sgd = _coverage(optimizer="sgd", lr_schedule="constant", warmup=0)
    assert sgd.bound.name == "sgdm" and sgd.norm == "euclidean" and sgd.gaps == []
    assert sgd.eta == pytest.approx(0.1 / (1 - 0.9))
    assert "constant step" in _coverage(optimizer="sgd").gaps[0]  # cosine with warmup
    adamw = _coverage(optimizer="adamw")
    assert adamw.bound is None and "no theorem here bounds adamw" in adamw.gaps[0]
    ef = _coverage(optimizer="lmo", delay=1, correction="ef")
    assert "correction 'ef'" in ef.gaps[0]
