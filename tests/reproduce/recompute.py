"""Recompute the report's headline numbers from ``runs.jsonl`` alone: plain Python, no delaylab.

Each line of runs.jsonl is one GPT run (``kind: gpt``: optimizer, mode, lr, momentum, seed, variant,
val_loss, val_curve, ...) or one toy rate check (``kind: toy``). The rules written out here are the
report's, from its own text (docs/reproduction.md): the best lr of a grid is the lowest mean final
val loss over the seeds every lr of the grid has; a gap is delayed - sync paired by seed; a mean's
95% interval is Student's t; a ratio of paired means has Fieller's interval; EF's recovery is
100 (1 - mean EF gap / mean delayed gap). The only import beyond the standard library is scipy's
Student-t quantile.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from scipy.stats import t as _student


def load(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def select(runs, **match) -> list[dict]:
    return [r for r in runs if r.get("kind", "gpt") == "gpt" and all(r.get(k) == v for k, v in match.items())]


def by_seed(runs, **match) -> dict[int, float | None]:
    return {r["seed"]: r["val_loss"] for r in select(runs, **match)}


def mean(xs):
    return sum(xs) / len(xs)


def t_interval(xs):
    n = len(xs)
    m = mean(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    h = _student.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return m, [m - h, m + h]


def fieller(num, den):
    """mean(num) / mean(den) and Fieller's 95% interval (None where the set is unbounded)."""
    return mean(num) / mean(den), fieller_at(num, den, 0.95)


def _grid(runs, optimizer, mode, momentum, variant="main"):
    """``({lr: {seed: final val loss}}, the seeds every lr has)`` of one lr grid (a diverged run: inf)."""
    grid: dict[float, dict[int, float]] = {}
    for r in select(runs, optimizer=optimizer, mode=mode, momentum=momentum, variant=variant):
        grid.setdefault(r["lr"], {})[r["seed"]] = math.inf if r["val_loss"] is None else r["val_loss"]
    return grid, sorted(set.intersection(*(set(v) for v in grid.values())))


def best_lr(runs, optimizer, mode, momentum, variant="main"):
    """The lr of least mean val loss over the seeds every lr of this grid has (the grid's base seeds)."""
    grid, seeds = _grid(runs, optimizer, mode, momentum, variant)
    return min(grid, key=lambda lr: mean([grid[lr][s] for s in seeds]))


def gaps(runs, optimizer, lr, momentum, mode="delayed", sync_lr=None, variant="main") -> dict[int, float]:
    """Per seed: ``mode`` at ``lr`` minus sync at ``sync_lr`` (default the same lr)."""
    sync = by_seed(runs, optimizer=optimizer, mode="sync", lr=sync_lr or lr, momentum=momentum, variant=variant)
    other = by_seed(runs, optimizer=optimizer, mode=mode, lr=lr, momentum=momentum, variant=variant)
    return {s: other[s] - sync[s] for s in sorted(set(sync) & set(other))}


def gap_at_best_sync_lr(runs, optimizer, momentum):
    """Finding 1's gap: mean and t interval over the cell's seeds at the best sync lr."""
    lr = best_lr(runs, optimizer, "sync", momentum)
    return t_interval(list(gaps(runs, optimizer, lr, momentum).values()))


def ef_recovery(runs, optimizer, momentum, tuned=False):
    """EF's recovered share (%) and its Fieller interval; ``tuned``: each mode at its own best lr."""
    sync_lr = best_lr(runs, optimizer, "sync", momentum)
    d_lr = best_lr(runs, optimizer, "delayed", momentum) if tuned else sync_lr
    e_lr = best_lr(runs, optimizer, "ef", momentum) if tuned else sync_lr
    if tuned:  # the lrs are decided on the grids' base seeds; the gaps pair the seeds the lrs share
        base = set.intersection(*(set(by_seed(runs, optimizer=optimizer, mode=m, lr=lr, momentum=momentum,
                                               variant="main"))
                                  for m, lr in (("sync", sync_lr), ("delayed", d_lr), ("ef", e_lr))))
    g = gaps(runs, optimizer, d_lr, momentum, "delayed", sync_lr)
    e = gaps(runs, optimizer, e_lr, momentum, "ef", sync_lr)
    if tuned:
        e = {s: v for s, v in e.items() if s in base}
    return recovered(e, g)


