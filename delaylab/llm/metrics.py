"""Metrics of delayed training read from ``metrics.jsonl`` records, and the statistics over seeds.

Pure functions on plain dicts (``{"step", "tokens", "lr", "train_loss", "val_loss"?}``, one per
logged update, as :mod:`delaylab.llm.train` writes them); nothing here needs torch.

Definitions (each function's docstring says the details):

- **iso-loss token overhead** (marin's metric): the tokens a run needs to reach the sync run's
  final validation loss, over the sync run's tokens; 1.0 = no overhead. Between validation
  points the loss is interpolated linearly in tokens. A run that never gets there has a lower
  bound ``> 1 + remaining fraction``.
- **loss spike**: the largest rise of the logged training loss above its running minimum, at a
  logged step after warmup.
- **plateau exit**: the first logged step after warmup at which the training loss, smoothed over
  a few lines, is ``drop`` nats below its level at the end of warmup.
- **statistics**: per-seed values paired by seed; Student-t and percentile-bootstrap intervals
  of the mean; medians; a mitigation's recovery as a ratio of means with a paired bootstrap.
"""

from __future__ import annotations

import math
from statistics import median as _median

import numpy as np

from delaylab.errors import ConfigError

CONFIDENCE = 0.95
RESAMPLES = 2000  # bootstrap resamples: the percentile's Monte-Carlo error is ~0.5% of coverage
BOOT_SEED = 0  # a fixed seed: gaps.json is the same on every rerun
MIN_EVAL_POINTS = 8  # fewer validation points than this cannot place an iso-loss crossing well


# -- helpers ----------------------------------------------------------------------------------------


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def _tokens(rec: dict) -> float:
    # tokens where logged; the update count is proportional to it within one run family
    return float(rec["tokens"] if "tokens" in rec else rec["step"])


def val_points(records: list[dict]) -> list[tuple[float, float]]:
    """``(tokens, val_loss)`` of every record with a finite validation loss, in order."""
    pts = [(_tokens(r), float(r["val_loss"])) for r in records if _finite(r.get("val_loss"))]
    if any(b[0] <= a[0] for a, b in zip(pts, pts[1:])):
        raise ConfigError("metrics records: tokens must increase from one validation to the next")
    return pts


def eval_points(steps: int, eval_every: int) -> int:
    """Validations a run of ``steps`` updates makes (every ``eval_every`` and at the end)."""
    return steps // eval_every + (1 if steps % eval_every else 0)


# -- iso-loss token overhead ---------------------------------------------------------------------


def iso_loss_overhead(sync_records: list[dict], other_records: list[dict]) -> dict:
    """Tokens ``other`` needs to reach sync's final validation loss ``L*``, over sync's tokens ``T``.

    The crossing is the first validation point ``i`` with ``val_i <= L*``; between it and the
    point before, the loss is taken as linear in tokens, so the crossing is at
    ``t_{i-1} + (val_{i-1} - L*) / (val_{i-1} - val_i) * (t_i - t_{i-1})``. Where the first
    validation point already reaches ``L*`` there is nothing to interpolate from: its tokens are
    an upper bound (``upper_bound: True``). ``resolution`` is the bracketing interval's width
    over ``T``: the crossing lies within it whatever the curve does between the two points.

    A run that never reaches ``L*`` (``reached: False``) has ``overhead`` None and
    ``lower_bound = 1 + remaining fraction``: its tokens ``T_o`` plus the tokens still needed if
    the loss kept falling at the rate of its last validation interval, over ``T``. For a convex
    (flattening) loss curve the rate only slows, so this is a lower bound; where the last
    interval did not fall it is ``T_o / T`` alone (``extrapolated: False``).
    """
    sync, other = val_points(sync_records), val_points(other_records)
    if not sync or not other:
        raise ConfigError("iso-loss overhead needs validation losses in both runs")
    (t_sync, target) = sync[-1]
    out = {"target_loss": target, "sync_tokens": t_sync, "reached": True, "overhead": None,
           "lower_bound": None, "upper_bound": False, "resolution": None}
    for i, (t, v) in enumerate(other):
        if v <= target:
            if i == 0:
                out.update(overhead=t / t_sync, upper_bound=True, resolution=t / t_sync)
                return out
            t0, v0 = other[i - 1]
            cross = t0 + (v0 - target) / (v0 - v) * (t - t0)
            out.update(overhead=cross / t_sync, resolution=(t - t0) / t_sync)
            return out
    t_last, v_last = other[-1]
    extra, extrapolated = 0.0, False
    if len(other) > 1:
        t0, v0 = other[-2]
        slope = (v_last - v0) / (t_last - t0)
        if slope < 0:
            extra, extrapolated = (v_last - target) / -slope, True
    out.update(reached=False, lower_bound=(t_last + extra) / t_sync, extrapolated=extrapolated)
    return out


