"""The report's statistics: samples over seeds of its rows, paired differences, the t interval's
coverage under skew, and how an interval is written. Shared by every part of the report (findings,
protocol, delays, report); the sample summary (:func:`sample`) and the intervals themselves are
:mod:`delaylab.stats`'."""

from __future__ import annotations

import math

import numpy as np

from delaylab import stats
from delaylab.stats import sample

__all__ = ["sample"]  # the one summary of a sample, for the report's modules


def resolved(s: dict | None) -> bool:
    """A gap whose 95% interval over seeds excludes zero on the positive side (and that no divergence hides)."""
    return bool(s and s["ci"] is not None and s["diverged"] == 0 and s["ci"][0] > 0)


def by_seed(rows: list[dict], **match) -> dict[int, dict]:
    return {r["seed"]: r for r in rows if all(r[k] == v for k, v in match.items())}


def paired(a: dict[int, dict], b: dict[int, dict]) -> list:
    """Per-seed ``b - a``: two runs of one seed share init and batches."""
    out = []
    for s in sorted(set(a) & set(b)):
        x, y = a[s]["val_loss"], b[s]["val_loss"]
        out.append(None if x is None or y is None else y - x)
    return out


def diff(a: dict, b: dict) -> dict:
    """Per-seed ``a - b`` of two gap stats over the seeds both have (values are in seed order 0..)."""
    va, vb = a["values"], b["values"]
    return sample([None if x is None or y is None else x - y for x, y in zip(va, vb)])


def change(first: dict, second: dict) -> dict:
    """``second - first`` of two independent samples' means (:func:`sample` dicts), Welch's 95%
    interval, and its sign (0 where the interval holds 0, or a mean is missing). For two samples that
    share seeds use :func:`paired_change`."""
    if first.get("mean") is None or second.get("mean") is None:
        return {"delta": None, "ci": None, "sign": 0}
    ci = stats.welch_interval(first["values"], second["values"])
    sign = 0 if ci is None else 1 if ci[0] > 0 else -1 if ci[1] < 0 else 0
    return {"delta": second["mean"] - first["mean"], "ci": ci, "sign": sign}


def paired_change(first: list, first_seeds: list, second: list, second_seeds: list) -> dict:
    """``second - first`` per seed over the seeds both have (a seed fixes init and batch order, so two
    points of one model that share seeds are paired): the sample with its 95% t interval, and its
    sign (0 where the interval holds 0)."""
    a, b = dict(zip(first_seeds, first)), dict(zip(second_seeds, second))
    d = sample([None if a[s] is None or b[s] is None else b[s] - a[s] for s in sorted(set(a) & set(b))])
    ci = d["ci"]
    return {**d, "delta": d["mean"], "sign": 0 if ci is None else 1 if ci[0] > 0 else -1 if ci[1] < 0 else 0}


def seeds_of(folders: list[str]) -> list[int]:
    """The seeds of run folders named ``..._s<seed>``, in the folders' order."""
    return [int(f.rsplit("_s", 1)[1]) for f in folders]


def issues_of(rows) -> list[str]:
    return sorted({i for r in rows for i in r.get("issues", ())})


def fmt(x, spec="+.3f") -> str:
    return "n/a" if x is None else format(x, spec)


def ci_text(s: dict | None, spec="+.3f") -> str:
    """``[lo, hi]`` of a stats dict (``ci``) or a ratio's Fieller set (``set``); empty without one."""
    if not s:
        return ""
    if s.get("ci"):
        return f"[{format(s['ci'][0], spec)}, {format(s['ci'][1], spec)}]"
    if s.get("set"):
        return stats.fmt_set(s["set"], spec.lstrip("+"))
    return ""


def sort_key(x) -> float:
    """Sort key that puts a missing (diverged) value last."""
    return math.inf if x is None else x


def slope(xs: list[float], ys: list) -> float | None:
    pts = [(x, y) for x, y in zip(xs, ys) if y is not None and math.isfinite(y)]
    if len(pts) < 2:
        return None
    return float(np.polyfit([p[0] for p in pts], [p[1] for p in pts], 1)[0])


def t_coverage_at_skew(skew: float, n: int, reps: int = 40000, seed: int = 0) -> dict:
    """Monte Carlo coverage of the 95% t interval for a mean at ``n`` draws of the given skewness
    (:func:`delaylab.reproduce.coverage.t_mean`), and how often it lies wholly above
    (``miss_above``) or below (``miss_below``) the true mean, each 2.5% under normality."""
    from delaylab.reproduce.coverage import t_mean

    c = t_mean(n, skew, reps, np.random.default_rng(seed))
    return {"skew": skew, "n": n, "reps": reps, "coverage": c["coverage"], "miss_above": c["miss_low"],
            "miss_below": c["miss_high"]}


