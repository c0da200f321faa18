"""How often the report's 95% intervals cover, simulated at the committed reports' seed counts and skew.

Every interval method the reports print is run here, through the library's own code, on samples
whose true value is known, at n = 3..10 seeds and at the skewness the committed per-seed values
show (:func:`measured`). Draws are standardized Gamma laws, reflected for a negative skew, normal at
0 (:func:`draw`). The measured skew is not the raw sample skewness g1: at 4-10 seeds g1 is biased
toward 0 (its size cannot exceed (n-2)/sqrt(n-1)), so :func:`skewness` inverts g1's simulated
moments at each cell's n instead. ``python -m delaylab.reproduce.coverage --out DIR [--page docs/intervals.md]``
writes ``DIR/coverage.json`` and ``DIR/coverage.md`` (and the table into the page).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from pathlib import Path

import numpy as np

from delaylab import stats as ST

NS = tuple(range(3, 11))  # the seed counts the committed reports have
FLOOR = 0.94  # a method covering less at a measured skew is labelled with its coverage
REPORTS = ("cpu-small", "cpu-quick", "cpu-delays", "cpu-tokens", "cpu-tokens-2")
GAMMAS = np.round(np.arange(0.0, 3.01, 0.1), 2)  # the skews g1's moments are simulated at
CAL_REPS = 10000


# -- skewed draws and the sample skewness ---------------------------------------------------------------


def draw(rng, skew: float, shape) -> np.ndarray:
    """Mean 0, variance 1: normal at skew 0, else a standardized Gamma(4 / skew^2) (skewness
    ``skew``; mirrored where negative)."""
    if abs(skew) < 1e-9:
        return rng.standard_normal(shape)
    k = 4.0 / skew ** 2
    return math.copysign(1.0, skew) * (rng.gamma(k, 1.0, shape) - k) / math.sqrt(k)


def sample_skewness(x) -> np.ndarray:
    """g1 = m3 / m2^1.5 along the last axis (the raw sample skewness; 0 where the values are equal)."""
    x = np.asarray(x, float)
    d = x - x.mean(-1, keepdims=True)
    m2, m3 = (d ** 2).mean(-1), (d ** 3).mean(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(m2 > 0, m3 / np.where(m2 > 0, m2, 1.0) ** 1.5, 0.0)


@functools.lru_cache(maxsize=None)
def g1_moments(n: int) -> dict:
    """g1's mean, mean square and the variance of its square at ``n`` draws, for each skew of
    ``GAMMAS``: a fixed-seed Monte Carlo of :data:`CAL_REPS` samples per skew, each curve smoothed by
    a quartic in the skew (the Monte-Carlo error is about 1% of the value) and made non-decreasing."""
    rng = np.random.default_rng(1000 + n)
    rows = [sample_skewness(draw(rng, float(g), (CAL_REPS, n))) for g in GAMMAS]

    def smooth(y):
        return np.maximum.accumulate(np.polyval(np.polyfit(GAMMAS, y, 4), GAMMAS))

    return {"mean": smooth([r.mean() for r in rows]), "sq": smooth([(r * r).mean() for r in rows]),
            "var_sq": smooth([(r * r).var() for r in rows])}


def _invert(target: float, curve: np.ndarray) -> tuple[float, bool]:
    """The skew of ``GAMMAS`` (linearly interpolated) where the increasing ``curve`` meets ``target``;
    clipped to the grid, with True where it was clipped at the top (the data ask for more)."""
    if target <= curve[0]:
        return 0.0, False
    if target >= curve[-1]:
        return float(GAMMAS[-1]), True
    i = int(np.searchsorted(curve, target))
    f = (target - curve[i - 1]) / (curve[i] - curve[i - 1])
    return float(GAMMAS[i - 1] + f * (GAMMAS[i] - GAMMAS[i - 1])), False


def skewness(cells, confidence: float = 0.95) -> dict | None:
    """The skewness behind cells of per-seed values, each given as ``(n, g1)`` (n >= 4 used: at 3 seeds
    g1 hardly moves with the skew), if every cell's values came from one Gamma law of skew gamma
    (up to sign):

    - ``size``: the gamma whose E[g1^2] at each cell's n, averaged over the cells, equals their mean
      g1^2 (0 where that is below the normal law's): the size of the skew, whatever its sign;
    - ``upper``: the gamma whose average E[g1^2] lies ``z`` standard errors (one-sided ``confidence``,
      the cells taken as independent: a guide, cells may share runs) above the observed mean g1^2;
    - ``signed``: the gamma whose average E[g1] equals the cells' mean g1 (one common sign).

    ``raw_mean``: the mean g1 itself, which at n = 5 reads a skew of 1 as about 0.4."""
    from scipy.stats import norm

    cells = [(int(n), float(g)) for n, g in cells if n >= 4 and g is not None and math.isfinite(g)]
    if not cells:
        return None
    tables = [g1_moments(n) for n, _ in cells]
    sq = np.mean([t["sq"] for t in tables], axis=0)
    mean = np.mean([t["mean"] for t in tables], axis=0)
    se_sq = np.sqrt(np.sum([t["var_sq"] for t in tables], axis=0)) / len(cells)
    obs_sq = float(np.mean([g * g for _, g in cells]))
    obs = float(np.mean([g for _, g in cells]))
    z = float(norm.ppf(confidence))
    size, _ = _invert(obs_sq, sq)
    upper, beyond = _invert(obs_sq, sq - z * se_sq)
    signed, _ = _invert(abs(obs), mean)
    return {"cells": len(cells), "n_median": float(np.median([n for n, _ in cells])), "raw_mean": obs,
            "raw_mean_sq": obs_sq, "null_mean_sq": float(sq[0]), "size": size, "upper": upper,
            "upper_beyond_grid": beyond, "signed": math.copysign(signed, obs), "confidence": confidence}


# -- the methods, each through the library's code ----------------------------------------------------


def _cell(covered, low_miss, high_miss, bounded=None) -> dict:
    """Coverage with its Monte-Carlo standard error, the miss on each side (the true value below the
    interval: ``miss_low``; above: ``miss_high``; 2.5% each under the nominal), the bounded share."""
    covered = np.asarray(covered, bool)
    reps = covered.size
    p = float(covered.mean())
    out = {"coverage": p, "se": math.sqrt(max(p * (1 - p), 1e-12) / reps), "reps": reps,
           "miss_low": float(np.mean(low_miss)), "miss_high": float(np.mean(high_miss))}
    if bounded is not None:
        out["bounded"] = float(np.mean(bounded))
    return out


def t_mean(n: int, skew: float, reps: int, rng, **_) -> dict:
    """Student-t of a mean of per-seed values (:func:`delaylab.stats.t_bounds`): a gap, a
    difference of gaps, an overhead, a change paired by seed."""
    lo, hi = ST.t_bounds(draw(rng, skew, (reps, n)))
    return _cell((lo <= 0) & (0 <= hi), lo > 0, hi < 0)


def welch(n: int, skew: float, reps: int, rng, ratio: float = 3.0, rho: float = 0.0, **_) -> dict:
    """Welch's interval of a difference of two means (:func:`delaylab.stats.welch_bounds`), the
    second sample's variance ``ratio`` times the first's; ``rho``: the correlation two samples of
    the same seeds have (Welch assumes 0)."""
    a = draw(rng, skew, (reps, n))
    b = math.sqrt(ratio) * (rho * a + math.sqrt(1 - rho * rho) * draw(rng, skew, (reps, n)))
    lo, hi = ST.welch_bounds(a, b)
    return _cell((lo <= 0) & (0 <= hi), lo > 0, hi < 0)


def fieller(n: int, skew: float, reps: int, rng, snr: float = 3.0, ratio: float = 0.4, **_) -> dict:
    """Fieller's set for a ratio of paired means (:func:`delaylab.stats.fieller_bounds`): the
    denominator a gap with mean / SD = ``snr`` per seed, the numerator ``ratio`` times it plus
    noise of half its SD. An unbounded set covers (and says nothing: ``bounded``)."""
    den = snr + draw(rng, skew, (reps, n))
    num = ratio * den + 0.5 * draw(rng, skew, (reps, n))
    lo, hi, kind = ST.fieller_bounds(num, den)
    inside = np.where(kind == 0, (lo <= ratio) & (ratio <= hi),
                      np.where(kind == 1, (ratio <= lo) | (ratio >= hi), True))
    return _cell(inside, (kind == 0) & (ratio < lo), (kind == 0) & (ratio > hi), kind == 0)


LRS = tuple(1e-3 * 2 ** k for k in range(5))


def lr_shift(n: int, skew: float, reps: int, rng, **_) -> dict:
    """Fieller's vertex intervals at 97.5%, combined by Bonferroni, for the shift of an lr optimum
    (:func:`delaylab.llm.metrics.lr_shift`): losses on a parabola in log(lr), the delayed optimum at
    0.6x the sync one; a censored or unbounded answer covers (``bounded`` says how often)."""
    from delaylab.llm import metrics

    x = np.log(LRS)
    star_s, star_d = math.log(4e-3), math.log(0.6 * 4e-3)
    noise = 0.01 * draw(rng, skew, (reps, 2, n, len(LRS)))
    sync = 2.0 + 0.1 * (x - star_s) ** 2 + noise[:, 0]
    delayed = 2.3 + 0.1 * (x - star_d) ** 2 + noise[:, 1]
    hit, low, high, bounded = [], [], [], []
    for k in range(reps):
        ci = metrics.lr_shift({lr: dict(enumerate(sync[k, :, i])) for i, lr in enumerate(LRS)},
                              {lr: dict(enumerate(delayed[k, :, i])) for i, lr in enumerate(LRS)})["ci"]
        hit.append(ci is None or ci[0] <= 0.6 <= ci[1])
        low.append(ci is not None and ci[0] > 0.6)
        high.append(ci is not None and ci[1] < 0.6)
        bounded.append(ci is not None)
    return _cell(hit, low, high, bounded)


def tuned(n: int, skew: float, reps: int, rng, held: bool = True, sync_step: float = 1.0, delayed_step: float = 0.25,
          rho: float = 0.5, **_) -> dict:
    """The gap with each mode at its own best lr (:func:`delaylab.reproduce.stats.held_out_gaps`),
    chosen on the same seeds (``held`` False) or each seed's on the other seeds (True). Five lrs,
    each mode's loss a parabola over them: sync's neighbours of its optimum ``sync_step`` per-seed
    SDs above it, the delayed mode's two best lrs tied (its optimum between them, the next ones
    ``delayed_step`` SDs up), where the least mean of the seeds is most often a lucky one; per seed
    a shared offset (correlation ``rho`` between cells) plus skewed noise. The true value is the
    gap at the lrs chosen: in sample, the true gap at the pair chosen; held out, the mean over the
    seeds of the true gap at each seed's own pair. The Student-t interval of the per-seed gaps."""
    from delaylab.reproduce.stats import held_out_gaps

    k = np.arange(5) - 2.0
    true_s = sync_step * k ** 2
    true_d = 1.0 + delayed_step * ((k + 0.5) ** 2 - 0.25) / 2
    shared = math.sqrt(rho) * draw(rng, skew, (reps, 1, n))
    sync = true_s[:, None] + shared + math.sqrt(1 - rho) * draw(rng, skew, (reps, 5, n))
    delayed = true_d[:, None] + shared + math.sqrt(1 - rho) * draw(rng, skew, (reps, 5, n))
    inside, out, il, hl = held_out_gaps(sync, delayed, np.ones(n, bool))
    if held:
        values, truth = out, (true_d[hl[..., 1]] - true_s[hl[..., 0]]).mean(-1)
    else:
        values, truth = inside, true_d[il[..., 1]] - true_s[il[..., 0]]
    lo, hi = ST.t_bounds(values)
    return _cell((lo <= truth) & (truth <= hi), lo > truth, hi < truth)


