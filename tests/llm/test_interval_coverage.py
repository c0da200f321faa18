"""Coverage of the report's 95% intervals at the seed counts it has (n = 3, 4, 6), simulated.

Each method is the library's own code (stats.t_bounds, stats.fieller_bounds, metrics.lr_shift)
run on samples whose true value is known: normal, and skewed (a standardized Gamma(4), skewness 1).
The test fails where a method covers less than 93% for a nominal 95%. Heavier skew is shown
by ``python tests/llm/test_interval_coverage.py`` (the table in docs/reproduction.md), not asserted:
the t test itself under-covers there (about 92% at skewness 1.75, 88% at 2).
"""

import math

import numpy as np
import pytest

from delaylab import stats as ST
from delaylab.llm import metrics as M

NS = (3, 4, 6)
REPS = 20000  # Monte-Carlo error of a coverage near 95%: about 0.15%
SHIFT_REPS = 800  # lr_shift is a Python call per draw; it is conservative (Bonferroni and a sum of two widths)
FLOOR = 0.93


def _noise(rng, dist: str, shape, skew: float = 1.0):
    """Mean 0, variance 1: normal, or a Gamma(k) standardized (skewness 2 / sqrt(k))."""
    if dist == "normal":
        return rng.standard_normal(shape)
    k = 4 / skew ** 2
    return (rng.gamma(k, 1.0, shape) - k) / math.sqrt(k)


def _dist_label(dist: str, skew: float) -> str:
    return "normal" if dist == "normal" else f"gamma, skew {skew:g}"


def _result(covered, bounded) -> dict:
    """Coverage (an unbounded set contains every value, so it covers), the share of bounded
    answers, and the coverage among those (so a method cannot pass by saying nothing)."""
    covered, bounded = np.asarray(covered, bool), np.asarray(bounded, bool)
    return {"coverage": float(covered.mean()), "bounded": float(bounded.mean()),
            "bounded_coverage": float(covered[bounded].mean()) if bounded.any() else math.nan}


def coverage_t_mean(n, dist, rng, skew=1.0):
    x = 0.3 + 0.1 * _noise(rng, dist, (REPS, n), skew)
    lo, hi = ST.t_bounds(x)
    return _result((lo <= 0.3) & (0.3 <= hi), np.ones(REPS))


def coverage_t_paired(n, dist, rng, skew=1.0):
    """sync and delayed share a seed's noise; the gap is delayed - sync, true gap 0.2."""
    shared = _noise(rng, "normal", (REPS, n))
    sync = 2.0 + 0.1 * shared
    delayed = 2.2 + 0.1 * shared + 0.05 * _noise(rng, dist, (REPS, n), skew)
    lo, hi = ST.t_bounds(delayed - sync)
    return _result((lo <= 0.2) & (0.2 <= hi), np.ones(REPS))


def coverage_fieller(n, dist, rng, skew=1.0, ratio=0.4):
    """EF gap / delayed gap, paired: delayed gap 0.3 +- 0.1, EF gap = ratio * it + 0.05 noise."""
    den = 0.3 + 0.1 * _noise(rng, dist, (REPS, n), skew)
    num = ratio * den + 0.05 * _noise(rng, dist, (REPS, n), skew)
    lo, hi, kind = ST.fieller_bounds(num, den)
    inside = np.where(kind == 0, (lo <= ratio) & (ratio <= hi), np.where(kind == 1, (ratio <= lo) | (ratio >= hi), True))
    return _result(inside, kind == 0)


def coverage_lr_shift(n, dist, rng, skew=1.0):
    """Losses at five lrs (factor 2 apart) on a parabola in log(lr) plus per-seed noise; the
    delayed optimum at 0.6x the sync one. Covered: the interval contains 0.6 (a censored or
    unbounded answer has no interval and counts as covering, as it claims nothing)."""
    lrs = [1e-3 * 2 ** k for k in range(5)]
    x = np.log(lrs)
    star_s, star_d = math.log(4e-3), math.log(0.6 * 4e-3)
    hits, bounded = [], []
    for _ in range(SHIFT_REPS):
        noise = 0.01 * _noise(rng, dist, (2, n, len(lrs)), skew)
        sync = 2.0 + 0.1 * (x - star_s) ** 2 + noise[0]
        delayed = 2.3 + 0.1 * (x - star_d) ** 2 + noise[1]
        out = M.lr_shift({lr: dict(enumerate(sync[:, i])) for i, lr in enumerate(lrs)},
                         {lr: dict(enumerate(delayed[:, i])) for i, lr in enumerate(lrs)})
        ci = out["ci"]
        hits.append(ci is None or ci[0] <= 0.6 <= ci[1])
        bounded.append(ci is not None)
    return _result(hits, bounded)


