"""Metrics of delayed training read from ``metrics.jsonl`` records, and summarized over seeds.

Pure functions on plain dicts (``{"step", "tokens", "lr", "train_loss", "val_loss"?}``, one per
logged update, as both engines write them through :class:`delaylab.llm.run.folder.TrainFolder`);
nothing here needs torch.

Definitions (each function's docstring says the details):

- **iso-loss token overhead** (marin's metric): the tokens a run needs to reach the sync run's
  final validation loss, over the sync run's tokens; 1.0 = no overhead. Between validation
  points the loss is interpolated linearly in tokens. A run that never gets there has no
  number (a longer run measures it).
- **loss spike**: the largest rise of the logged training loss above its running minimum, at a
  logged step after warmup.
- **plateau exit**: the first logged step after warmup at which the training loss, smoothed over
  a few lines, is ``drop`` nats below its level at the end of warmup.
- over seeds: a mitigation's recovery, a gap ratio and an lr optimum's vertex are ratios of paired
  means, with Fieller's set; the sample summary and the intervals are :mod:`delaylab.stats`'.
"""

from __future__ import annotations

import math
from statistics import median as _median

import numpy as np

from delaylab.errors import ConfigError
from delaylab.stats import CONFIDENCE, fieller, map_set, sample, t_interval
from delaylab.stats import finite as _finite
MIN_EVAL_POINTS = 8  # fewer validation points than this cannot place an iso-loss crossing well


# -- helpers ----------------------------------------------------------------------------------------


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


def iso_loss_overhead(sync_records: list[dict], other_records: list[dict], sync_tokens: float | None = None) -> dict:
    """Tokens ``other`` needs to reach sync's final validation loss ``L*``, over sync's tokens ``T``.

    The crossing is the first validation point ``i`` with ``val_i <= L*``; between it and the
    point before, the loss is taken as linear in tokens, so the crossing is at
    ``t_{i-1} + (val_{i-1} - L*) / (val_{i-1} - val_i) * (t_i - t_{i-1})``. Where the first
    validation point already reaches ``L*`` there is nothing to interpolate from: its tokens are
    an upper bound (``upper_bound: True``). ``resolution`` is the bracketing interval's width
    over ``T``: the crossing lies within it whatever the curve does between the two points.

    A run that never reaches ``L*`` has ``reached: False`` and ``overhead`` None: no number.
    (Its last slope is no bound: at the end of a cosine schedule the lr has decayed and the
    curve is flat; a longer run, its schedule stretched, is what measures the overhead.)
    """
    sync, other = val_points(sync_records), val_points(other_records)
    if not sync or not other:
        raise ConfigError("iso-loss overhead needs validation losses in both runs")
    (t_sync, target) = sync[-1]
    out = {"target_loss": target, "sync_tokens": t_sync, "reached": True, "overhead": None,
           "upper_bound": False, "resolution": None}
    for i, (t, v) in enumerate(other):
        if v <= target:
            if i == 0:
                out.update(overhead=t / t_sync, upper_bound=True, resolution=t / t_sync)
                return out
            t0, v0 = other[i - 1]
            cross = t0 + (v0 - target) / (v0 - v) * (t - t0)
            out.update(overhead=cross / t_sync, resolution=(t - t0) / t_sync)
            return out
    out.update(reached=False, tokens=other[-1][0] / t_sync)
    return out


def fmt_overhead(o: dict | None, spec: str = ".2f") -> str:
    """``1.23`` (``[lo, hi]`` over seeds where there is one), ``<= 0.10`` (reached at the first
    validation point), ``not reached at 4x`` (with the longest run's length, where known),
    ``not reached``, ``n/a``."""
    if not o:
        return "n/a"
    if o.get("reached") is False or (o.get("n_reached") is not None and o["n_reached"] < len(o["values"])):
        at = o.get("max_length")
        text = "not reached" + (f" at {at:g}x" if at else "")
        if "values" in o and len(o["values"]) > 1:
            text += f" ({o['n_reached']}/{len(o['values'])} seeds)"
        return text
    v = o.get("overhead", o.get("mean"))
    if v is None:
        return "n/a"
    if o.get("upper_bound"):
        return f"<= {format(v, spec)}"
    ci = o.get("ci")
    return format(v, spec) + ("" if not ci else f" [{format(ci[0], spec)}, {format(ci[1], spec)}]")