# Each row: what the reports print, the function and its arguments, and which measured skew it is drawn at.
METHODS = (
    {"key": "t-gap", "method": "Student-t", "use": "a gap (delayed - sync, paired by seed) or a change paired by seed",
     "fn": t_mean, "skew": "gap", "kwargs": {}, "reps": 20000},
    {"key": "t-difference", "method": "Student-t", "use": "the difference of two optimizers' gaps, per seed",
     "fn": t_mean, "skew": "gap difference", "kwargs": {}, "reps": 20000},
    {"key": "t-overhead", "method": "Student-t", "use": "the iso-loss token overhead, per seed",
     "fn": t_mean, "skew": "overhead", "kwargs": {}, "reps": 20000},
    {"key": "welch", "method": "Welch", "use": "a change between two settings, independent seeds (variance 1:3)",
     "fn": welch, "skew": "gap", "kwargs": {}, "reps": 20000},
    {"key": "welch-shared", "method": "Welch", "use": "the same on shared seeds (correlation 0.5; a paired "
     "interval applies)", "fn": welch, "skew": "gap", "kwargs": {"rho": 0.5}, "reps": 20000},
    {"key": "fieller", "method": "Fieller", "use": "a recovered share or a gap ratio (paired means)",
     "fn": fieller, "skew": "gap", "kwargs": {}, "reps": 20000},
    {"key": "lr-shift", "method": "Fieller + Bonferroni", "use": "the shift of an lr optimum",
     "fn": lr_shift, "skew": "gap", "kwargs": {}, "reps": 1000},
    {"key": "tuned-in-sample", "method": "Student-t", "use": "a tuned gap, lrs chosen on the same seeds",
     "fn": tuned, "skew": "gap", "kwargs": {"held": False}, "reps": 20000},
    {"key": "tuned-held-out", "method": "Student-t", "use": "a tuned gap, each seed at the lrs the other seeds "
     "chose (held out)", "fn": tuned, "skew": "gap", "kwargs": {"held": True}, "reps": 20000},
)


