"""The harness's metrics, the seed-noise floor and the count intervals against hand computations; the
regression against numpy's least squares; the corrector's resolution rule; the fresh grid's shape."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as st

from delaylab.predict import corrector, fresh, regression
from delaylab.predict import metrics as M
from delaylab.predict import report as R


def _cell(per_seed: dict, **kw) -> dict:
    gaps = list(per_seed.values())
    n = len(gaps)
    m = float(np.mean(gaps))
    half = st.t.ppf(0.975, n - 1) * np.std(gaps, ddof=1) / math.sqrt(n)
    return {"measured": {"gap": m, "ci": [m - half, m + half], "per_seed": per_seed, "seeds": n}, **kw}


def test_per_cell_counts():
    meas = {"gap": 0.2, "ci": [0.1, 0.3]}
    assert M.per_cell(0.11, meas) == {"within_x2": True, "inside": True, "sign": True,
                                      "abs_log": pytest.approx(math.log(0.2 / 0.11))}
    assert M.per_cell(0.45, meas)["within_x2"] is False and M.per_cell(0.4, meas)["within_x2"] is True
    assert M.per_cell(-0.2, meas) == {"within_x2": False, "inside": False, "sign": False, "abs_log": math.inf}
    assert M.per_cell(None, meas)["sign"] is False


def test_score_spearman_and_coverage():
    cells = [_cell({0: g, 1: g + 0.01, 2: g - 0.01}) for g in (0.1, 0.2, 0.4, 0.8)]
    preds = [{"gap": p, "interval": [p / 3, p * 3]} for p in (0.06, 0.3, 0.35, 2.0)]
    s = M.score(cells, preds)
    assert s["spearman"] == pytest.approx(1.0) and s["within_x2"] == 3 and s["covered"] == 4
    meas = [c["measured"]["gap"] for c in cells]
    assert s["median_abs_log"] == pytest.approx(np.median([abs(math.log(p["gap"] / m)) for p, m in zip(preds, meas)]))
    const = M.score(cells, [{"gap": 0.1, "interval": None}] * 4)
    assert const["spearman"] is None and const["covered"] is None  # a constant ranks nothing


def test_floor_is_the_mean_over_every_half_split():
    per = {0: 0.10, 1: 0.30, 2: 0.12, 3: 0.16}
    f = M.floor([_cell(per)], draws=10)
    g = list(per.values())
    hits, inside = [], []
    for a in itertools.combinations(range(4), 2):
        b = [i for i in range(4) if i not in a]
        p, other = np.mean([g[i] for i in a]), [g[i] for i in b]
        m = np.mean(other)
        half = st.t.ppf(0.975, 1) * np.std(other, ddof=1) / math.sqrt(2)
        hits.append(0.5 <= p / m <= 2)
        inside.append(m - half <= p <= m + half)
    assert f["within_x2"] == pytest.approx(round(np.mean(hits), 1))
    assert f["inside"] == pytest.approx(round(np.mean(inside), 1)) and f["cells"] == 1


def test_count_difference_interval_is_the_paired_t_interval_times_n():
    a, b = [1, 1, 0, 1, 1, 0, 1, 1], [0, 1, 0, 0, 1, 0, 1, 0]
    d = np.array(a) - np.array(b)
    half = st.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    out = R.count_difference(a, b)
    assert out["value"] == 3
    assert out["interval"] == pytest.approx([(d.mean() - half) * 8, (d.mean() + half) * 8])


def test_ridge_without_penalty_is_least_squares():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 2))
    y = 1.5 + x @ [2.0, -1.0] + 0.1 * rng.normal(size=40)
    rows = [{"1": 1.0, "a": a, "b": b} for a, b in x]
    fit = regression.fit(rows, ["1", "a", "b"], y, groups=[i % 4 for i in range(40)], penalties=(0.0,))
    coef, *_ = np.linalg.lstsq(np.c_[np.ones(40), x], y, rcond=None)
    for r in rows[:5]:
        assert fit.predict(r) == pytest.approx(coef @ [1.0, r["a"], r["b"]], abs=1e-10)
    assert regression.Ridge.from_dict(fit.to_dict()).predict(rows[0]) == fit.predict(rows[0])


def test_corrector_best_is_resolved_only_when_every_paired_difference_excludes_zero():
    base = dict(report="r", variant="v", optimizer="adamw", lr=1e-3, momentum=0.9, delay=1, delay_dist=None,
                steps=100, batch_size=8, preset="small", lr_schedule="cosine", sync_start=0, sync_cooldown=0)
    none = _cell({0: 0.30, 1: 0.32, 2: 0.31}, correction="none", **base)
    ef = _cell({0: 0.10, 1: 0.11, 2: 0.12}, correction="ef", **base)
    noisy = _cell({0: 0.05, 1: 0.40, 2: 0.02}, correction="predict", **base)
    (s,) = corrector.settings([none, ef])
    assert (s["best"], s["resolved"]) == ("ef", True)
    (s,) = corrector.settings([none, ef, noisy])
    assert s["best"] == "ef" and s["resolved"] is False  # EF - prediction per seed: [+0.05, -0.29, +0.10]


def test_fresh_grid_pairs_every_delayed_run_with_a_sync_run_of_its_seed():
    runs = fresh.runs()
    sync = {(r.cell.optimizer, r.cell.lr, r.cell.seed) for r in runs if r.cell.mode == "sync"}
    delayed = [r for r in runs if r.cell.mode != "sync"]
    assert all((r.cell.optimizer, r.cell.lr, r.cell.seed) in sync for r in delayed)
    assert {r.base.get("delay") for r in delayed} == set(fresh.DELAYS)
    assert {r.base["batch_size"] for r in runs} == {fresh.BATCH} and len({r.folder for r in runs}) == len(runs)
    assert len(runs) == sum(len(v) for v in fresh.LRS.values()) * fresh.SEEDS * (1 + sum(map(len, fresh.DELAYS.values())))


def test_the_second_fresh_grid_is_new_in_delay_lr_batch_and_length():
    """Every run of fresh-2 pairs with a sync run of its seed, and no committed cell nor the first grid
    has any of its delays, lrs (per optimizer), batch or length."""
    from pathlib import Path

    from delaylab.predict import cells as C

    runs = fresh.grid_runs(fresh.NAME_2)
    g = fresh.GRID_2
    sync = {(r.cell.optimizer, r.cell.lr, r.cell.seed) for r in runs if r.cell.mode == "sync"}
    delayed = [r for r in runs if r.cell.mode != "sync"]
    assert delayed and all((r.cell.optimizer, r.cell.lr, r.cell.seed) in sync for r in delayed)
    assert len({r.folder for r in runs}) == len(runs) == 64
    seen = C.load(Path(__file__).resolve().parents[2] / "docs", extra=[Path(__file__).resolve().parents[2]
                                                                       / "docs/predict/fresh"])
    assert not {float(t) for t in g["delays"]} & {c["mean_delay"] for c in seen}
    assert all(lr not in {c["lr"] for c in seen if c["optimizer"] == o} for o, lrs in g["lrs"].items() for lr in lrs)
    assert g["batch"] not in {c["batch_size"] for c in seen} and g["steps"] not in {c["steps"] for c in seen}
    assert {r.base["steps"] for r in runs} == {g["steps"]} and {r.base["batch_size"] for r in runs} == {g["batch"]}