# -- the lr chosen on the seeds it is measured on (the winner's curse) ----------------------------


def best_index(losses: np.ndarray, chooser: np.ndarray) -> np.ndarray:
    """Index along axis -2 (the lrs) of the least mean loss over the seeds ``chooser`` marks (last
    axis, broadcast), vectorised. A missing run is NaN and left out of the mean; a diverged one is
    +inf and counts, so an lr where a chosen seed diverged is never best (the plan's rule,
    :func:`delaylab.reproduce.plan.adaptive_lrs`); an lr with no chosen seed is never best either."""
    v = np.asarray(losses, float)
    use = np.asarray(chooser, bool)[..., None, :] & ~np.isnan(v)
    count = use.sum(-1)
    with np.errstate(invalid="ignore"):
        total = np.where(use, v, 0.0).sum(-1)
        mean = np.where(count > 0, total / np.maximum(count, 1), np.inf)
    return np.nan_to_num(mean, nan=np.inf).argmin(-1)


def held_out_gaps(sync: np.ndarray, other: np.ndarray, base: np.ndarray, tune_other: bool = True) -> tuple:
    """Per seed ``other - sync`` with the lrs chosen on the seeds themselves (``in_sample``) and on
    the other seeds only (``held_out``: seed j's lrs are the best over ``base`` without j, so no
    seed is measured at an lr it helped choose), vectorised over leading axes.

    ``sync`` and ``other``: losses ``(..., lrs, seeds)`` on one lr axis (NaN: no run, +inf:
    diverged); ``base``: the seeds (bool, last axis) the lrs are chosen on; a seed outside it is
    held out by construction. ``tune_other``: ``other`` at its own best lr (else at sync's).
    Returns ``(in_sample, held_out, in_lrs, held_lrs)``: the values ``(..., seeds)`` (NaN where a
    seed has no run there, or, held out, no other base seed to choose on; inf where one diverged) and the lr indices ``(..., 2)`` and
    ``(..., seeds, 2)`` (sync's, other's)."""
    s, o = np.asarray(sync, float), np.asarray(other, float)
    base = np.asarray(base, bool)
    n = s.shape[-1]
    drop = base & ~np.eye(n, dtype=bool)  # row j: the base seeds without j
    ls, ls_j = best_index(s, base), best_index(s[..., None, :, :], drop)
    lo, lo_j = (best_index(o, base), best_index(o[..., None, :, :], drop)) if tune_other else (ls, ls_j)

    def at(v, idx):  # v[..., idx[..., j], j] per seed j
        return np.take_along_axis(v, idx[..., None, :], axis=-2)[..., 0, :]

    with np.errstate(invalid="ignore"):
        inside = at(o, np.repeat(lo[..., None], n, -1)) - at(s, np.repeat(ls[..., None], n, -1))
        held = np.where(drop.any(-1), at(o, lo_j) - at(s, ls_j), np.nan)  # no other seed to choose on: none
    return inside, held, np.stack([ls, lo], -1), np.stack([ls_j, lo_j], -1)


def tuned_values(sync: dict, other: dict, base=None, tune_other: bool = True) -> dict:
    """:func:`held_out_gaps` on ``{lr: {seed: loss}}`` grids (a None loss: diverged; ``base``: the
    seeds the lrs are chosen on, default every seed): ``sync_lr`` and ``lr`` chosen on ``base``,
    ``in_sample`` the gaps there over ``seeds`` (those with both runs), ``held_out`` each seed's gap
    at the lrs the other base seeds choose (``held_lrs``, over ``held_seeds``: those with both runs
    at their own lrs). Gaps are None where a run diverged."""
    lrs = sorted(set(sync) | set(other))
    seeds = sorted({k for g in (sync, other) for d in g.values() for k in d})
    out = {"sync_lr": None, "lr": None, "seeds": [], "in_sample": [], "held_seeds": [], "held_out": [],
           "held_lrs": []}
    if not sync or not other or not seeds:
        return out

    def cube(g):
        return np.array([[np.nan if s not in g.get(lr, {}) else np.inf if g[lr][s] is None else g[lr][s]
                          for s in seeds] for lr in lrs], float)

    chooser = np.isin(seeds, list(seeds if base is None else base))
    inside, held, il, hl = held_out_gaps(cube(sync), cube(other), chooser, tune_other)
    a, b = ([j for j in range(len(seeds)) if not np.isnan(x[j])] for x in (inside, held))

    def value(x):
        return None if np.isinf(x) else float(x)

    return {"sync_lr": lrs[il[0]], "lr": lrs[il[1]], "seeds": [seeds[j] for j in a],
            "in_sample": [value(inside[j]) for j in a], "held_seeds": [seeds[j] for j in b],
            "held_out": [value(held[j]) for j in b], "held_lrs": [[lrs[hl[j][0]], lrs[hl[j][1]]] for j in b]}