# -- the committed data's skew ---------------------------------------------------------------------------

# a GPT run's configuration: two runs with the same one and seed share init and batches
CONFIG = ("report_preset", "optimizer", "lr", "momentum", "preset", "n_layer", "steps", "batch_size", "block_size",
          "warmup", "lr_schedule")
TREATMENT = ("mode", "correction", "delay", "delay_dist", "dc_lambda", "sync_start", "sync_cooldown")


def gap_cells(lines: list[dict]) -> list[dict]:
    """Every gap cell of a ``runs.jsonl``: each non-sync treatment against the sync run of the same
    configuration and seed, ``{"config", "treatment", "gaps": {seed: gap}}`` (finite gaps only)."""
    sync, other = {}, {}
    for r in lines:
        if r.get("kind") != "gpt" or r.get("val_loss") is None or not math.isfinite(r["val_loss"]):
            continue
        config = tuple(json.dumps(r.get(k)) for k in CONFIG)
        plain = r["mode"] == "sync" and not r.get("sync_start") and not r.get("sync_cooldown")
        if plain:
            sync.setdefault(config, {})[r["seed"]] = r["val_loss"]
        else:
            other.setdefault((config, tuple(json.dumps(r.get(k)) for k in TREATMENT)), {})[r["seed"]] = r["val_loss"]
    cells = []
    for (config, treat), runs in sorted(other.items(), key=lambda kv: repr(kv[0])):
        base = sync.get(config, {})
        gaps = {s: runs[s] - base[s] for s in sorted(set(runs) & set(base))}
        if gaps:
            cells.append({"config": config, "treatment": treat, "gaps": gaps})
    return cells