def paired_ratio(num: dict[int, float], den: dict[int, float]):
    """mean(num) / mean(den) over the seeds both have, and Fieller's interval (None where unbounded)."""
    seeds = sorted(set(num) & set(den))
    return fieller([num[s] for s in seeds], [den[s] for s in seeds])


def recovered(fixed: dict[int, float], plain: dict[int, float]):
    """The share (%) of the plain gaps a fix recovers, 100 (1 - mean fixed / mean plain) over the
    seeds both have, and its Fieller interval (None where unbounded)."""
    ratio, ci = paired_ratio(fixed, plain)
    return 100 * (1 - ratio), None if ci is None else [100 * (1 - ci[1]), 100 * (1 - ci[0])]


def axis_gaps(runs, optimizer, size, tokens_per_param, momentum, mode="delayed") -> dict[int, float]:
    """An axis point's per-seed gaps of ``mode`` at its scanned lr (the one where its delayed runs are)."""
    variant = f"axis-{size}-{tokens_per_param:g}tpp"
    lr = {r["lr"] for r in select(runs, optimizer=optimizer, mode="delayed", variant=variant)}.pop()
    return gaps(runs, optimizer, lr, momentum, mode, variant=variant)


def axis_gap(runs, optimizer, size, tokens_per_param, momentum):
    """An axis point's gap and its t interval."""
    return t_interval(list(axis_gaps(runs, optimizer, size, tokens_per_param, momentum).values()))


def axis_change(runs, optimizer, first, last, momentum):
    """How an axis gap moves from point ``first`` to point ``last`` (each ``(size, tokens/param)``):
    paired by seed on one model, Welch's across two models."""
    a, b = (axis_gaps(runs, optimizer, *point, momentum) for point in (first, last))
    if first[0] == last[0]:
        return paired_change(a, b)
    return welch(list(a.values()), list(b.values()))


def paired_change(a: dict, b: dict):
    """``b[s] - a[s]`` over the seeds both have: the mean and its 95% t interval."""
    return t_interval([b[s] - a[s] for s in sorted(set(a) & set(b))])


def welch(a, b):
    """mean(b) - mean(a) of two independent samples with Welch's 95% interval (Satterthwaite's df)."""
    va, vb = (sum((x - mean(s)) ** 2 for x in s) / (len(s) - 1) / len(s) for s in (a, b))
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    d, h = mean(b) - mean(a), _student.ppf(0.975, df) * math.sqrt(va + vb)
    return d, [d - h, d + h]


def axis_ef(runs, optimizer, size, tokens_per_param, momentum):
    """EF's recovered share (%) at an axis point, with Fieller's interval."""
    point = (runs, optimizer, size, tokens_per_param, momentum)
    return recovered(axis_gaps(*point, mode="ef"), axis_gaps(*point))


def axis_gap_ratio(runs, size, tokens_per_param, momenta):
    """AdamW's gap over Muon's at an axis point, paired by seed, with Fieller's interval."""
    g = {o: axis_gaps(runs, o, size, tokens_per_param, momenta[o]) for o in ("adamw", "muon")}
    return paired_ratio(g["adamw"], g["muon"])


def toy_holds(runs) -> tuple[int, int]:
    """(settings under the bound at its slope, settings): the upper 95% end of the measured mean
    at every T below the bound, and the least-squares log-log slope within the exponent + tolerance."""
    toys = [r for r in runs if r.get("kind") == "toy" and r.get("task") == "rates"]  # not the cost or compare runs
    held = sum(rate_holds(r) for r in toys)
    return held, len(toys)


def loglog_slope(ts, values) -> float:
    """The least-squares slope of log(value) against log(T)."""
    xs, ys = [math.log(t) for t in ts], [math.log(v) for v in values]
    mx, my = mean(xs), mean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def rate_holds(r: dict) -> bool:
    """A toy rate check holds: the upper 95% end of the measured mean below the bound at every T,
    and the measured means' log-log slope within the bound's exponent + tolerance."""
    slope = loglog_slope([p["T"] for p in r["points"]], [p["measured"] for p in r["points"]])
    return all(p["ci"][1] <= p["bound"] for p in r["points"]) and slope <= r["exponent"] + r["tolerance"]