def fmt_overhead(o: dict | None, spec: str = ".2f") -> str:
    """``1.23``, ``> 1.40`` (never reached: a lower bound), ``<= 0.10`` (reached at the first
    validation point), ``n/a``."""
    if not o:
        return "n/a"
    if o.get("reached") is False or o.get("is_lower_bound"):
        v = o.get("lower_bound") if o.get("reached") is False else o.get("mean")
        return "n/a" if v is None else f"> {format(v, spec)}"
    v = o.get("overhead", o.get("mean"))
    if v is None:
        return "n/a"
    return f"<= {format(v, spec)}" if o.get("upper_bound") else format(v, spec)


def overhead_over_seeds(per_seed: list[dict | None]) -> dict:
    """Per-seed overheads summarized: a seed that never reached the target enters with its lower
    bound, so the mean and the median are then lower bounds too (``is_lower_bound``: both are
    monotone in every value)."""
    vals = [None if o is None else (o["overhead"] if o["reached"] else o["lower_bound"]) for o in per_seed]
    finite = [v for v in vals if _finite(v)]
    lower = any(o is not None and not o["reached"] for o in per_seed)
    return {"values": vals, "reached": [None if o is None else o["reached"] for o in per_seed],
            "mean": sum(finite) / len(finite) if finite else None,
            "median": _median(finite) if finite else None, "is_lower_bound": lower,
            "resolution": max((o["resolution"] for o in per_seed if o and o["resolution"] is not None),
                              default=None)}


# -- regime diagnostics ------------------------------------------------------------------------


def warmup_end(records: list[dict]) -> int:
    """The first logged step at which the logged lr reaches its maximum: the end of the linear
    warmup as the metrics see it (the first logged step at or after it)."""
    lrs = [(r["step"], r["lr"]) for r in records if _finite(r.get("lr"))]
    if not lrs:
        raise ConfigError("metrics records carry no lr: give warmup explicitly")
    top = max(lr for _, lr in lrs)
    return next(s for s, lr in lrs if lr >= top * (1 - 1e-12))


def _train(records: list[dict]) -> list[tuple[int, float]]:
    return [(r["step"], float(r["train_loss"])) for r in records if _finite(r.get("train_loss"))]


def loss_spike(records: list[dict], warmup: int | None = None) -> dict:
    """The largest training-loss spike after warmup.

    ``spike = max over logged steps t > warmup of (loss_t - min_{s < t} loss_s)`` over logged
    steps s (warmup's included, so a rise right after warmup counts), floored at 0; ``relative``
    divides it by that running minimum. ``step``: where it peaks (None without a rise). Each
    logged loss is the mean over the updates since the line before, so single-update spikes
    are averaged over ``log_every`` updates.
    """
    pts = _train(records)
    w = warmup_end(records) if warmup is None else warmup
    best = {"spike": 0.0, "relative": 0.0, "step": None, "warmup": w}
    low = math.inf
    for step, loss in pts:
        if step > w and low < math.inf and loss - low > best["spike"]:
            best.update(spike=loss - low, relative=(loss - low) / low, step=step)
        low = min(low, loss)
    return best


def plateau_exit(records: list[dict], warmup: int | None = None, drop: float = 0.1, window: int = 3) -> dict:
    """The update at which the training loss leaves its level at the end of warmup.

    ``level``: the loss logged at the warmup-end step (the last logged step <= ``warmup``).
    ``step``: the first logged step t > warmup at which the mean of the last ``window`` logged
    losses, all after warmup (so the trailing mean lags by up to ``window - 1`` lines), is below
    ``level - drop``; None if the run never gets there (``left: False``). ``after_warmup``:
    ``step - warmup``, the length of the plateau (small for a run that keeps falling).
    """
    if drop <= 0 or window < 1:
        raise ConfigError(f"plateau_exit needs drop > 0 and window >= 1, got {drop}, {window}")
    pts = _train(records)
    w = warmup_end(records) if warmup is None else warmup
    before = [loss for step, loss in pts if step <= w]
    out = {"level": None, "step": None, "after_warmup": None, "left": False, "warmup": w}
    if not before:
        return out
    level = before[-1]
    out["level"] = level
    after = [(step, loss) for step, loss in pts if step > w]
    for i in range(window - 1, len(after)):
        if sum(loss for _, loss in after[i - window + 1:i + 1]) / window < level - drop:
            out.update(step=after[i][0], after_warmup=after[i][0] - w, left=True)
            break
    return out


