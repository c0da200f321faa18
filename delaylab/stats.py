"""Statistics over seeds: the one summary of a sample, and the intervals every report uses.

Torch-free, on plain lists and ``{seed: value}`` dicts. A value that is None or not finite is a
diverged run: kept in ``values``, counted in ``diverged``, left out of every statistic. Used by
:mod:`delaylab.llm.metrics` (the run metrics: overheads, recoveries, lr optima), the sweep's
table and the report (:mod:`delaylab.reproduce.stats` adds the report's own helpers).

The intervals are the ones whose coverage holds at the handful of seeds a CPU report has (n = 3
to 10) on normal data: Student-t for means and paired differences, Welch's for two independent
means, Fieller's for ratios of paired means. The percentile bootstrap, which covers 74% at n = 3
and 81% at n = 4 on normal data, is not used. Their coverage at n = 3-10 and at the skew the
committed per-seed values show is simulated by :mod:`delaylab.reproduce.coverage` (the table of
docs/intervals.md); skew costs them coverage (about 92% at skewness 1.3).

An interval is ``[lo, hi]``; a confidence *set* (``set``) is a list of such pieces with None
for an infinite end: Fieller's set is one bounded piece, the union of two half-lines, or the
whole line, the last two when the denominator's mean is not resolved from 0.
"""

from __future__ import annotations

import math

import numpy as np

CONFIDENCE = 0.95


def finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def sample(values: list) -> dict:
    """A sample over seeds: ``values`` as given, ``n`` the finite ones, ``diverged`` the others, their
    ``mean``, sample ``std`` and the 95% Student-t interval of the mean ``ci`` (None where there is no
    finite value; std and ci None for one value: one seed has no spread)."""
    vals = [v for v in values if finite(v)]
    out = {"values": values, "n": len(vals), "diverged": len(values) - len(vals)}
    if not vals:
        return {**out, "mean": None, "std": None, "ci": None}
    std = float(np.std(vals, ddof=1)) if len(vals) > 1 else None
    return {**out, "mean": float(np.mean(vals)), "std": std, "ci": t_interval(vals)}


def paired(a: dict, b: dict) -> tuple[list, list]:
    """``(seeds, b[s] - a[s])`` over the seeds both have (None where either is None): a sync and
    a delayed run of one seed share init and batches, so their difference is the gap of that seed."""
    seeds = sorted(set(a) & set(b))
    return seeds, [None if a[s] is None or b[s] is None else b[s] - a[s] for s in seeds]


def t_quantile(n, confidence: float = CONFIDENCE):
    """The two-sided Student-t quantile for ``n`` values (n - 1 degrees of freedom); numpy-broadcast."""
    from scipy.stats import t as student

    return student.ppf(0.5 + confidence / 2, np.asarray(n) - 1)