def delay_gap(runs, optimizer, setting, mode, momentum, sync_variant="delays-sync", lr=None):
    """A delay-axis cell's gap: ``mode`` at its lr in the setting's folder (the best of its grid where
    the setting was tuned, its one lr where not; ``lr`` where given: an interpolated lr in a folder that
    another part's runs share) minus sync at its best lr, per seed, with the t interval."""
    variant = f"delays-{setting}"
    sync_lr = best_lr(runs, optimizer, "sync", momentum, variant="delays-sync")
    lr = lr or best_lr(runs, optimizer, mode, momentum, variant=variant)
    sync = by_seed(runs, optimizer=optimizer, mode="sync", lr=sync_lr, momentum=momentum, variant=sync_variant)
    other = by_seed(runs, optimizer=optimizer, mode=mode, lr=lr, momentum=momentum, variant=variant)
    per = {s: other[s] - sync[s] for s in sorted(set(sync) & set(other))}
    return per, t_interval(list(per.values()))


def delay_recovery(runs, optimizer, setting, mode, momentum, sync_variant="delays-sync", lrs=(None, None)):
    """The share (%) of the plain gap ``mode`` recovers at a delay setting, and its Fieller interval
    (``lrs``: the delayed and the mode's lr where given, as :func:`delay_gap`)."""
    plain, _ = delay_gap(runs, optimizer, setting, "delayed", momentum, sync_variant, lrs[0])
    fixed, _ = delay_gap(runs, optimizer, setting, mode, momentum, sync_variant, lrs[1])
    return recovered(fixed, plain)


def fieller_at(num, den, level):
    """Fieller's interval at a given confidence level (the lr shift uses 97.5% per vertex)."""
    n = len(num)
    mx, my = mean(num), mean(den)
    sxx = sum((x - mx) ** 2 for x in num) / (n - 1)
    syy = sum((y - my) ** 2 for y in den) / (n - 1)
    sxy = sum((x - mx) * (y - my) for x, y in zip(num, den)) / (n - 1)
    q = _student.ppf(0.5 + level / 2, n - 1) ** 2 / n
    a, b, c = my * my - q * syy, mx * my - q * sxy, mx * mx - q * sxx
    if a <= 0:
        return None
    root = math.sqrt(max(b * b - a * c, 0.0))
    return [(b - root) / a, (b + root) / a]


def _vertex(runs, optimizer, mode, momentum, variant="main"):
    """The lr grid's optimum: the parabola in log(lr) through the best mean point and its two
    neighbours (per seed: A_s, B_s of A x^2 + B x + C), vertex -mean(B) / (2 mean(A)), and its
    Fieller interval at 97.5%; None where the best point is at the grid's edge (censored)."""
    grid, seeds = _grid(runs, optimizer, mode, momentum, variant)
    lrs = sorted(grid)
    means = [mean([grid[lr][s] for s in seeds]) for lr in lrs]
    i = min(range(len(lrs)), key=lambda k: means[k])
    if i in (0, len(lrs) - 1):
        return None
    x0, x1, x2 = (math.log(lr) for lr in lrs[i - 1:i + 2])
    A, B = [], []
    for s in seeds:
        y0, y1, y2 = (grid[lr][s] for lr in lrs[i - 1:i + 2])
        # divided differences: y = y0 + d1 (x - x0) + d2 (x - x0)(x - x1)
        d1 = (y1 - y0) / (x1 - x0)
        d2 = ((y2 - y1) / (x2 - x1) - d1) / (x2 - x0)
        A.append(d2)
        B.append(d1 - d2 * (x0 + x1))
    v = -mean(B) / (2 * mean(A))
    return v, fieller_at([-b / 2 for b in B], A, 0.975)