def diagnostics(records: list[dict], warmup: int | None = None) -> dict:
    """Both regime diagnostics of one run (see :func:`loss_spike`, :func:`plateau_exit`)."""
    return {"spike": loss_spike(records, warmup), "plateau": plateau_exit(records, warmup)}


# -- statistics --------------------------------------------------------------------------------------


def paired(a: dict, b: dict) -> tuple[list, list]:
    """``(seeds, b[s] - a[s])`` over the seeds both have (None where either is None): a sync and
    a delayed run of one seed share init and batches, so their difference is the gap of that seed."""
    seeds = sorted(set(a) & set(b))
    return seeds, [None if a[s] is None or b[s] is None else b[s] - a[s] for s in seeds]


def t_interval(values: list, confidence: float = CONFIDENCE) -> list | None:
    """Student-t interval of the mean of the finite values; None for fewer than two."""
    from scipy.stats import t as student

    x = np.asarray([v for v in values if _finite(v)], float)
    if len(x) < 2:
        return None
    half = float(student.ppf(0.5 + confidence / 2, len(x) - 1)) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return [float(x.mean()) - half, float(x.mean()) + half]


def bootstrap(values, statistic=np.mean, resamples: int = RESAMPLES, seed: int = BOOT_SEED,
              confidence: float = CONFIDENCE) -> list | None:
    """Percentile bootstrap interval of ``statistic``: ``resamples`` draws of ``n`` indices with
    replacement from ``numpy.random.default_rng(seed)`` (one ``integers(0, n, (resamples, n))``
    call), the statistic of each (rows of ``values``: a 2-D array resamples whole seeds), and
    the ``(1 - confidence)/2`` and ``(1 + confidence)/2`` quantiles (numpy's linear) of the
    finite results. None for fewer than two values."""
    x = np.asarray(values, float)
    n = len(x)
    if n < 2:
        return None
    idx = np.random.default_rng(seed).integers(0, n, (resamples, n))
    if statistic is np.mean and x.ndim == 1:
        stats = x[idx].mean(axis=1)  # the same numbers as the loop, vectorized
    else:
        stats = np.array([statistic(x[i]) for i in idx], float)
    stats = stats[np.isfinite(stats)]
    if not len(stats):
        return None
    a = (1 - confidence) / 2
    return [float(np.quantile(stats, a)), float(np.quantile(stats, 1 - a))]


def describe(values: list) -> dict:
    """Mean, sample std, min, max, median, the t and the bootstrap interval of the mean over the
    finite values (None where there is none, std and intervals None for one seed: one seed has
    no spread); ``values`` kept as given (None: a diverged run), ``n`` the finite ones."""
    vals = [v for v in values if _finite(v)]
    out = {"values": values, "n": len(vals)}
    if not vals:
        return {**out, "mean": None, "std": None, "min": None, "max": None, "median": None,
                "ci_t": None, "ci_boot": None}
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else None
    return {**out, "mean": mean, "std": std, "min": min(vals), "max": max(vals), "median": _median(vals),
            "ci_t": t_interval(vals), "ci_boot": bootstrap(vals)}


def _recovery(rows: np.ndarray) -> float:
    """``100 * (mean delayed - mean fix) / (mean delayed - mean sync)`` of rows (sync, delayed, fix)."""
    s, d, f = rows.mean(axis=0)
    return 100 * (d - f) / (d - s) if d != s else math.nan


def recovery(sync: dict, delayed: dict, fix: dict) -> dict:
    """The share (%) of the gap a mitigation recovers, from ``{seed: val_loss}`` of each mode.

    ``of_mean_gap``: the ratio of means over the modes' finite runs (as before this module);
    ``ratio_of_means``: the same over the seeds where all three finished, with a paired
    bootstrap interval (``ci_boot``: whole seeds resampled, resamples whose mean gap is 0
    dropped); ``values``: per seed (None where a run diverged or the gap is 0), ``median``
    their median. ``unstable``: the gap's t interval over the paired seeds contains 0 (or
    there are fewer than two), so the ratio divides by a gap that is not resolved.
    """
    means = [describe(list(m.values()))["mean"] for m in (sync, delayed, fix)]
    of_mean = None
    if None not in means and means[1] != means[0]:
        of_mean = 100 * (means[1] - means[2]) / (means[1] - means[0])
    seeds = sorted(set(sync) & set(delayed) & set(fix))
    per_seed = []
    for s in seeds:
        x, d, f = sync[s], delayed[s], fix[s]
        per_seed.append(None if None in (x, d, f) or d == x else 100 * (d - f) / (d - x))
    full = [s for s in seeds if None not in (sync[s], delayed[s], fix[s])]
    rows = np.array([[sync[s], delayed[s], fix[s]] for s in full], float).reshape(-1, 3)
    ratio = _recovery(rows) if len(full) else math.nan
    gap_ci = t_interval([delayed[s] - sync[s] for s in full])
    finite = [v for v in per_seed if _finite(v)]
    return {"of_mean_gap": of_mean, "values": per_seed, "median": _median(finite) if finite else None,
            "ratio_of_means": ratio if math.isfinite(ratio) else None,
            "ci_boot": bootstrap(rows, _recovery) if len(full) > 1 else None,
            "unstable": gap_ci is None or gap_ci[0] <= 0 <= gap_ci[1]}