def _g1_cells(samples) -> list[tuple[int, float]]:
    return [(len(v), float(sample_skewness(v))) for v in (np.asarray(list(s), float) for s in samples)
            if len(v) >= 4 and np.std(v) > 0]


def difference_cells(cells: list[dict]) -> list[list[float]]:
    """Per-seed differences of two gap cells of one report, treatment and model that differ in the
    optimizer (every lr pair: the report compares optimizers at several), four seeds or more."""
    out = []
    for i, a in enumerate(cells):
        for b in cells[i + 1:]:
            ca, cb = a["config"], b["config"]
            same = ca[0] == cb[0] and ca[1] != cb[1] and ca[4:] == cb[4:] and a["treatment"] == b["treatment"]
            common = sorted(set(a["gaps"]) & set(b["gaps"]))
            if same and len(common) >= 4:
                out.append([a["gaps"][s] - b["gaps"][s] for s in common])
    return out


def overhead_samples(report: dict) -> list[list[float]]:
    """Every iso-loss overhead over seeds a report.json keeps where every seed reached the target."""
    out, seen = [], set()

    def walk(x):
        if isinstance(x, dict):
            if "n_reached" in x and isinstance(x.get("values"), list):
                v = x["values"]
                if v and None not in v and x["n_reached"] == len(v) and tuple(v) not in seen:
                    seen.add(tuple(v))
                    out.append(v)
            for y in x.values():
                walk(y)
        elif isinstance(x, list):
            for y in x:
                walk(y)

    walk(report)
    return out


