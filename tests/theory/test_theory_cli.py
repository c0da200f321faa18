"""`delaylab theory ...`: JSON keys other tools read, values against the library, exit code 2."""

from __future__ import annotations

import json

import pytest

from delaylab.cli import main
from delaylab.theory import delay_penalty, evaluate, lmo_bound, sgdm_bound, tune
from delaylab.theory.plots import plot_penalty
from delaylab.theory.stability import max_stable

CONSTS = ["--L", "2", "--sigma", "1", "--Delta", "3", "--G0", "1", "--rho", "2"]
C = dict(L=2.0, sigma=1.0, Delta=3.0, G0=1.0, rho=2.0)


def run_json(capsys, argv):
    assert main(argv + ["--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    return json.loads(out)


def test_bound_json_has_value_and_terms_equal_to_the_library(capsys):
    d = run_json(capsys, ["theory", "bound", "--delay", "1", "--eta", "0.01", "--beta", "0.9", "--T", "1000"] + CONSTS)
    want = evaluate(lmo_bound(1), **C, T=1000, eta=0.01, beta=0.9)
    assert d["value"] == pytest.approx(want.value, rel=1e-12)
    assert d["terms"] == pytest.approx(want.terms, rel=1e-12)
    d = run_json(capsys, ["theory", "bound", "--delay", "1", "--ef", "--delta-bar", "0.4", "--eta", "0.01",
                          "--beta", "0.9", "--T", "1000"] + CONSTS)
    assert d["terms"]["delay"] == pytest.approx(2 * 2.0 * 0.01 * 0.4)
    # sgdm beyond its step-size cap: the bound says nothing -> null, valid false
    d = run_json(capsys, ["theory", "bound", "--method", "sgdm", "--delay", "2", "--eta", "1", "--beta", "0.5",
                          "--T", "100"] + CONSTS)
    assert d["value"] is None and d["valid"] is False


def test_tune_json_matches_the_library(capsys):
    d = run_json(capsys, ["theory", "tune", "--delay", "1", "--T", "1e4"] + CONSTS)
    r = tune(lmo_bound(1), 1e4, C)
    for k in ("eta", "beta", "value"):
        assert d[k] == pytest.approx(getattr(r, k), rel=1e-9)
    assert d["exponent"] == -0.25
    d = run_json(capsys, ["theory", "tune", "--method", "sgdm", "--delay", "1", "--T", "1e4"] + CONSTS)
    assert d["value"] == pytest.approx(tune(sgdm_bound(1), 1e4, C).value, rel=1e-9)
    assert d["exponent"] == -0.5 and d["exponent_norm"] == -0.25


def test_penalty_and_stability_json(capsys, tmp_path):
    d = run_json(capsys, ["theory", "penalty", "--delay", "1", "--T", "1e4"] + CONSTS)
    assert d["ratio"] == pytest.approx(delay_penalty(1e4, 1, C).ratio, rel=1e-9) and d["limit"] == 1
    fig = plot_penalty([1e3, 1e5], 1, C)  # what `penalty --plot` draws, on a shorter grid
    ratios = fig.axes[0].lines[0].get_ydata()
    assert ratios[0] > ratios[1] > 1
    png = tmp_path / "stab.png"
    d = run_json(capsys, ["theory", "stability", "--method", "adam", "--beta", "0.9", "--delay", "1",
                          "--plot", str(png)])
    assert d["max_stable"] == pytest.approx(1.0, rel=1e-9) and d["sync_max_stable"] == pytest.approx(38, rel=1e-9)
    assert png.stat().st_size > 1000
    d = run_json(capsys, ["theory", "stability", "--method", "ema", "--beta", "0.9", "--delay", "1", "--ef"])
    assert d["max_stable"] == pytest.approx(max_stable("ema", 0.9, 1, ef=True), rel=1e-12)


@pytest.mark.parametrize("bad", [["--beta", "1"], ["--beta", "-0.1"], ["--eta", "0"], ["--T", "0.5"],
                                 ["--delay", "-1"], ["--eta", "x"], ["--method", "adam"]])
def test_bad_inputs_exit_2_with_one_line(capsys, bad):
    argv = ["theory", "bound", "--eta", "0.01", "--beta", "0.9", "--T", "100"] + CONSTS
    for i in range(0, len(bad), 2):  # later flags override earlier ones
        argv += bad[i:i + 2]
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(argv))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.strip() and err.strip().count("\n") == 0 and "Traceback" not in err


def test_missing_constant_and_bad_stability_exit_2(capsys):
    assert main(["theory", "tune", "--T", "100", "--L", "1", "--sigma", "1", "--Delta", "1"]) == 2
    assert "--G0" in capsys.readouterr().err
    assert main(["theory", "stability", "--beta", "1.0"]) == 2
    assert main(["theory", "tune", "--T", "0"] + CONSTS) == 2