METHODS = {"t interval, mean": coverage_t_mean, "t interval, paired difference": coverage_t_paired,
           "Fieller, ratio of paired means": coverage_fieller,
           "Fieller + Bonferroni, lr-optimum shift": coverage_lr_shift}


def table(dists=(("normal", 1.0), ("gamma", 1.0)), ns=NS, seed=0) -> list[dict]:
    rows = []
    for name, fn in METHODS.items():
        for dist, skew in dists:
            rng = np.random.default_rng(seed)
            rows.append({"method": name, "distribution": _dist_label(dist, skew),
                         **{n: fn(n, dist, rng, skew) for n in ns}})
    return rows


@pytest.fixture(scope="module")
def coverage():
    return table()


@pytest.mark.parametrize("method", list(METHODS))
def test_coverage_at_small_n_is_at_least_93_percent(coverage, method):
    for row in (r for r in coverage if r["method"] == method):
        for n in NS:
            got = row[n]
            assert got["coverage"] >= FLOOR and got["bounded_coverage"] >= FLOOR, (method, row["distribution"], n, got)
            assert got["bounded"] >= 0.25, (method, row["distribution"], n, got)  # not passing by saying nothing


def test_fieller_is_exact_on_normal_pairs_and_reports_unbounded_sets():
    """Normal pairs: Fieller's set is exact, so coverage sits at 95% within Monte-Carlo error; a
    denominator not resolved from 0 gives an unbounded set (which covers) rather than a short wrong one."""
    rng = np.random.default_rng(1)
    n = 3
    den = 0.05 + 0.1 * rng.standard_normal((REPS, n))  # a gap smaller than its noise
    num = 0.4 * den + 0.05 * rng.standard_normal((REPS, n))
    lo, hi, kind = ST.fieller_bounds(num, den)
    inside = np.where(kind == 0, (lo <= 0.4) & (0.4 <= hi), np.where(kind == 1, (0.4 <= lo) | (0.4 >= hi), True))
    assert abs(inside.mean() - 0.95) < 0.006
    assert (kind > 0).mean() > 0.5  # most sets are unbounded: the report then says undetermined


def _markdown(rows, ns) -> str:
    """Coverage per n; where some sets are unbounded, (bounded share; coverage among the bounded)."""
    def cell(c):
        text = f"{100 * c['coverage']:.1f}%"
        return text if c["bounded"] == 1 else text + f" ({100 * c['bounded']:.0f}% bounded; {100 * c['bounded_coverage']:.1f}%)"

    head = "| method | distribution | " + " | ".join(f"n = {n}" for n in ns) + " |"
    lines = [head, "|" + "---|" * (2 + len(ns))]
    lines += [f"| {r['method']} | {r['distribution']} | " + " | ".join(cell(r[n]) for n in ns) + " |" for r in rows]
    return "\n".join(lines)


def coverage_percentile_bootstrap(n, dist, rng, skew=1.0, reps=4000, resamples=2000):
    """For contrast only (the library has none): the percentile bootstrap of a mean, 2000 resamples."""
    x = 0.3 + 0.1 * _noise(rng, dist, (reps, n), skew)
    idx = rng.integers(0, n, (reps, resamples, n))
    means = np.take_along_axis(x[:, None, :], idx, axis=2).mean(axis=2)
    lo, hi = np.quantile(means, 0.025, axis=1), np.quantile(means, 0.975, axis=1)
    return _result((lo <= 0.3) & (0.3 <= hi), np.ones(reps))


if __name__ == "__main__":  # the table of docs/reproduction.md, heavier skew and the bootstrap included
    dists = (("normal", 1.0), ("gamma", 1.0), ("gamma", 2.0))
    rows = table(dists=dists)
    for dist, skew in dists[:2]:
        rng = np.random.default_rng(0)
        rows.append({"method": "(not used) percentile bootstrap, mean", "distribution": _dist_label(dist, skew),
                     **{n: coverage_percentile_bootstrap(n, dist, rng, skew) for n in NS}})
    print(_markdown(rows, NS))
