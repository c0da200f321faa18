import json
import re

import pytest

from delaylab.llm import sweep as S
from delaylab.llm.sweep import plan, summarize, sweep


def rec(opt, mode, lr, seed, loss, mom=None):
    return {"optimizer": opt, "mode": mode, "lr": lr, "momentum": mom, "seed": seed, "val_loss": loss}


def test_summarize_pairs_seeds_and_picks_the_best_sync_lr():
    records = [
        rec("adamw", "sync", 1e-3, 0, 2.0), rec("adamw", "sync", 1e-3, 1, 2.2),
        rec("adamw", "delayed", 1e-3, 0, 2.5), rec("adamw", "delayed", 1e-3, 1, 2.5),
        rec("adamw", "ef", 1e-3, 0, 2.1), rec("adamw", "ef", 1e-3, 1, 2.4),
        rec("adamw", "sync", 3e-3, 0, 2.3), rec("adamw", "sync", 3e-3, 1, None),  # diverged
        rec("adamw", "delayed", 3e-3, 0, 2.9), rec("adamw", "delayed", 3e-3, 1, 3.0),
    ]
    g = summarize(records)
    best = g["best"]["adamw"]
    assert best["lr"] == 1e-3
    assert best["sync"]["mean"] == pytest.approx(2.1) and best["sync"]["std"] == pytest.approx(0.1414213, rel=1e-5)
    assert best["gap"]["values"] == pytest.approx([0.5, 0.3])
    assert best["gap"]["mean"] == pytest.approx(0.4)
    # EF: seed 0 recovers (2.5-2.1)/0.5 = 80%, seed 1 (2.5-2.4)/0.3 = 33.3%; of the mean gap 62.5%
    assert best["ef_recovered_pct"]["values"] == pytest.approx([80.0, 100 / 3])
    assert best["ef_recovered_pct"]["of_mean_gap"] == pytest.approx(62.5)
    other = next(r for r in g["grid"] if r["lr"] == 3e-3)
    assert other["gap"]["values"][1] is None and other["gap"]["mean"] == pytest.approx(0.6)


def test_plan_rejects_bad_names_before_running(quick):
    with pytest.raises(ValueError, match="unknown optimizer"):
        plan(quick(), ["adamw", "nadam"], ["sync"])
    with pytest.raises(ValueError, match="unknown sweep mode"):
        plan(quick(), ["adamw"], ["async"])
    cells = plan(quick(), ["adamw", "muon"], ["sync", "ef"], {"adamw": [1e-3, 2e-3]}, [0.9], seeds=2)
    assert len(cells) == (2 + 1) * 2 * 2
    assert {c.lr for c in cells if c.optimizer == "muon"} == {0.02}  # the optimizer's default


def test_sweep_writes_gaps_and_figures_and_does_not_rerun_finished_cells(quick, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DELAYLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DELAYLAB_PROGRESS_INTERVAL", "1e9")  # the cells' lines only, none between
    base = quick(steps=4, eval_every=2, log_every=1)
    gaps = sweep(base, tmp_path / "sw", ["adamw", "muon"], ["sync", "delayed", "ef"],
                 lrs={"adamw": [1e-3, 3e-3], "muon": [0.02]}, momenta=[0.8, 0.9], seeds=1)
    out = tmp_path / "sw"
    # stderr is not a terminal here: one line per finished cell, with its count and time
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("sweep: ")]
    assert len(lines) == 18 and lines[0].startswith("sweep: 1/18 ") and lines[-1].startswith("sweep: 18/18 ")
    times = r"(\d+ s|\d+\.\d min)"
    assert all(re.search(rf"\(\d+\.\d s, val loss \d+\.\d{{3}}; {times} so far, ETA {times}\)$", x) for x in lines), lines[:2]
    saved = json.loads((out / "gaps.json").read_text())
    assert saved["best"].keys() == {"adamw", "muon"}
    # 4 updates validated every 2: 2 points, too few for the overhead, and gaps.json says so
    assert saved["eval_points"] == 2 and "too coarse" in saved["warnings"][0]
    assert set(saved["best"]["adamw"]["overhead"]) == {"delayed", "ef"}
    assert set(saved["best"]["adamw"]["diagnostics"]) == {"sync", "delayed", "ef"}
    for name in ("llm_loss_curves.png", "llm_iso_loss.png", "llm_gap_vs_momentum.png", "llm_loss_vs_lr.png"):
        assert (out / name).stat().st_size > 1000
    cell = out / "cells" / "adamw_ef_lr0.001_m0.8_s0"
    summary = json.loads((cell / "summary.json").read_text())
    assert (summary["mode"], summary["correction"], summary["lr"]) == ("delayed", "ef", 1e-3)
    row = next(r for r in gaps["grid"] if (r["optimizer"], r["lr"], r["momentum"]) == ("adamw", 1e-3, 0.8))
    assert row["ef"]["values"] == [summary["val_loss"]]
    # a rerun reads every cell instead of training again
    monkeypatch.setattr(S, "train", lambda *a, **k: pytest.fail("reran a finished cell"))
    again = sweep(base, out, ["adamw", "muon"], ["sync", "delayed", "ef"],
                  lrs={"adamw": [1e-3, 3e-3], "muon": [0.02]}, momenta=[0.8, 0.9], seeds=1)
    assert again["grid"] == gaps["grid"]
    with pytest.raises(ValueError, match="another base config"):
        sweep(quick(steps=5), out, ["adamw"], ["sync"])