def overhead_over_seeds(per_seed: list[dict | None], max_length: float | None = None) -> dict:
    """Per-seed overheads summarized: mean, median and t interval only where every seed reached
    the target (a seed that did not has no number, so neither has the mean); ``n_reached``
    counts them. ``max_length``: the longest run tried, as a multiple of sync's (text only)."""
    vals = [None if o is None or not o["reached"] else o["overhead"] for o in per_seed]
    reached = [None if o is None else o["reached"] for o in per_seed]
    n_reached = sum(r is True for r in reached)
    all_in = per_seed and n_reached == len(per_seed)
    finite = [v for v in vals if _finite(v)]
    return {"values": vals, "reached": reached, "n_reached": n_reached, "max_length": max_length,
            "mean": sum(finite) / len(finite) if all_in and finite else None,
            "median": _median(finite) if all_in and finite else None,
            "ci": t_interval(finite) if all_in else None,
            "upper_bound": bool(all_in and any(o["upper_bound"] for o in per_seed)),
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


# -- recoveries and ratios over seeds -------------------------------------------------------------


def recovery(sync: dict, delayed: dict, fix: dict) -> dict:
    """The share (%) of the gap a mitigation recovers, from ``{seed: val_loss}`` of each mode.

    ``of_mean_gap``: the ratio of means over the modes' finite runs; ``ratio_of_means``:
    ``100 (1 - mean(fix - sync) / mean(delayed - sync))`` over the seeds where all three
    finished, the same number on paired seeds, with Fieller's set for the ratio of the paired
    gaps mapped through ``100 (1 - r)`` (``ci`` where bounded, ``set`` always); ``values``: per
    seed (None where a run diverged or the gap is 0), ``median`` their median. ``unstable``:
    the gap's t interval contains 0 (or fewer than two seeds): then Fieller's set is unbounded.
    """
    means = [sample(list(m.values()))["mean"] for m in (sync, delayed, fix)]
    of_mean = None
    if None not in means and means[1] != means[0]:
        of_mean = 100 * (means[1] - means[2]) / (means[1] - means[0])
    seeds = sorted(set(sync) & set(delayed) & set(fix))
    per_seed = []
    for s in seeds:
        x, d, f = sync[s], delayed[s], fix[s]
        per_seed.append(None if None in (x, d, f) or d == x else 100 * (d - f) / (d - x))
    full = [s for s in seeds if None not in (sync[s], delayed[s], fix[s])]
    gaps = [delayed[s] - sync[s] for s in full]
    ratio = fieller([fix[s] - sync[s] for s in full], gaps)
    pieces = map_set(ratio["set"], -100.0, 100.0)
    gap_ci = t_interval(gaps)
    finite = [v for v in per_seed if _finite(v)]
    return {"of_mean_gap": of_mean, "values": per_seed, "median": _median(finite) if finite else None,
            "ratio_of_means": None if ratio["ratio"] is None else 100 * (1 - ratio["ratio"]), "n": len(full),
            "ci": pieces[0] if ratio["bounded"] else None, "set": pieces,
            "unstable": gap_ci is None or gap_ci[0] <= 0 <= gap_ci[1]}


def mean_ratio(num: dict, den: dict) -> dict:
    """``mean(num) / mean(den)`` over the seeds both have, finite, with Fieller's set
    (:func:`fieller`): e.g. PipeDream's gap over 2BW's, paired by seed. ``unstable``: the
    denominator's t interval contains 0 (or fewer than two seeds), so the set is unbounded."""
    seeds = [s for s in sorted(set(num) & set(den)) if _finite(num[s]) and _finite(den[s])]
    out = fieller([num[s] for s in seeds], [den[s] for s in seeds])
    den_ci = t_interval([den[s] for s in seeds])
    return {**out, "seeds": seeds, "unstable": den_ci is None or den_ci[0] <= 0 <= den_ci[1]}


# -- the lr optimum ------------------------------------------------------------------------------------


def optimum(lrs: list[float], losses: list) -> dict:
    """Where the loss is least over an lr grid.

    ``grid_lr``: the grid point of least loss (a diverged run, None / inf, counts as worst).
    ``censored``: ``"low"`` / ``"high"`` where that point is the grid's lowest / highest lr (the
    optimum may lie beyond it: the grid does not bracket it), else None. ``lr``: for a bracketed
    optimum whose two neighbours are finite, the vertex of the parabola in log(lr) through the
    three points (it lies between the neighbours); otherwise the grid point (``fitted`` False).
    """
    pts = sorted((float(lr), loss if _finite(loss) else math.inf) for lr, loss in zip(lrs, losses))
    out = {"lr": None, "grid_lr": None, "censored": None, "fitted": False, "trio": None}
    if not pts or all(math.isinf(v) for _, v in pts):
        return out
    i = min(range(len(pts)), key=lambda k: pts[k][1])
    out.update(lr=pts[i][0], grid_lr=pts[i][0])
    if i == 0 or i == len(pts) - 1:
        out["censored"] = "low" if i == 0 else "high"
        return out
    trio = pts[i - 1:i + 2]
    if any(math.isinf(v) for _, v in trio):
        return out
    x = np.log([lr for lr, _ in trio])
    a, b, _ = np.polyfit(x, [v for _, v in trio], 2)
    if a > 0:
        out.update(lr=float(np.exp(-b / (2 * a))), fitted=True, trio=[lr for lr, _ in trio])
    return out


def _vertex(grid: dict, seeds: list, confidence: float) -> dict:
    """:func:`optimum` of the mean losses, with Fieller's interval for the vertex in log(lr):
    the parabola through three points is linear in their losses, so each seed's fit gives
    (A_s, B_s) and the vertex ``-mean(B)/(2 mean(A))`` is a ratio of paired means."""
    lrs = sorted(grid)
    cube = np.array([[grid[lr][s] if _finite(grid[lr][s]) else math.inf for lr in lrs] for s in seeds], float)
    opt = optimum(lrs, list(cube.mean(axis=0)))
    opt["log_ci"] = None
    if opt["fitted"] and len(seeds) > 1:
        cols = [lrs.index(lr) for lr in opt["trio"]]
        x = np.log(opt["trio"])
        coef = np.linalg.solve(np.vander(x, 3), cube[:, cols].T)  # rows A, B, C; one column per seed
        v = fieller(list(-coef[1] / 2), list(coef[0]), confidence)
        opt["log_ci"] = v["ci"]
    return opt


def _exp(x: float) -> float:
    return math.exp(max(-700.0, min(700.0, x)))  # a vertex interval wider than any grid: no overflow


def lr_shift(base: dict, other: dict, confidence: float = CONFIDENCE) -> dict:
    """How far ``other``'s lr optimum sits from ``base``'s: ``{lr: {seed: loss}}`` each (e.g. sync
    and delayed; the two lr grids may differ). ``ratio``: the two :func:`optimum` lrs' ratio over
    the seeds every lr of both has. ``ci``: each vertex's Fieller interval in log(lr) at
    ``1 - (1 - confidence)/2`` (Bonferroni: both hold together with probability >= confidence),
    combined into ``[exp(lo_o - hi_b), exp(hi_o - lo_b)]``; None where either optimum is
    censored, not fitted, or its interval unbounded. ``censored``: either optimum at its grid's
    edge (``base`` / ``other`` say which side). ``grid``: the ratio of the two best grid points."""
    lrs = sorted(set(base) | set(other))
    sets = [set(g[lr]) for g in (base, other) for lr in g]
    seeds = sorted(set.intersection(*sets)) if sets else []
    empty = {"ratio": None, "ci": None, "grid": None, "base": None, "other": None, "censored": None, "seeds": []}
    if not seeds or not lrs:
        return empty
    level = 1 - (1 - confidence) / 2
    b, o = _vertex(base, seeds, level), _vertex(other, seeds, level)
    if b["lr"] is None or o["lr"] is None:
        return {**empty, "base": b, "other": o, "seeds": seeds}
    ci = None
    if b["log_ci"] is not None and o["log_ci"] is not None:
        ci = [_exp(o["log_ci"][0] - b["log_ci"][1]), _exp(o["log_ci"][1] - b["log_ci"][0])]
    return {"ratio": o["lr"] / b["lr"], "ci": ci, "grid": o["grid_lr"] / b["grid_lr"], "base": b, "other": o,
            "censored": bool(b["censored"] or o["censored"]), "seeds": seeds}
