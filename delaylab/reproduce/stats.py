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
    """Monte Carlo coverage of the 95% t interval for a mean at ``n`` draws from a gamma law with the
    given skewness (reflected where it is negative; normal at 0), and how often it misses on each side
    (each 2.5% under normality): the coverage a measured skew implies."""
    from scipy import stats as st

    rng = np.random.default_rng(seed)
    if abs(skew) < 1e-9:
        x = rng.standard_normal((reps, n))
    else:
        k = 4.0 / skew**2  # gamma(k) has skewness 2 / sqrt(k); standardized, mean 0
        x = np.sign(skew) * (rng.gamma(k, 1.0, (reps, n)) - k) / math.sqrt(k)
    m, h = x.mean(1), st.t.ppf(0.975, n - 1) * x.std(1, ddof=1) / math.sqrt(n)
    low, high = float(np.mean(m - h > 0)), float(np.mean(m + h < 0))  # the interval lies above / below 0
    return {"skew": skew, "n": n, "reps": reps, "coverage": 1 - low - high, "miss_above": low, "miss_below": high}


def by_lr(rows: list[dict], opt: str, mode: str, mom, seeds=None) -> dict[float, dict[int, float | None]]:
    """``{lr: {seed: val_loss}}`` of one optimizer's ``mode`` runs at momentum ``mom`` (``seeds``: only those)."""
    out: dict = {}
    for r in rows:
        if (r["optimizer"], r["mode"], r["momentum"]) == (opt, mode, mom) and (seeds is None or r["seed"] in seeds):
            out.setdefault(r["lr"], {})[r["seed"]] = r["val_loss"]
    return out


def skewness_check(rows: list[dict], opts, seeds: dict[str, set]) -> dict:
    """Each gap cell's (optimizer, momentum, lr, mode: mode - sync per seed, 4 or more seeds) sample
    skewness g1 against the normal null (SD sqrt(6(n-2)/((n+1)(n+3)))), and per optimizer the mean over
    its cells against the null's SD of that mean: where the mean is more than 2 null SDs from 0 the
    t intervals' coverage is in doubt, and the coverage at that skew (:func:`t_coverage_at_skew`) is given.
    Cells that share a sync run are not independent: the pooled SD is a guide, not a test."""
    from scipy import stats as st

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
                    n, g1 = len(g), float(st.skew(g, bias=True))
                    sd = math.sqrt(6 * (n - 2) / ((n + 1) * (n + 3)))
                    cells.append({"momentum": mom, "mode": mode, "lr": lr, "n": n, "skew": g1, "null_sd": sd,
                                  "flagged": abs(g1) > 2 * sd})
        if not cells:
            continue
        mean = float(np.mean([c["skew"] for c in cells]))
        sd = math.sqrt(sum(c["null_sd"] ** 2 for c in cells)) / len(cells)
        doubt = abs(mean) > 2 * sd
        n = round(float(np.median([c["n"] for c in cells])))
        out[opt] = {"cells": cells, "mean_skew": mean, "null_sd": sd, "doubt": doubt,
                    "coverage": t_coverage_at_skew(mean, n) if doubt else None}
    return out


def skew_text(check: dict) -> str:
    """One line per optimizer of :func:`skewness_check`."""
    parts = []
    for opt, c in check.items():
        flagged = [f"{x['mode']} m{x['momentum']:g} lr {x['lr']:g} ({x['skew']:+.2f})" for x in c["cells"] if x["flagged"]]
        text = (f"{opt}: mean skewness of the per-seed gaps {c['mean_skew']:+.2f} over {len(c['cells'])} cells "
                f"(normal null SD {c['null_sd']:.2f})")
        if c["doubt"]:
            cov = c["coverage"]
            text += (f", resolved from 0: the 95% t interval covers {100 * cov['coverage']:.1f}% at that skew "
                     f"(n = {cov['n']}, {cov['reps']} Monte Carlo draws), missing above {100 * cov['miss_above']:.1f}%"
                     f" and below {100 * cov['miss_below']:.1f}%")
        else:
            text += ", not resolved from 0"
        parts.append(text + ("; cells past 2 null SDs: " + ", ".join(flagged) if flagged else ""))
    return "; ".join(parts)