def measured(root: Path, reports=REPORTS) -> dict:
    """The skew of each kind of per-seed value in the committed reports under ``root``
    (docs/reproduce): ``skew`` (``{kind: skewness(...)}`` pooled over the reports; the gaps' also per
    report, ``gap_by_report``), and the Fieller rows' denominator mean / SD (``snr``: the median
    over the gap cells of four seeds or more)."""
    gaps, diffs, overheads, snr, per_report = [], [], [], [], {}
    for name in reports:
        folder = root / name
        lines = [json.loads(x) for x in (folder / "runs.jsonl").read_text().splitlines() if x.strip()]
        cells = gap_cells(lines)
        mine = _g1_cells(c["gaps"].values() for c in cells)
        per_report[name] = skewness(mine)
        gaps += mine
        diffs += _g1_cells(difference_cells(cells))
        overheads += _g1_cells(overhead_samples(json.loads((folder / "report.json").read_text())))
        for c in cells:
            v = np.asarray(list(c["gaps"].values()))
            if len(v) >= 4 and v.std(ddof=1) > 0:
                snr.append(abs(v.mean()) / v.std(ddof=1))
    out = {kind: skewness(c) for kind, c in (("gap", gaps), ("gap difference", diffs), ("overhead", overheads))}
    return {"skew": out, "snr": float(np.median(snr)), "reports": list(reports), "gap_by_report": per_report}


# -- one report's intervals and its verdict family ------------------------------------------------------


def _span(cells: dict) -> str:
    vals = [100 * c["coverage"] for c in cells.values()]
    lo, hi = min(vals), max(vals)
    return f"{lo:.1f}%" if round(lo, 1) == round(hi, 1) else f"{lo:.1f}-{hi:.1f}%"


# the methods a report's paragraph gives its coverage for: (key, name, function, keyword arguments)
REPORT_METHODS = (("t", "Student-t", t_mean, {}), ("fieller", "Fieller", fieller, {}),
                  ("tuned", "Student-t of a gap tuned on its own seeds (two best lrs tied)", tuned, {"held": False}))