def mean_ratio(num: dict, den: dict) -> dict:
    """``mean(num) / mean(den)`` over the seeds both have, finite: e.g. PipeDream's gap over 2BW's,
    paired by seed. ``ci_boot``: whole seeds resampled (:func:`bootstrap`; resamples whose
    denominator mean is 0 dropped). ``unstable``: the denominator's t interval contains 0 (or
    fewer than two seeds), so the ratio divides by something not resolved from 0."""
    seeds = [s for s in sorted(set(num) & set(den)) if _finite(num[s]) and _finite(den[s])]
    rows = np.array([[num[s], den[s]] for s in seeds], float).reshape(-1, 2)

    def ratio(r: np.ndarray) -> float:
        d = r[:, 1].mean()
        return r[:, 0].mean() / d if d != 0 else math.nan

    value = ratio(rows) if len(seeds) else math.nan
    den_ci = t_interval(list(rows[:, 1]))
    return {"ratio": value if math.isfinite(value) else None, "seeds": seeds,
            "ci_boot": bootstrap(rows, ratio) if len(seeds) > 1 else None,
            "unstable": den_ci is None or den_ci[0] <= 0 <= den_ci[1]}


# -- the lr optimum ------------------------------------------------------------------------------------


def lr_optimum(lrs: list[float], losses: list) -> float | None:
    """The lr of least loss, between grid points: a parabola in log(lr) through the best grid
    point and its two neighbours (the three nearest at the grid's edge), its vertex clipped to
    those three points' range; the best grid point itself where the parabola opens downward or
    there are fewer than three finite points. A diverged run (None / inf) counts as worst."""
    pts = sorted((float(lr), loss if _finite(loss) else math.inf) for lr, loss in zip(lrs, losses))
    if not pts or all(math.isinf(v) for _, v in pts):
        return None
    i = min(range(len(pts)), key=lambda k: pts[k][1])
    if len(pts) < 3:
        return pts[i][0]
    j = min(max(i, 1), len(pts) - 2)
    trio = pts[j - 1:j + 2]
    if any(math.isinf(v) for _, v in trio):
        return pts[i][0]
    x = np.log([lr for lr, _ in trio])
    a, b, _ = np.polyfit(x, [v for _, v in trio], 2)
    if a <= 0:
        return pts[i][0]
    return float(np.exp(np.clip(-b / (2 * a), x[0], x[-1])))


def lr_shift(base: dict, other: dict) -> dict:
    """How far ``other``'s lr optimum sits from ``base``'s: ``{lr: {seed: loss}}`` each (e.g. sync
    and delayed over one lr grid). ``ratio``: :func:`lr_optimum` of ``other``'s mean losses over
    ``base``'s; ``ci_boot``: whole seeds resampled (the seeds every lr of both has), both
    optima refitted on each resample; ``grid``: the ratio of the two best grid points."""
    lrs = sorted(set(base) & set(other))
    seeds = sorted(set.intersection(*(set(base[lr]) & set(other[lr]) for lr in lrs))) if lrs else []
    if not seeds:
        return {"ratio": None, "ci_boot": None, "grid": None, "base_lr": None, "other_lr": None, "seeds": []}

    def value(x) -> float:
        return x if _finite(x) else math.inf

    cube = np.array([[[value(base[lr][s]), value(other[lr][s])] for lr in lrs] for s in seeds], float)

    def optima(c: np.ndarray) -> tuple:
        means = c.mean(axis=0)  # (lrs, 2): base, other
        return lr_optimum(lrs, list(means[:, 0])), lr_optimum(lrs, list(means[:, 1]))

    def ratio(c: np.ndarray) -> float:
        a, b = optima(c)
        return b / a if a and b else math.nan

    a, b = optima(cube)
    means = cube.mean(axis=0)
    best = [lrs[int(np.argmin(means[:, k]))] for k in (0, 1)]
    return {"ratio": b / a if a and b else None, "base_lr": a, "other_lr": b, "grid": best[1] / best[0],
            "ci_boot": bootstrap(cube, ratio) if len(seeds) > 1 else None, "seeds": seeds}