def lr_shift(runs, optimizer, momentum, base="sync", other="delayed"):
    """``other``'s optimum over ``base``'s (both on the main grid, base seeds), with the
    Bonferroni combination of the two 97.5% vertex intervals; None where either is censored."""
    b, o = _vertex(runs, optimizer, base, momentum), _vertex(runs, optimizer, other, momentum)
    if b is None or o is None:
        return None
    ratio = math.exp(o[0] - b[0])
    if b[1] is None or o[1] is None:
        return ratio, None
    return ratio, [math.exp(o[1][0] - b[1][1]), math.exp(o[1][1] - b[1][0])]


def difference_of_gaps(runs, first, second, momenta):
    """``first``'s gap minus ``second``'s at their best sync lrs, paired by seed, with its t interval."""
    g = {}
    for opt in (first, second):
        lr = best_lr(runs, opt, "sync", momenta[opt])
        g[opt] = gaps(runs, opt, lr, momenta[opt])
    seeds = sorted(set(g[first]) & set(g[second]))
    return t_interval([g[first][s] - g[second][s] for s in seeds])


def recovery_at_best(runs, optimizer, momentum, fix, variant):
    """A mitigation's recovered share at the best sync lr: its runs under ``variant`` (e.g.
    ``sync-start-30``) against sync and delayed of the main grid, paired by seed; Fieller."""
    lr = best_lr(runs, optimizer, "sync", momentum)
    g = gaps(runs, optimizer, lr, momentum)
    sync = by_seed(runs, optimizer=optimizer, mode="sync", lr=lr, momentum=momentum, variant="main")
    mine = by_seed(runs, optimizer=optimizer, mode=fix, lr=lr, momentum=momentum, variant=variant)
    return recovered({s: mine[s] - sync[s] for s in mine if s in sync}, g)


def schedule_difference(runs, optimizer, lr, momentum, depth, variant="main", twobw_mode="delayed"):
    """PipeDream at ``depth`` minus 2BW (the plain delayed run), paired by seed, t interval."""
    twobw = by_seed(runs, optimizer=optimizer, mode=twobw_mode, lr=lr, momentum=momentum, variant=variant)
    pd = by_seed(runs, optimizer=optimizer, mode=f"pipedream-{depth}", lr=lr, momentum=momentum)
    seeds = sorted(set(twobw) & set(pd))
    return t_interval([pd[s] - twobw[s] for s in seeds])


def tuned_gap(runs, optimizer, momentum):
    """{seed: delayed at its best lr - sync at its best lr} at one momentum (main grid)."""
    s_lr, d_lr = best_lr(runs, optimizer, "sync", momentum), best_lr(runs, optimizer, "delayed", momentum)
    return gaps(runs, optimizer, d_lr, momentum, "delayed", s_lr)


def momentum_change(runs, optimizer, low, high):
    """The tuned gap at ``high`` momentum minus at ``low``, paired by seed, with its t interval."""
    a, b = tuned_gap(runs, optimizer, low), tuned_gap(runs, optimizer, high)
    seeds = sorted(set(a) & set(b))
    return t_interval([b[s] - a[s] for s in seeds])


def iso_loss(sync_curve, other_curve):
    """Tokens ``other`` needs to reach sync's final val loss, over sync's tokens (linear between
    validations; the first point that reaches it counts); None where it never does."""
    t_sync, target = sync_curve[-1]
    for i, (t, v) in enumerate(other_curve):
        if v <= target:
            if i == 0:
                return t / t_sync
            t0, v0 = other_curve[i - 1]
            return (t0 + (v0 - target) / (v0 - v) * (t - t0)) / t_sync
    return None


def overhead(runs, optimizer, mode, momentum, lengths=(1.5, 2, 4)):
    """The iso-loss overhead at the best sync lr over the base seeds: per seed the 1x run, else the
    first of the longer runs (``length-<k>x`` folders) that reaches sync's final loss; mean and t
    interval where every seed reached it, else None."""
    per = overhead_per_seed(runs, optimizer, mode, momentum, lengths)
    values = [v for v, _ in per]
    return None if None in values else t_interval(values)