def val_curve(vals, lr_lines=1):
    """Metrics lines every 10 updates (64 tokens each) with a validation on each."""
    return [{"step": 10 * (i + 1), "tokens": 640 * (i + 1), "lr": 1.0 - 0.01 * i, "train_loss": v + 0.1,
             "val_loss": v} for i, v in enumerate(vals)]


def test_summarize_adds_overhead_and_diagnostics_from_metrics_lines():
    sync = val_curve([3.0, 2.6, 2.4, 2.2])
    records = [
        dict(rec("adamw", "sync", 1e-3, 0, 2.2), metrics=sync),
        dict(rec("adamw", "delayed", 1e-3, 0, 2.3), metrics=val_curve([3.2, 2.8, 2.5, 2.3])),
        dict(rec("adamw", "ef", 1e-3, 0, 2.15), metrics=val_curve([3.1, 2.7, 2.3, 2.15])),
    ]
    row = summarize(records)["best"]["adamw"]
    # delayed never reaches 2.2: no number (no extrapolation)
    d = row["overhead"]["delayed"]
    assert d["mean"] is None and d["reached"] == [False] and d["n_reached"] == 0
    # EF crosses 2.2 between (1920, 2.3) and (2560, 2.15): 1920 + 0.1/0.15 * 640 = 2346.67
    assert row["overhead"]["ef"]["mean"] == pytest.approx((1920 + 640 * 2 / 3) / 2560)
    assert "sync" not in row["overhead"]
    # monotone curves: no spike; level 3.1 at the first line (lr peaks there), 3.1 - 0.1 reached by
    # the trailing mean of 3 lines at step 40 for sync: (2.7 + 2.5 + 2.3)/3 = 2.5
    assert row["diagnostics"]["sync"]["spike"]["values"] == [0.0]
    assert row["diagnostics"]["sync"]["plateau_exit"]["values"] == [40]
    # without metrics lines (reproduce's records) the rows carry neither
    assert "overhead" not in summarize([rec("adamw", "sync", 1e-3, 0, 2.2)])["grid"][0]


def test_render_shows_intervals_overhead_and_diagnostics():
    from delaylab.commands.llm import render_gaps

    records = [dict(rec("adamw", m, 1e-3, s, v), metrics=val_curve(c)) for m, s, v, c in (
        ("sync", 0, 2.2, [3.0, 2.6, 2.4, 2.2]), ("delayed", 0, 2.3, [3.2, 2.8, 2.5, 2.3]),
        ("ef", 0, 2.15, [3.1, 2.7, 2.3, 2.15]))]
    g = {**summarize(records), "figures": [], "warnings": ["too coarse"]}
    text = render_gaps(g)
    assert "not reached" in text and "0.92" in text  # delayed never reaches sync's loss; EF's 2346.67 / 2560
    # EF recovers (2.3 - 2.15) / (2.3 - 2.2) = 150%, unstable: one seed resolves no gap
    assert "150*" in text and "warning: too coarse" in text


def test_the_demo_states_the_ordering_only_where_the_seeds_resolve_it():
    from delaylab.commands.demo import ordering

    def gaps(adamw, muon):
        return {"grid": [{"optimizer": "adamw", "gap": {"values": adamw}},
                         {"optimizer": "muon", "gap": {"values": muon}}]}

    clear = ordering(gaps([0.30, 0.53, 0.37, 0.53], [0.12, 0.13, 0.12, 0.10]))
    assert clear["resolved"] and clear["difference"]["mean"] == pytest.approx(0.315, abs=1e-3)
    lo, hi = clear["difference"]["ci"]  # t(0.975, 3) = 3.1824 on the paired differences
    diffs = [0.18, 0.40, 0.25, 0.43]
    m = sum(diffs) / 4
    sd = (sum((d - m) ** 2 for d in diffs) / 3) ** 0.5
    assert (lo, hi) == pytest.approx((m - 3.1824 * sd / 2, m + 3.1824 * sd / 2), rel=1e-4)
    assert not ordering(gaps([0.30, 0.05], [0.12, 0.13]))["resolved"]
    assert ordering({"grid": [{"optimizer": "adamw", "gap": {"values": [0.3]}}]}) is None
