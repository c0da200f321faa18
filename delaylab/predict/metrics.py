"""How a predicted end gap is scored against a cell's measured one, and the seed-noise floor.

Per cell: **within x2** (predicted / measured in [1/2, 2], so the same sign), **inside** (the
prediction inside the cell's 95% t interval), **right sign**, and ``|log(predicted / measured)|``
(infinite where the signs differ). Over cells: the three counts, the median of the last (None where
it is infinite: half the cells or more without a prediction or of the wrong sign), and
Spearman's rank correlation of predicted with measured over the cells that have a prediction
(undefined, None, where the predictions are all equal: a constant ranks nothing). A cell without a
prediction counts as a miss in every count. ``covered``: where the predictor gives an interval,
the cells whose measured gap lies inside it.

The **seed-noise floor** asks how well a cell predicts itself: the mean gap of half its seeds
against the mean of the other half, over every such split of every cell with at least two seeds
(the counts are expected values over the splits; "inside" is counted against the other half's own
t interval, so only for cells with four seeds or more). Half the seeds are noisier than all of
them, so a predictor scored against the full cell can come out above this floor: it is the
agreement that seed noise alone allows at these seed counts, not a bound.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from delaylab import stats

COUNTS = ("within_x2", "inside", "sign")


def per_cell(pred: float | None, measured: dict) -> dict:
    m, ci = measured["gap"], measured["ci"]
    if pred is None or not math.isfinite(pred):
        return {"within_x2": False, "inside": False, "sign": False, "abs_log": math.inf}
    ratio = pred / m if m else math.inf
    return {"within_x2": bool(0.5 <= ratio <= 2.0), "inside": bool(ci is not None and ci[0] <= pred <= ci[1]),
            "sign": bool(np.sign(pred) == np.sign(m)),
            "abs_log": abs(math.log(ratio)) if ratio > 0 and math.isfinite(ratio) else math.inf}


def spearman(pred: list, meas: list) -> float | None:
    """Spearman's rho (average ranks for ties); None where either side is constant or fewer than 3."""
    from scipy.stats import spearmanr

    if len(pred) < 3 or len(set(pred)) < 2 or len(set(meas)) < 2:
        return None
    return float(spearmanr(pred, meas).statistic)


def score(cells: list[dict], preds: list[dict]) -> dict:
    """The counts, median |log ratio|, Spearman and (where intervals are given) coverage of ``preds``
    (one ``{"gap", "interval"}`` per cell) against the cells' measured gaps."""
    rows = [per_cell(p["gap"], c["measured"]) for c, p in zip(cells, preds)]
    have = [(p["gap"], c["measured"]["gap"]) for c, p in zip(cells, preds)
            if p["gap"] is not None and math.isfinite(p["gap"])]
    med = float(np.median([r["abs_log"] for r in rows])) if rows else math.inf
    out = {"cells": len(cells), "predicted": len(have), **{k: sum(r[k] for r in rows) for k in COUNTS},
           "median_abs_log": med if math.isfinite(med) else None,
           "spearman": spearman([a for a, _ in have], [b for _, b in have])}
    with_iv = [(p["interval"], c["measured"]["gap"]) for c, p in zip(cells, preds) if p.get("interval")]
    out["covered"] = sum(lo <= m <= hi for (lo, hi), m in with_iv) if with_iv else None
    return out


def floor(cells: list[dict], draws: int = 200, seed: int = 0) -> dict:
    """The seed-noise floor (module doc): expected counts over every half/half split of each cell's
    seeds, the median |log ratio| over all splits, and Spearman's rho averaged over ``draws``
    random splits (one per cell per draw)."""
    counts = dict.fromkeys(COUNTS, 0.0)
    logs, splits_of = [], []
    scored = 0
    for c in cells:
        gaps = [g for g in c["measured"]["per_seed"].values() if stats.finite(g)]
        n = len(gaps)
        if n < 2:
            splits_of.append([])
            continue
        scored += 1
        splits = [(a, tuple(i for i in range(n) if i not in a)) for a in itertools.combinations(range(n), n // 2)]
        splits_of.append([(float(np.mean([gaps[i] for i in a])), float(np.mean([gaps[i] for i in b]))) for a, b in splits])
        per = []
        for a, b in splits:
            other = [gaps[i] for i in b]
            half = {"gap": float(np.mean(other)), "ci": stats.t_interval(other)}
            per.append(per_cell(float(np.mean([gaps[i] for i in a])), half))
        for k in COUNTS:
            counts[k] += sum(r[k] for r in per) / len(per)
        logs.extend(r["abs_log"] for r in per)
    rng = np.random.default_rng(seed)
    rhos = []
    for _ in range(draws):
        picks = [s[rng.integers(len(s))] for s in splits_of if s]
        r = spearman([p for p, _ in picks], [m for _, m in picks])
        if r is not None:
            rhos.append(r)
    return {"cells": scored, **{k: round(v, 1) for k, v in counts.items()},
            "median_abs_log": float(np.median(logs)) if logs else None,
            "spearman": float(np.mean(rhos)) if rhos else None, "draws": draws}