def report_intervals(lines: list[dict], reps: int = 10000, seed: int = 0) -> dict:
    """The coverage of a report's intervals at its own per-seed gaps' skew and seed counts:
    ``skew`` (:func:`skewness` of its gap cells; None where no cell has 4 seeds, and the normal law
    is then assumed and said so), ``ns`` (its gap cells' seed counts), per method of
    :data:`REPORT_METHODS` the simulated cells at the measured size (``cells[key]``) and at its upper
    bound (``upper_cells[key]``); ``side``: the largest miss on one side and ``least``: the least
    coverage, both at the measured size."""
    cells = gap_cells(lines)
    ns = sorted({len(c["gaps"]) for c in cells if len(c["gaps"]) >= 2})
    out = {"skew": None, "ns": ns, "snr": None, "at": 0.0, "upper": None, "cells": {}, "upper_cells": {}}
    if not ns:
        return out
    skew = skewness(_g1_cells(c["gaps"].values() for c in cells))
    snr = [abs(np.mean(v)) / np.std(v, ddof=1) for v in (list(c["gaps"].values()) for c in cells)
           if len(v) >= 4 and np.std(v) > 0]
    out.update(skew=skew, snr=float(np.median(snr)) if snr else 3.0, at=0.0 if skew is None else round(skew["size"], 2),
               upper=None if skew is None else round(skew["upper"], 2))
    for k, (key, _, fn, kw) in enumerate(REPORT_METHODS):
        kw = dict(kw, snr=out["snr"])
        out["cells"][key] = {str(n): fn(n, out["at"], reps, np.random.default_rng([seed, n, k]), **kw) for n in ns}
        if skew is not None:
            out["upper_cells"][key] = {str(n): fn(n, out["upper"], reps, np.random.default_rng([seed, n, k, 1]), **kw)
                                       for n in ns}
    every = [c for m in out["cells"].values() for c in m.values()]
    out["side"] = max(max(c["miss_low"], c["miss_high"]) for c in every)
    out["least"] = min(c["coverage"] for c in every)
    return out


def intervals_text(block: dict | None) -> str:
    """One paragraph: the report's measured skew and what its 95% intervals cover there."""
    if not block or not block.get("ns"):
        return ""
    ns = ", ".join(str(n) for n in block["ns"])
    sk = block["skew"]
    if sk is None:
        head = ("Coverage: the per-seed gaps' skew cannot be measured here (no gap cell has 4 seeds); if they are "
                f"normal, the 95% intervals cover, simulated at this report's seed counts ({ns})")
    else:
        head = (f"Coverage: this report's per-seed gaps have skewness {sk['size']:.2f} (from the raw g1 of "
                f"{sk['cells']} cells of 4 or more seeds, its bias at each cell's n accounted for; one-sided 95% "
                f"upper bound {sk['upper']:.2f}); at that skew and this report's seed counts ({ns}) the 95% "
                "intervals cover, simulated")
    names = {key: name for key, name, _, _ in REPORT_METHODS}
    text = f"{head}: " + ", ".join(f"{names[k]} {_span(c)}" for k, c in block["cells"].items())
    if sk is not None:
        text += f" (at {block['upper']:.2f}: " + ", ".join(_span(c) for c in block["upper_cells"].values()) + ")"
    if block["least"] < FLOOR:
        text += (f". That is under the 94% asked of a 95% interval: read the intervals of this report as "
                 f"{100 * block['least']:.0f}% ones")
    return text + ". Every method at n = 3-10: the coverage table of docs/intervals.md."


def multiplicity(parts: list[dict], block: dict | None) -> dict:
    """How many of a report's scored states chance alone could have made: a false "agrees" needs
    the interval wholly on one side of the true value (at most ``side`` of the time, the report's
    largest one-sided miss; 2.5% nominal), a false "disagrees" the interval missing it (at most
    ``miss``, 1 - the least coverage). With ``m`` scored claims (the paper's and the theory's),
    at most ``m * side`` false agrees and ``m * miss`` false disagrees are expected."""
    states = [v["state"] for p in parts for v in p.get("verdicts", []) if v.get("state")]
    states += [n["state"] for p in parts for n in p.get("theory_numbers", []) if n.get("state")]
    side = max(0.025, (block or {}).get("side", 0.025))
    miss = max(0.05, 1 - (block or {}).get("least", 0.95))
    m = len(states)
    return {"scored": m, "agrees": states.count("agrees"), "disagrees": states.count("disagrees"),
            "side": side, "miss": miss, "false_agrees": m * side, "false_disagrees": m * miss}