def t_bounds(x: np.ndarray, confidence: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:
    """Student-t interval of the mean along the last axis of ``x`` (n >= 2), vectorised."""
    x = np.asarray(x, float)
    n = x.shape[-1]
    half = t_quantile(n, confidence) * x.std(axis=-1, ddof=1) / math.sqrt(n)
    m = x.mean(axis=-1)
    return m - half, m + half


def t_interval(values: list, confidence: float = CONFIDENCE) -> list | None:
    """Student-t interval of the mean of the finite values; None for fewer than two."""
    x = np.asarray([v for v in values if finite(v)], float)
    if len(x) < 2:
        return None
    lo, hi = t_bounds(x, confidence)
    return [float(lo), float(hi)]


def welch_bounds(a: np.ndarray, b: np.ndarray, confidence: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:
    """Welch's t interval of ``mean(b) - mean(a)`` along the last axis of two independent samples
    (two or more values each), vectorised: Satterthwaite's degrees of freedom; a zero standard
    error gives the point."""
    from scipy.stats import t as student

    x, y = np.asarray(a, float), np.asarray(b, float)
    nx, ny = x.shape[-1], y.shape[-1]
    va, vb = x.var(axis=-1, ddof=1) / nx, y.var(axis=-1, ddof=1) / ny
    se = np.sqrt(va + vb)
    d = y.mean(axis=-1) - x.mean(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        df = (va + vb) ** 2 / (va ** 2 / (nx - 1) + vb ** 2 / (ny - 1))
    half = np.where(se > 0, student.ppf(0.5 + confidence / 2, np.where(se > 0, df, 1.0)) * se, 0.0)
    return d - half, d + half


def welch_interval(a: list, b: list, confidence: float = CONFIDENCE) -> list | None:
    """Welch's t interval of ``mean(b) - mean(a)`` for two independent samples (finite values;
    None with fewer than two in either): :func:`welch_bounds`."""
    x, y = (np.asarray([v for v in s if finite(v)], float) for s in (a, b))
    if len(x) < 2 or len(y) < 2:
        return None
    lo, hi = welch_bounds(x, y, confidence)
    return [float(lo), float(hi)]


def fieller_bounds(num: np.ndarray, den: np.ndarray, confidence: float = CONFIDENCE):
    """Fieller's confidence set for ``mean(num) / mean(den)`` of paired samples (last axis), vectorised.

    The set is every r with ``(mean(num) - r mean(den))^2 <= t^2 var(num - r den) / n``, the
    t test of ``num - r den`` having mean 0 inverted (Fieller 1954; exact for normal pairs at
    any n). Writing it ``a r^2 - 2 b r + c <= 0`` with ``a = mean(den)^2 - q s_dd``,
    ``b = mean(num) mean(den) - q s_nd``, ``c = mean(num)^2 - q s_nn``, ``q = t^2 / n``:
    ``a > 0`` (the denominator's t test rejects 0) gives the bounded ``[lo, hi]`` between the
    roots; ``a <= 0`` gives ``(-inf, lo] U [hi, inf)`` when the roots are real, else every r.
    Returns ``(lo, hi, kind)``, kind 0 bounded, 1 the union of two half-lines, 2 everything.
    """
    x, y = np.asarray(num, float), np.asarray(den, float)
    n = x.shape[-1]
    q = t_quantile(n, confidence) ** 2 / n
    mx, my = x.mean(axis=-1), y.mean(axis=-1)
    dx, dy = x - mx[..., None], y - my[..., None]
    sxx, syy, sxy = ((dx * dx).sum(-1) / (n - 1), (dy * dy).sum(-1) / (n - 1), (dx * dy).sum(-1) / (n - 1))
    a, b, c = my * my - q * syy, mx * my - q * sxy, mx * mx - q * sxx
    disc = b * b - a * c
    root = np.sqrt(np.clip(disc, 0, None))
    with np.errstate(divide="ignore", invalid="ignore"):
        r1, r2 = (b - root) / a, (b + root) / a
    lo, hi = np.minimum(r1, r2), np.maximum(r1, r2)
    kind = np.where(a > 0, 0, np.where(disc > 0, 1, 2))
    return lo, hi, kind


def fieller(num: list, den: list, confidence: float = CONFIDENCE) -> dict:
    """``mean(num) / mean(den)`` over the pairs where both are finite, with Fieller's set
    (:func:`fieller_bounds`). ``ci``: the bounded interval, None where the set is unbounded
    (or with fewer than two pairs); ``set``: the pieces (None = infinite end)."""
    pairs = [(x, y) for x, y in zip(num, den) if finite(x) and finite(y)]
    n = len(pairs)
    x = np.array([p[0] for p in pairs], float)
    y = np.array([p[1] for p in pairs], float)
    ratio = float(x.mean() / y.mean()) if n and y.mean() != 0 else None
    out = {"ratio": ratio, "n": n, "ci": None, "set": None, "bounded": False}
    if n < 2:
        return out
    lo, hi, kind = (v.item() for v in fieller_bounds(x, y, confidence))
    if kind == 0:
        out.update(ci=[lo, hi], set=[[lo, hi]], bounded=True)
    elif kind == 1:
        out["set"] = [[None, lo], [hi, None]]
    else:
        out["set"] = [[None, None]]
    return out


def map_set(pieces: list | None, scale: float, shift: float = 0.0) -> list | None:
    """The confidence set of ``shift + scale * r`` from that of ``r`` (an affine map: ends swap
    where ``scale < 0``; None stays infinite)."""
    if pieces is None:
        return None
    out = []
    for lo, hi in pieces:
        a = None if lo is None else shift + scale * lo
        b = None if hi is None else shift + scale * hi
        out.append([a, b] if scale >= 0 else [b, a])
    return sorted(out, key=lambda p: -math.inf if p[0] is None else p[0])


def fmt_set(pieces: list | None, spec: str = ".3g") -> str:
    """``[a, b]``, ``(-inf, a] U [b, +inf)``, ``unbounded`` or ``n/a`` (no interval)."""
    if not pieces:
        return "n/a"
    if pieces == [[None, None]]:
        return "unbounded"

    def piece(lo, hi):
        left = "(-inf" if lo is None else "[" + format(lo, spec)
        right = "+inf)" if hi is None else format(hi, spec) + "]"
        return f"{left}, {right}"

    return " U ".join(piece(lo, hi) for lo, hi in pieces)