def overhead_per_seed(runs, optimizer, mode, momentum, lengths=(1.5, 2, 4)) -> list[tuple]:
    """``[(overhead or None, the run length it was measured in), ...]`` per base seed (see :func:`overhead`)."""
    lr = best_lr(runs, optimizer, "sync", momentum)
    out = []
    for s in _grid(runs, optimizer, "sync", momentum)[1]:
        sync = select(runs, optimizer=optimizer, mode="sync", lr=lr, momentum=momentum, seed=s, variant="main")[0]
        value, length = None, None
        for k, variant in zip((1, *lengths), ["main"] + [f"length-{k:g}x" for k in lengths]):
            other = select(runs, optimizer=optimizer, mode=mode, lr=lr, momentum=momentum, seed=s, variant=variant)
            if other and (value := iso_loss(sync["val_curve"], other[0]["val_curve"])) is not None:
                length = k
                break
        out.append((value, length))
    return out


def ef_recovery_at(runs, optimizer, lr, momentum, seeds):
    """EF's recovered share (%) at one lr over ``seeds`` (main grid), with Fieller's interval."""
    e = gaps(runs, optimizer, lr, momentum, "ef")
    return recovered({s: v for s, v in e.items() if s in seeds}, gaps(runs, optimizer, lr, momentum))


def indistinguishable(runs, optimizer, momentum) -> list[float]:
    """The sync lrs whose paired (by seed) difference to the best lr's loss has a 95% t interval
    reaching 0, over the grid's base seeds (a diverged seed resolves the difference)."""
    grid, seeds = _grid(runs, optimizer, "sync", momentum)
    best = best_lr(runs, optimizer, "sync", momentum)
    out = []
    for lr, vals in grid.items():
        d = [vals[s] - grid[best][s] for s in seeds]
        if lr == best or (all(math.isfinite(x) for x in d) and t_interval(d)[1][0] <= 0):
            out.append(lr)
    return sorted(out)


def gap_difference_at(runs, first, first_lr, second, second_lr, momenta):
    """``first``'s gap at ``first_lr`` minus ``second``'s at ``second_lr``, paired over every seed both have."""
    a = gaps(runs, first, first_lr, momenta[first])
    b = gaps(runs, second, second_lr, momenta[second])
    return paired_change(b, a)


def scan_margin(runs, optimizer, size, tokens_per_param, momentum):
    """The axis point's one-seed sync scan: (the best lr's margin over the runner-up at seed 0, the
    seed SD of sync's final loss at the chosen lr over every seed run there)."""
    variant = f"axis-{size}-{tokens_per_param:g}tpp"
    scan = sorted((r["val_loss"], r["lr"]) for r in select(runs, optimizer=optimizer, mode="sync", momentum=momentum,
                                                              variant=variant, seed=0))
    chosen = [r["val_loss"] for r in select(runs, optimizer=optimizer, mode="sync", momentum=momentum,
                                            variant=variant, lr=scan[0][1])]
    m = mean(chosen)
    return scan[1][0] - scan[0][0], math.sqrt(sum((x - m) ** 2 for x in chosen) / (len(chosen) - 1))


def gap_along(runs, optimizer, size, tokens_per_param, momentum) -> list[tuple[float, float]]:
    """``[(fraction of the run's tokens, mean over seeds of delayed - sync val loss), ...]`` at each
    validation of the axis point's runs (the chosen lr: the lr of its delayed runs)."""
    variant = f"axis-{size}-{tokens_per_param:g}tpp"
    delayed = {r["seed"]: r for r in select(runs, optimizer=optimizer, mode="delayed", momentum=momentum,
                                            variant=variant)}
    lr = next(iter(delayed.values()))["lr"]
    sync = {r["seed"]: r for r in select(runs, optimizer=optimizer, mode="sync", momentum=momentum,
                                         variant=variant, lr=lr)}
    seeds = sorted(set(sync) & set(delayed))
    at = {s: (dict(map(tuple, sync[s]["val_curve"])), dict(map(tuple, delayed[s]["val_curve"]))) for s in seeds}
    tokens = sorted(set.intersection(*(set(a) & set(b) for a, b in at.values())))
    return [(t / tokens[-1], mean([at[s][1][t] - at[s][0][t] for s in seeds])) for t in tokens]


# -- the unconfounded tokens axis (cpu-tokens-2) -----------------------------------------------------