def multiplicity_text(mult: dict | None) -> str:
    """The family-wise line printed under a report's summary."""
    if not mult or not mult["scored"]:
        return ""
    return (f"Multiplicity: {mult['scored']} scored claims (paper and theory), {mult['agrees']} agree and "
            f"{mult['disagrees']} disagree. A 95% interval lies wholly on one side of the true value at most "
            f"{100 * mult['side']:.1f}% of the time (2.5% nominal) and misses it at most {100 * mult['miss']:.1f}% "
            f"(5% nominal) at this report's skew, so chance alone is expected to make at most "
            f"{mult['false_agrees']:.1f} of the agrees and {mult['false_disagrees']:.1f} of the disagrees wrong.")


# -- the table -------------------------------------------------------------------------------------------


def levels(m: dict | None) -> list[tuple[str, float]]:
    """The skews a row is drawn at: normal, the measured size and its upper bound."""
    if m is None:
        return [("normal", 0.0)]
    return [("normal", 0.0), ("measured", round(m["size"], 2)), ("upper bound", round(m["upper"], 2))]


def table(data: dict, reps_scale: float = 1.0, ns=NS, seed: int = 0, methods=METHODS, progress=None) -> dict:
    """Coverage of every method of ``methods`` at every n of ``ns`` and each skew of :func:`levels` of its
    measured kind (``data``: :func:`measured`). ``reps_scale`` scales each method's draws."""
    rows = []
    for m in methods:
        for label, skew in levels(data["skew"].get(m["skew"])):
            cells = {}
            for n in ns:
                rng = np.random.default_rng([seed, n, int(round(100 * skew)), len(rows)])
                kw = dict(m["kwargs"], **({"snr": data["snr"]} if m["fn"] is fieller else {}))
                cells[str(n)] = m["fn"](n, skew, max(100, int(m["reps"] * reps_scale)), rng, **kw)
            row = {"key": m["key"], "method": m["method"], "use": m["use"], "skew_kind": m["skew"],
                   "skew_label": label, "skew": skew, "cells": cells}
            rows.append(row)
            if progress:
                progress(row)
    return {"confidence": ST.CONFIDENCE, "floor": FLOOR, "ns": list(ns), "seed": seed, "reps_scale": reps_scale,
            "measured": data, "rows": rows, "holds": holds(rows)}


def holds(rows: list[dict]) -> dict:
    """Per method: its least coverage over n at the measured skew (normal where none is measured),
    and whether it reaches :data:`FLOOR` within two Monte-Carlo standard errors (else the reports
    label its intervals with their coverage)."""
    out = {}
    for key in dict.fromkeys(r["key"] for r in rows):
        mine = [r for r in rows if r["key"] == key]
        row = next((r for r in mine if r["skew_label"] == "measured"), mine[0])
        worst = min(row["cells"].values(), key=lambda c: c["coverage"])
        out[key] = {"skew": row["skew"], "least": worst["coverage"], "se": worst["se"],
                    "holds": worst["coverage"] + 2 * worst["se"] >= FLOOR}
    return out


def _pct(c: dict) -> str:
    text = f"{100 * c['coverage']:.1f} ± {100 * c['se']:.1f}"
    bounded = c.get("bounded", 1.0)
    return text if bounded == 1.0 else text + f" ({math.floor(100 * bounded)}% bounded)"