def by_lr(rows: list[dict], opt: str, mode: str, mom, seeds=None) -> dict[float, dict[int, float | None]]:
    """``{lr: {seed: val_loss}}`` of one optimizer's ``mode`` runs at momentum ``mom`` (``seeds``: only those)."""
    out: dict = {}
    for r in rows:
        if (r["optimizer"], r["mode"], r["momentum"]) == (opt, mode, mom) and (seeds is None or r["seed"] in seeds):
            out.setdefault(r["lr"], {})[r["seed"]] = r["val_loss"]
    return out


def skewness_check(rows: list[dict], opts, seeds: dict[str, set]) -> dict:
    """Each gap cell's (optimizer, momentum, lr, mode: mode - sync per seed, 4 or more seeds) sample
    skewness g1, flagged past 2 SDs of the normal null (sqrt(6(n-2)/((n+1)(n+3)))), and per optimizer
    the skewness behind its cells with g1's small-n bias accounted for
    (:func:`delaylab.reproduce.coverage.skewness`: ``size``, its one-sided 95% ``upper`` bound, the
    common-sign ``signed`` one), with the t interval's coverage at the size and at the bound
    (:func:`t_coverage_at_skew`, at the cells' median n). Cells that share a sync run are not
    independent: the bound is a guide, not a test."""
    from delaylab.reproduce.coverage import sample_skewness, skewness

    out = {}
    for opt in opts:
        cells = []
        for mom in sorted({r["momentum"] for r in rows if r["optimizer"] == opt}):
            sync = by_lr(rows, opt, "sync", mom, seeds[opt])
            for mode in sorted({r["mode"] for r in rows if r["optimizer"] == opt} - {"sync"}):
                other = by_lr(rows, opt, mode, mom, seeds[opt])
                for lr in sorted(set(sync) & set(other)):
                    g = [other[lr][s] - sync[lr][s] for s in sorted(set(sync[lr]) & set(other[lr]))
                         if sync[lr][s] is not None and other[lr][s] is not None]
                    if len(g) < 4 or np.std(g) == 0:
                        continue
                    n, g1 = len(g), float(sample_skewness(g))
                    sd = math.sqrt(6 * (n - 2) / ((n + 1) * (n + 3)))
                    cells.append({"momentum": mom, "mode": mode, "lr": lr, "n": n, "skew": g1, "null_sd": sd,
                                  "flagged": abs(g1) > 2 * sd})
        if not cells:
            continue
        est = skewness([(c["n"], c["skew"]) for c in cells])
        n = round(float(np.median([c["n"] for c in cells])))
        out[opt] = {"cells": cells, "mean_skew": est["raw_mean"], "estimate": est,
                    "coverage": t_coverage_at_skew(math.copysign(est["size"], est["raw_mean"]), n),
                    "coverage_upper": t_coverage_at_skew(math.copysign(est["upper"], est["raw_mean"]), n)}
    return out


def skew_text(check: dict) -> str:
    """One line per optimizer of :func:`skewness_check`."""
    parts = []
    for opt, c in check.items():
        e, cov, up = c["estimate"], c["coverage"], c["coverage_upper"]
        flagged = [f"{x['mode']} m{x['momentum']:g} lr {x['lr']:g} ({x['skew']:+.2f})" for x in c["cells"] if x["flagged"]]
        text = (f"{opt}: skewness of the per-seed gaps {e['size']:.2f} (one-sided 95% upper bound {e['upper']:.2f}) over "
                f"{e['cells']} cells, from their raw g1 (mean {e['raw_mean']:+.2f}; mean square {e['raw_mean_sq']:.2f} "
                f"against {e['null_mean_sq']:.2f} for normal gaps) with g1's bias at each cell's n accounted for; "
                f"the 95% t interval covers {100 * cov['coverage']:.1f}% at that skew and {100 * up['coverage']:.1f}% "
                f"at the bound (n = {cov['n']}, {cov['reps']} Monte Carlo draws), missing on one side up to "
                f"{100 * max(cov['miss_above'], cov['miss_below']):.1f}% (2.5% nominal)")
        parts.append(text + ("; cells past 2 null SDs: " + ", ".join(flagged) if flagged else ""))
    return "; ".join(parts)
