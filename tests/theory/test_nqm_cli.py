"""`delaylab theory nqm`: the JSON against the library call, diverged models flagged, bad input in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from delaylab.cli import main
from delaylab.theory import nqm


def run_json(capsys, argv):
    assert main(argv + ["--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    return json.loads(out)


SPECTRUM = {"format": "delaylab-spectrum-1", "init_val_loss": 5.5, "d_model": 4,
            "checkpoints": [{"step": 10, "val_loss": 2.5, "noise_trace": 3.0, "noise_trace_precond": 30.0,
                             "hessian": {"nodes": [-0.1, 0.01, 0.3, 5.0], "weights": [10, 500, 100, 5]},
                             "precond": {"nodes": [-0.5, 0.1, 3.0, 40.0], "weights": [10, 500, 100, 15]}}]}


def test_json_equals_the_library(capsys, tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(SPECTRUM))
    d = run_json(capsys, ["theory", "nqm", "--spectrum", str(path), "--lr", "0.003", "--steps", "50", "--batch", "8",
                          "--delay", "2", "--correction", "ef"])
    want = nqm.predict_gap(SPECTRUM, "adamw", 0.003, 50, 8, delay=2, correction="ef")
    assert d["end_gap"] == pytest.approx(want["end_gap"], rel=1e-12)
    assert d["model"] == "exact" and d["density"] == "precond" and d["diverged"] == {"sync": False, "delayed": False}
    # the fit by hand: noise c = kappa h with kappa = 30 / (0.1*500 + 3*100 + 40*15); start 3 nats of excess
    spec = nqm.nodes_from_spectrum(SPECTRUM, "precond")
    assert spec.c[3] / spec.h[3] == pytest.approx(30.0 / 950.0)
    assert spec.loss(spec.x0sq) == pytest.approx(3.0)


def test_negative_curvature_is_flat():
    spec = nqm.nodes_from_spectrum(SPECTRUM, "hessian")
    assert spec.h.min() == 0 and spec.w.sum() == 615 and spec.c[0] == 0


def test_a_diverged_model_is_flagged_not_printed(capsys):
    d = run_json(capsys, ["theory", "nqm", "--lr", "3", "--steps", "100"])  # eta*h = 30 > 1: delay 1 is unstable
    assert d["end_gap"] is None and d["diverged"]["delayed"] and not d["diverged"]["sync"]
    assert d["end_delayed"] is None and all(v is None or abs(v) < 1e6 for v in d["gap"])
    assert main(["theory", "nqm", "--lr", "3", "--steps", "100"]) == 0
    assert "diverges" in capsys.readouterr().out


def test_monte_carlo_models_and_the_plot(capsys, tmp_path):
    png = tmp_path / "g.png"
    d = run_json(capsys, ["theory", "nqm", "--optimizer", "muon", "--lr", "0.05", "--steps", "30", "--runs", "20",
                          "--delay", "3,2,1,0", "--plot", str(png)])
    assert d["model"] == "muon" and d["delay"] == [3, 2, 1, 0] and png.stat().st_size > 1000
    assert all(s > 0 for s in d["gap_se"][1:])
    d = run_json(capsys, ["theory", "nqm", "--model", "adamw", "--lr", "0.01", "--steps", "30", "--runs", "20",
                          "--delay", "uniform:0-4"])
    assert d["delay"] == {str(t): 0.2 for t in range(5)}


@pytest.mark.parametrize("argv", [["--delay", "x"], ["--delay", "1,-1"], ["--lr", "0"], ["--optimizer", "nope"],
                                  ["--optimizer", "muon", "--model", "exact"], ["--spectrum", "/no/such.json"],
                                  ["--min-lr-ratio", "2"], ["--checkpoint", "5"], ["--correction", "dc-asgd"]])
def test_bad_input_one_line_exit_2(capsys, argv):
    """A value argparse rejects leaves by SystemExit, one the command rejects by main's return: 2 either way."""
    try:
        code = main(["theory", "nqm", "--steps", "10"] + argv)
    except SystemExit as stop:
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_lyapunov_vs_recursion_on_a_fitted_spectrum():
    spec = nqm.nodes_from_spectrum(SPECTRUM, "precond")
    m = nqm.Method("ema", 0.9, 1, ef=1)
    s = nqm.stationary_loss(spec, m, 0.01, batch=8)
    assert s == pytest.approx(nqm.expected_loss(spec, m, np.full(20000, 0.01), batch=8)[-1], rel=1e-8)


def test_eos_caps_each_curve_below_its_own_limit():
    """lr 0.1: 40 * 0.1 = 4 is past the delayed limit (1) and inside the sync one (38): the plain
    model diverges, the capped one does not, and both curves start at the same loss."""
    plain = nqm.predict_gap(SPECTRUM, "adamw", 0.1, 200, 8, delay=1, schedule="constant")
    assert plain["end_gap"] is None and plain["diverged"] == {"sync": False, "delayed": True}
    eos = nqm.predict_gap(SPECTRUM, "adamw", 0.1, 200, 8, delay=1, schedule="constant", eos=True)
    assert eos["end_gap"] is not None and eos["sync"][0] == pytest.approx(eos["delayed"][0])
    assert np.allclose(eos["sync"], plain["sync"])  # sync is under its limit: nothing capped


def test_eos_flag(capsys, tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(SPECTRUM))
    argv = ["theory", "nqm", "--spectrum", str(path), "--lr", "0.1", "--steps", "200", "--batch", "8",
            "--schedule", "constant"]
    assert run_json(capsys, argv)["end_gap"] is None
    d = run_json(capsys, argv + ["--eos"])
    assert d["eos"] and d["end_gap"] == pytest.approx(
        nqm.predict_gap(SPECTRUM, "adamw", 0.1, 200, 8, schedule="constant", eos=True)["end_gap"], rel=1e-12)
    assert main(argv + ["--eos", "--optimizer", "muon"]) == 2  # the Monte Carlo models adapt on their own