def markdown(result: dict) -> str:
    """The coverage table (percent ± one Monte-Carlo standard error) and the measured skews."""
    ns = result["ns"]
    lines = ["| method | what it is used for | skew | " + " | ".join(f"n = {n}" for n in ns) + " |",
             "|" + "---|" * (3 + len(ns))]
    for r in result["rows"]:
        skew = "0 (normal)" if r["skew_label"] == "normal" else f"{r['skew']:.2f} ({r['skew_label']}, {r['skew_kind']})"
        lines.append(f"| {r['method']} | {r['use']} | {skew} | " + " | ".join(_pct(r["cells"][str(n)]) for n in ns)
                     + " |")
    lines += ["", "| per-seed values | cells (n >= 4) | mean raw g1 | mean raw g1^2 (normal: E) | skew size "
                  "(bias-corrected) | one-sided 95% upper bound |", "|---|---|---|---|---|---|"]
    for kind, m in result["measured"]["skew"].items():
        if m is None:
            lines.append(f"| {kind} | 0 | - | - | - | - |")
            continue
        up = f"{m['upper']:.2f}" + (" (or more)" if m["upper_beyond_grid"] else "")
        lines.append(f"| {kind} | {m['cells']} | {m['raw_mean']:+.2f} | {m['raw_mean_sq']:.3f} ({m['null_mean_sq']:.3f}) "
                     f"| {m['size']:.2f} | {up} |")
    for name, m in result["measured"].get("gap_by_report", {}).items():
        if m is None:
            lines.append(f"| gap, {name} only | 0 | - | - | not measurable (3 seeds) | - |")
        else:
            lines.append(f"| gap, {name} only | {m['cells']} | {m['raw_mean']:+.2f} | {m['raw_mean_sq']:.3f} "
                         f"({m['null_mean_sq']:.3f}) | {m['size']:.2f} | {m['upper']:.2f} |")
    lines += ["", "| method | least coverage over n = 3-10 at the measured skew | >= 94% |", "|---|---|---|"]
    for key, h in result["holds"].items():
        row = next(r for r in result["rows"] if r["key"] == key)
        lines.append(f"| {row['method']}: {row['use']} | {100 * h['least']:.1f} ± {100 * h['se']:.1f} "
                     f"(skew {h['skew']:.2f}) | {'yes' if h['holds'] else 'no'} |")
    return "\n".join(lines) + "\n"


PAGE_MARKERS = ("<!-- coverage table: python -m delaylab.reproduce.coverage --out docs/intervals "
                "--page docs/intervals.md -->", "<!-- end of coverage table -->")


def write_page(page: Path, result: dict) -> None:
    """Put :func:`markdown` of ``result`` between the page's two :data:`PAGE_MARKERS`."""
    text = page.read_text()
    start, end = PAGE_MARKERS
    if start not in text or end not in text:
        raise ValueError(f"{page} has no coverage-table markers")
    head, rest = text.split(start, 1)
    page.write_text(head + start + "\n" + markdown(result) + end + rest.split(end, 1)[1])


def main(argv=None) -> int:
    from delaylab._io import write_json

    ap = argparse.ArgumentParser(prog="python -m delaylab.reproduce.coverage",
                                 description="Simulate the coverage of every 95%% interval method the reports "
                                             "use at n = 3..10 seeds and at the skew the committed per-seed values "
                                             "show; write OUT/coverage.json and OUT/coverage.md.")
    ap.add_argument("--out", required=True, metavar="DIR", help="folder for coverage.json and coverage.md")
    ap.add_argument("--reports", default="docs/reproduce", metavar="DIR",
                    help="the committed reports whose skew is measured (default docs/reproduce)")
    ap.add_argument("--reps-scale", type=float, default=1.0,
                    help="scale every method's Monte-Carlo draws (default 1: 20000, 1000 for the lr shift)")
    ap.add_argument("--seed", type=int, default=0, help="the simulation's seed (default 0)")
    ap.add_argument("--page", metavar="FILE",
                    help="also write the table into FILE between its coverage-table markers (docs/intervals.md)")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = ap.parse_args(argv)
    root = Path(args.reports)
    missing = [r for r in REPORTS if not (root / r / "runs.jsonl").is_file()]
    if missing or not args.reps_scale > 0:
        print(f"error: {'--reps-scale must be > 0' if missing == [] else f'no runs.jsonl under {root}/{missing[0]}'}",
              file=sys.stderr)
        return 2

    def progress(row):
        print(f"  {row['key']} at skew {row['skew']:.2f}: done", file=sys.stderr, flush=True)

    result = table(measured(root), args.reps_scale, seed=args.seed, progress=progress)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "coverage.json", result)
    (out / "coverage.md").write_text(markdown(result))
    if args.page:
        write_page(Path(args.page), result)
    print(json.dumps(result) if args.json else markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