def tokens_best(runs, variant, mode) -> float:
    """The lr whose ``mode`` runs have the lowest mean final val loss at one tokens-axis point."""
    by_lr: dict[float, list[float]] = {}
    for r in select(runs, variant=variant, mode=mode):
        by_lr.setdefault(r["lr"], []).append(r["val_loss"])
    return min(by_lr, key=lambda lr: mean(by_lr[lr]))


def tokens_curves(runs, variant) -> list[tuple[int, dict[int, float]]]:
    """``[(tokens, {seed: delayed - sync val loss}), ...]`` at every validation of a point, each mode
    at its own best lr."""
    cur = {}
    for mode in ("sync", "delayed"):
        lr = tokens_best(runs, variant, mode)
        cur[mode] = {r["seed"]: [tuple(x) for x in r["val_curve"]] for r in select(runs, variant=variant, mode=mode,
                                                                                   lr=lr)}
    seeds = sorted(set(cur["sync"]) & set(cur["delayed"]))
    first = cur["sync"][seeds[0]]
    return [(first[i][0], {s: cur["delayed"][s][i][1] - cur["sync"][s][i][1] for s in seeds})
            for i in range(len(first))]


def tokens_reads(runs, variant) -> dict[str, dict[int, float]]:
    """Per-seed gaps at the peak lr (the first validation at or after the 5% warmup), mid-run (the
    validation nearest half the run) and the end."""
    line = select(runs, variant=variant)[0]
    per_update = line["batch_size"] * line["block_size"]
    curve = tokens_curves(runs, variant)
    updates = [t // per_update for t, _ in curve]
    peak = next(i for i, u in enumerate(updates) if u >= line["steps"] // 20)
    mid = min(range(len(updates)), key=lambda i: (abs(updates[i] - line["steps"] / 2), i))
    return {"peak": curve[peak][1], "mid": curve[mid][1], "end": curve[-1][1]}


def tokens_closing(runs, variant) -> dict[int, float]:
    """Per seed, the gap at the peak lr minus the gap at the end."""
    reads = tokens_reads(runs, variant)
    return {s: reads["peak"][s] - reads["end"][s] for s in sorted(reads["end"])}


def field_claim(runs, row):
    """A field claim's value and 95% interval (docs/field.md) from runs.jsonl and the run folders the
    row names (``inputs``): ``mean`` of a per-seed linear combination of final val losses (t), ``ratio``
    of two (Fieller), ``share`` recovered (Fieller), ``welch`` of two independent combinations, or the
    ``overhead`` at two budgets (per seed the first run that reaches its sync run's final loss, Welch)."""
    by = {r["folder"]: r for r in select(runs)}
    inp = row["inputs"]

    def combo(terms):
        per = [(c, {by[f]["seed"]: by[f]["val_loss"] for f in folders}) for c, folders in terms]
        seeds = sorted(set.intersection(*(set(x) for _, x in per)))
        return {s: sum(c * x[s] for c, x in per) for s in seeds if all(x[s] is not None for _, x in per)}

    def losses(folders):
        return {by[f]["seed"]: by[f]["val_loss"] for f in folders}

    if inp["kind"] == "mean":
        return t_interval(list(combo(inp["terms"]).values()))
    if inp["kind"] == "ratio":
        return paired_ratio(combo(inp["num"]), combo(inp["den"]))
    if inp["kind"] == "share":
        sync, delayed, fix = (losses(inp[k]) for k in ("sync", "delayed", "fix"))
        seeds = sorted(set(sync) & set(delayed) & set(fix))
        return recovered({s: fix[s] - sync[s] for s in seeds}, {s: delayed[s] - sync[s] for s in seeds})
    if inp["kind"] == "welch":
        return welch(list(combo(inp["first"]).values()), list(combo(inp["second"]).values()))
    assert inp["kind"] == "overhead", inp["kind"]

    def per_seed(cells):
        out = []
        for sync, tries in cells:
            out.append(next((v for f in tries if (v := iso_loss(by[sync]["val_curve"], by[f]["val_curve"])) is not None),
                            None))
        return out

    first, second = per_seed(inp["first"]), per_seed(inp["second"])
    return (None, None) if None in first + second else welch(first, second)
