"""Which runs each finding needs, as :class:`~delaylab.reproduce.runner.LLMRun` / ``ToyRun`` lists.

The same functions serve the runner (what to run) and the report (what it reports), so the two
cannot disagree. Several runs depend on finished ones, so each function takes a *results source*
``src`` (``src.summary(run)``: the finished run's summary or None; ``src.val_records(run)``: its
validations, each with tokens and val_loss) and lists what can be decided now. The runner's source reads the run
folders (:class:`~delaylab.reproduce.ledger.Folders`) and calls :func:`plan` again after every
finished run until nothing new appears; at that fixed point the runs are read once into the
:class:`~delaylab.reproduce.ledger.Ledger`, itself a source, on which the report makes the same
decisions with the same functions. Three rules decide runs from results:

- **lr grids grow at an edge** (:func:`adaptive_lrs`): while a grid's best lr (by the mean over
  the base seeds) is its lowest or highest, the grid gains lr/2 or 2 lr, at most ``lr_extend``
  steps per side; a best lr still at an edge is reported as a censored optimum.
- **seeds by power** (:func:`power_seeds`): a headline cell (an optimizer's best-sync-lr sync,
  delayed and EF runs) adds two seeds at a time, up to ``max_seeds``, until the 95% t interval of
  its gap is narrower than half the gap.
- **iso-loss overhead by longer runs** (:func:`overhead_runs`): a delayed (or EF) run that does
  not reach its seed's sync run's final val loss is rerun 1.5x, 2x, 4x as long, its lr schedule
  stretched, until one reaches it.

The best lr and every grid decision use the base seeds (``seeds``) only, so added seeds never
move a decision that other runs were planned on.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

from delaylab.llm.metrics import iso_loss_overhead, val_points
from delaylab.llm.sweep import Cell
from delaylab.errors import ConfigError
from delaylab.reproduce.presets import Preset
from delaylab.reproduce.runner import LLMRun, ToyRun
from delaylab.reproduce.verdicts import protocol_issues
from delaylab.stats import t_interval

MAIN = "main"
SWEEP_MODE = {"ef": "ef", "dc-asgd": "dc-asgd", "sync-start": "delayed", "sync-cooldown": "delayed"}


def _momentum(p: Preset, opt: str) -> float | None:
    return p.llm.momentum.get(opt)


def seeds(p: Preset, opt: str) -> int:
    """``opt``'s base seeds: every cell of it has them; its grid decisions are made on them."""
    return p.llm.optimizer_seeds.get(opt, p.llm.seeds)


def _runs(variant: str, base: dict, opt: str, lr: float, momentum, modes, seeds, label=None) -> list[LLMRun]:
    seeds = range(seeds) if isinstance(seeds, int) else seeds
    return [LLMRun(variant, base, Cell(opt, mode, float(lr), momentum, s), label or mode)
            for mode in modes for s in seeds]


def _loss(src, run) -> float | None:
    """The finished run's final val loss (inf where it diverged); None while it is not finished."""
    s = src.summary(run)
    if s is None:
        return None
    v = s.get("val_loss")
    return math.inf if v is None or not math.isfinite(v) else v


# -- the three rules ------------------------------------------------------------------------------


def adaptive_lrs(src, lrs, runs_at: Callable[[float], list[LLMRun]], modes, limit: int) -> dict:
    """The lr grid ``lrs`` grown by the edge rule: ``{"lrs", "done", "extended", "censored"}``.

    ``runs_at(lr)``: the runs at one lr (labels = modes); ``modes``: those whose best lr must be
    bracketed. ``done`` once every run of the grid has finished and no edge can grow;
    ``censored[mode]``: ``"low"`` / ``"high"`` where that mode's best lr is still at an edge.
    """
    grid, grown = sorted(float(x) for x in lrs), {"low": 0, "high": 0}
    while True:
        means: dict = {}
        for lr in grid:
            for r in runs_at(lr):
                v = _loss(src, r)
                if v is None:
                    return {"lrs": grid, "done": False, "extended": dict(grown), "censored": {}}
                means.setdefault(r.label, {}).setdefault(lr, []).append(v)
        best = {m: min(grid, key=lambda lr: sum(means[m][lr]) / len(means[m][lr])) for m in modes if m in means}
        low = any(b == grid[0] for b in best.values()) and grown["low"] < limit
        high = any(b == grid[-1] for b in best.values()) and grown["high"] < limit
        if not (low or high):
            censored = {m: "low" if b == grid[0] else "high" if b == grid[-1] else None for m, b in best.items()}
            return {"lrs": grid, "done": True, "extended": dict(grown), "censored": censored, "best": best}
        if low:
            grid.insert(0, grid[0] / 2)
            grown["low"] += 1
        if high:
            grid.append(grid[-1] * 2)
            grown["high"] += 1


def power_seeds(src, runs_for: Callable[[int, int], list[LLMRun]], first: int, cap: int | None) -> dict:
    """Seeds of a headline cell by the power rule: ``{"seeds", "done", "resolved", "gap_ci"}``.

    ``runs_for(lo, hi)``: the cell's runs of seeds ``lo..hi-1`` (labels sync, delayed, ...). From
    ``first`` seeds, two more at a time up to ``cap``, until the gap's (delayed - sync, per seed)
    95% t interval is narrower than half its mean's size. ``resolved``: that happened.
    """
    n = first
    while True:
        runs = runs_for(0, n)
        losses = {}
        for r in runs:
            v = _loss(src, r)
            if v is None:
                return {"seeds": n, "done": False, "resolved": None, "gap_ci": None}
            losses[(r.label, r.cell.seed)] = v
        gaps = [losses[("delayed", s)] - losses[("sync", s)] for s in range(n)
                if math.isfinite(losses[("delayed", s)]) and math.isfinite(losses[("sync", s)])]
        ci = t_interval(gaps)
        mean = sum(gaps) / len(gaps) if gaps else 0.0
        resolved = ci is not None and (ci[1] - ci[0]) < abs(mean) / 2
        if resolved or cap is None or n >= cap:
            return {"seeds": n, "done": True, "resolved": resolved, "gap_ci": ci, "cap": cap}
        n = min(cap, n + 2)


def length_base(base: dict, factor: float) -> dict:
    """``base`` run ``factor`` times as long: updates, validation and checkpoint intervals scaled
    (the cosine schedule and the 5% warmup follow the length: the schedule is stretched)."""
    return {**base, **{k: max(1, round(factor * base[k])) for k in ("steps", "eval_every", "ckpt_every")}}


def _length_variant(factor: float) -> str:
    return f"length-{factor:g}x"


def overhead_runs(src, base: dict, sync: LLMRun, other: LLMRun, lengths) -> dict:
    """The runs that measure ``other``'s iso-loss overhead against ``sync`` (one seed): ``other``
    itself, then the same cell ``lengths`` times as long, each planned only where the previous
    did not reach sync's final val loss. ``{"runs", "done", "overhead", "length"}``: the first
    length that reaches it and its overhead (None where none did, or while running)."""
    runs = [other]
    sync_metrics = src.val_records(sync) if src.summary(sync) is not None else None
    for factor in (1, *lengths):
        variant = _length_variant(factor) if other.variant == MAIN else f"{other.variant}-{_length_variant(factor)}"
        run = other if factor == 1 else LLMRun(variant, length_base(base, factor), other.cell, other.label)
        if factor != 1:
            runs.append(run)
        if sync_metrics is None or src.summary(run) is None:
            return {"runs": runs, "done": False, "overhead": None, "length": None}
        mine = src.val_records(run)
        if not val_points(mine) or not val_points(sync_metrics) or not math.isfinite(_loss(src, run)):
            # a diverged run is a result, not a reason to run longer: no overhead
            return {"runs": runs, "done": True, "overhead": None, "length": None, "diverged": True}
        o = iso_loss_overhead(sync_metrics, mine)
        if o["reached"]:
            return {"runs": runs, "done": True, "overhead": o, "length": factor}
    return {"runs": runs, "done": True, "overhead": None, "length": None, "max_length": max((1, *lengths))}


# -- findings 1-4 --------------------------------------------------------------------------------


def grid_runs_at(p: Preset, opt: str) -> Callable[[float], list[LLMRun]]:
    g = p.llm
    return lambda lr: _runs(MAIN, g.base, opt, lr, _momentum(p, opt), ("sync", "delayed"), seeds(p, opt))


def grid_lrs(p: Preset, src, opt: str) -> dict:
    """The main lr grid of ``opt`` (adaptive): sync's best is bracketed for every optimizer, and
    delayed's too for the ``lr_sweep`` ones (finding 4 reports both optima)."""
    modes = ("sync", "delayed") if opt in p.llm.lr_sweep else ("sync",)
    return adaptive_lrs(src, p.llm.lrs[opt], grid_runs_at(p, opt), modes, p.llm.lr_extend)


def grid(p: Preset, src) -> list[LLMRun]:
    """Findings 1 and 4: sync and delayed over every optimizer's lr grid (base seeds)."""
    return [r for opt in p.llm.optimizers for lr in grid_lrs(p, src, opt)["lrs"] for r in grid_runs_at(p, opt)(lr)]


def best_sync(p: Preset, src) -> dict[str, dict] | None:
    """``{optimizer: {"lr", "momentum", "censored", "lrs"}}``: each optimizer's best sync lr on its
    finished grid, by the mean over the base seeds; None until every grid has finished."""
    best = {}
    for opt in p.llm.optimizers:
        g = grid_lrs(p, src, opt)
        if not g["done"]:
            return None
        best[opt] = {"lr": g["best"]["sync"], "momentum": _momentum(p, opt), "censored": g["censored"].get("sync"),
                     "lrs": g["lrs"], "grid": g}
    return best


def headline_seeds(p: Preset, src, opt: str, best: dict) -> dict:
    """The power rule on ``opt``'s best-sync-lr cell (sync, delayed and EF where EF is run)."""
    g = p.llm
    modes = ("sync", "delayed") + (("ef",) if "ef" in g.mitigations else ())
    row = best[opt]

    def runs_for(lo, hi):
        return _runs(MAIN, g.base, opt, row["lr"], row["momentum"], modes, range(lo, hi))

    return power_seeds(src, runs_for, seeds(p, opt), g.max_seeds if opt in g.headline else None)


def headline(p: Preset, best: dict, power: dict) -> list[LLMRun]:
    """The headline cells' runs at the seeds the power rule gave them (``power``: {opt: headline_seeds})."""
    g = p.llm
    modes = ("sync", "delayed") + (("ef",) if "ef" in g.mitigations else ())
    return [r for opt in g.headline
            for r in _runs(MAIN, g.base, opt, best[opt]["lr"], best[opt]["momentum"], modes, power[opt]["seeds"])]


def variant_base(p: Preset, mitigation: str) -> tuple[str, dict]:
    """The (variant, base) a mitigation's delayed runs use."""
    k = p.llm.sync_steps
    if mitigation == "sync-start":
        return f"sync-start-{k}", {**p.llm.base, "sync_start": k}
    if mitigation == "sync-cooldown":
        return f"sync-cooldown-{k}", {**p.llm.base, "sync_cooldown": k}
    return MAIN, p.llm.base


def mitigations(p: Preset, best: dict, power: dict) -> list[LLMRun]:
    """Finding 2: every mitigation at each optimizer's best sync lr (EF of a headline cell at its seeds)."""
    runs = []
    for opt in p.llm.optimizers:
        row = best[opt]
        for m in p.llm.mitigations:
            variant, base = variant_base(p, m)
            n = power[opt]["seeds"] if m == "ef" and opt in power else seeds(p, opt)
            runs += _runs(variant, base, opt, row["lr"], row["momentum"], (SWEEP_MODE[m],), n, label=m)
    return runs


def neighbours(lrs, best: float) -> list[float]:
    """The three grid lrs around ``best`` (the three nearest when ``best`` is at the grid's edge)."""
    lrs = sorted(lrs)
    i = min(max(lrs.index(best), 1), len(lrs) - 2) if len(lrs) >= 3 else 1
    return lrs[max(0, i - 1):i + 2]


def ef_grid(p: Preset, src, opt: str, best: dict) -> dict:
    """EF's own lr grid: the three lrs around the best sync lr, grown at an edge of EF's best."""
    g = p.llm

    def runs_at(lr):
        return _runs(MAIN, g.base, opt, lr, best[opt]["momentum"], ("ef",), seeds(p, opt))

    return adaptive_lrs(src, neighbours(best[opt]["lrs"], best[opt]["lr"]), runs_at, ("ef",), g.lr_extend)


def ef_lrs(p: Preset, best: dict, grids: dict) -> list[LLMRun]:
    """EF over its own lr grid (``grids``: {opt: ef_grid}; recovery against lr, EF's own best lr)."""
    g = p.llm
    return [r for opt in g.ef_lrs for lr in grids[opt]["lrs"]
            for r in _runs(MAIN, g.base, opt, lr, best[opt]["momentum"], ("ef",), seeds(p, opt))]


def momentum_grid(p: Preset, src, opt: str, mom: float, best: dict) -> dict:
    """One momentum's lr grid: the three lrs around the default momentum's best sync lr, grown at
    an edge of sync's or delayed's best (so each is tuned at this momentum). At the optimizer's
    own momentum it is the main grid (the same runs, one grid)."""
    g = p.llm
    if mom == _momentum(p, opt):
        main = grid_lrs(p, src, opt)
        if opt in g.lr_sweep:
            return main

    def runs_at(lr):
        return _runs(MAIN, g.base, opt, lr, mom, ("sync", "delayed"), seeds(p, opt))

    return adaptive_lrs(src, neighbours(best[opt]["lrs"], best[opt]["lr"]), runs_at, ("sync", "delayed"),
                        g.lr_extend)


def momentum(p: Preset, grids: dict) -> list[LLMRun]:
    """Finding 3: sync and delayed over the momentum grid, each momentum over its own lr grid
    (``grids``: {(opt, momentum): momentum_grid})."""
    g = p.llm
    return [r for opt, grid_ in g.momenta.items() for mom in grid_
            for lr in grids[(opt, mom)]["lrs"]
            for r in _runs(MAIN, g.base, opt, lr, mom, ("sync", "delayed"), seeds(p, opt))]


def overhead_plan(p: Preset, src, best: dict) -> dict[tuple, dict]:
    """``{(optimizer, mode, seed): overhead_runs(...)}`` for the ``overhead`` optimizers' delayed
    (and EF) runs at the best sync lr, base seeds."""
    g = p.llm
    modes = ("delayed",) + (("ef",) if "ef" in g.mitigations else ())
    res = {}
    for opt in g.overhead:
        row = best[opt]
        for s in range(seeds(p, opt)):
            sync = _runs(MAIN, g.base, opt, row["lr"], row["momentum"], ("sync",), [s])[0]
            for mode in modes:
                other = _runs(MAIN, g.base, opt, row["lr"], row["momentum"], (mode,), [s])[0]
                res[(opt, mode, s)] = overhead_runs(src, g.base, sync, other, g.overhead_lengths)
    return res


def ablation_bases(p: Preset) -> dict[str, tuple[str, dict]]:
    """``{ablation: (variant, base)}``: warmup fractions, run lengths and DC-ASGD lambdas."""
    base, g = p.llm.base, p.llm
    out = {}
    for f in g.warmup_fractions:
        out[f"warmup-{round(100 * f)}%"] = (f"warmup-{round(100 * f)}", {**base, "warmup": round(f * base["steps"])})
    for k in g.length_factors:
        out[f"length-{k}x"] = (_length_variant(k), length_base(base, k))
    from delaylab.llm.config import DelayConfig

    for lam in g.dc_lambdas:  # the default lambda's runs are finding 2's dc-asgd runs
        out[f"dc-asgd-{lam:g}"] = ((MAIN, base) if lam == DelayConfig.dc_lambda
                                   else (f"dc-{lam:g}", {**base, "dc_lambda": lam}))
    return out


def ablations(p: Preset, best: dict) -> dict[str, list[LLMRun]]:
    """Each ablation's runs at the best sync lr: ``ablation_modes`` under the changed base; the
    DC-ASGD lambdas and DC-ASGD-a as their corrected runs only (sync and delayed are finding 1's)."""
    g = p.llm
    n = g.ablation_seeds or g.seeds
    out: dict[str, list[LLMRun]] = {}
    for name, (variant, base) in ablation_bases(p).items():
        modes = ("dc-asgd",) if name.startswith("dc-asgd") else g.ablation_modes
        out[name] = [r for opt in g.ablation_optimizers for mode in modes
                     for r in _runs(variant, base, opt, best[opt]["lr"], best[opt]["momentum"], (mode,), n,
                                    label=name if name.startswith("dc-asgd") else mode)]
    if g.dc_adaptive:
        out["dc-asgd-a"] = [r for opt in g.ablation_optimizers
                            for r in _runs(MAIN, g.base, opt, best[opt]["lr"], best[opt]["momentum"],
                                           ("dc-asgd-a",), n)]
    return out


# -- the tokens-per-parameter and model-size axes ---------------------------------------------------


@functools.lru_cache(maxsize=None)
def model_params(size: str, block_size: int, data: str, tokenizer: str, vocab_size: int | None) -> int:
    """Parameters of the ``size`` GPT for the data's vocabulary (what its runs report)."""
    from delaylab.llm.data import load_dataset
    from delaylab.llm.model import GPT, preset

    vocab = 256 if tokenizer == "byte" else load_dataset(data, tokenizer, vocab_size or 4096).vocab_size
    return sum(x.numel() for x in GPT(preset(size, vocab_size=vocab, block_size=block_size)).parameters())


def ratio_base(b: dict, size: str, ratio: float, batch: int, block_size: int, evals: int, **fields) -> dict:
    """The TrainConfig fields that train the ``size`` GPT on ``ratio`` tokens per parameter at
    ``batch`` sequences of ``block_size`` (updates rounded), validating ``evals`` times; ``fields``
    after the size (their order is the printed commands' flag order)."""
    params = model_params(size, block_size, b.get("data", "shakespeare"), b.get("tokenizer", "byte"),
                          b.get("vocab_size"))
    steps = max(1, round(ratio * params / (batch * block_size)))
    return {**b, "preset": size, "batch_size": batch, "block_size": block_size, "steps": steps, **fields,
            "eval_every": max(1, steps // evals), "ckpt_every": max(1, steps // 2), "log_every": max(1, steps // 40)}


def axis_base(p: Preset, size: str, ratio: float) -> dict:
    """The TrainConfig fields of the axis point (size, tokens per parameter)."""
    s = p.scale
    return ratio_base(s.base, size, ratio, s.batch_size[size], s.block_size, s.evals)


def axis_variant(size: str, ratio: float) -> str:
    return f"axis-{size}-{ratio:g}tpp"


def axis_scan(p: Preset, src, size: str, ratio: float, opt: str) -> dict:
    """The sync lr scan at one point (``scan_seeds`` seeds), grown at an edge."""
    s = p.scale
    base = axis_base(p, size, ratio)

    def runs_at(lr):
        return _runs(axis_variant(size, ratio), base, opt, lr, s.momentum.get(opt), ("sync",), s.scan_seeds)

    return adaptive_lrs(src, s.lrs[opt], runs_at, ("sync",), s.lr_extend)


def axis_cell(p: Preset, src, size: str, ratio: float, opt: str, lr: float) -> dict:
    """The point's runs at ``lr``: ``modes`` x seeds, by the power rule (sync and delayed decide)."""
    s = p.scale
    base = axis_base(p, size, ratio)

    def runs_for(lo, hi):
        return _runs(axis_variant(size, ratio), base, opt, lr, s.momentum.get(opt), s.modes, range(lo, hi))

    power = power_seeds(src, runs_for, s.seeds, s.max_seeds)
    return {"runs": runs_for(0, power["seeds"]), "power": power}


def axis(p: Preset, src) -> tuple[list[LLMRun], dict | None]:
    """Every axis run decidable now, and ``{(size, ratio, opt): {"scan", "lr", "cell"}}`` once all are done."""
    runs, table, done = [], {}, True
    for size, ratio in p.scale.points():
        for opt in p.scale.optimizers:
            scan = axis_scan(p, src, size, ratio, opt)
            runs += [r for lr in scan["lrs"] for r in _runs(axis_variant(size, ratio), axis_base(p, size, ratio), opt,
                                                            lr, p.scale.momentum.get(opt), ("sync",),
                                                            p.scale.scan_seeds)]
            if not scan["done"]:
                done = False
                continue
            lr = scan["best"]["sync"]
            cell = axis_cell(p, src, size, ratio, opt, lr)
            runs += cell["runs"]
            done = done and cell["power"]["done"]
            table[(size, ratio, opt)] = {"scan": scan, "lr": lr, "cell": cell}
    return runs, (table if done else None)


# -- the tokens axis, unconfounded (issue 36) -----------------------------------------------------------


def tokens_base(p: Preset, size: str, ratio: float, kind: str) -> dict:
    """The TrainConfig fields of one point of :class:`~delaylab.reproduce.presets.TokensGrid`."""
    t = p.tokens
    batch = t.wide_batch if kind == "wide" else t.batch_size
    return ratio_base(t.base, size, ratio, batch, t.block_size, t.evals,
                      lr_schedule="constant" if kind == "constant" else "cosine", eval_batches=t.val_windows // batch)


def tokens_variant(size: str, ratio: float, kind: str) -> str:
    return f"tokens-{size}-{ratio:g}tpp-{kind}"


def tokens_point(p: Preset, src, size: str, ratio: float, kind: str) -> dict:
    """One point's lr grid (both modes on it, every seed), grown at an edge: :func:`adaptive_lrs`'
    record plus ``runs`` (every run of the grid so far)."""
    t = p.tokens
    variant, base = tokens_variant(size, ratio, kind), tokens_base(p, size, ratio, kind)

    def runs_at(lr):
        return _runs(variant, base, t.optimizer, lr, t.momentum, t.modes, t.seeds)

    grid = adaptive_lrs(src, t.lrs, runs_at, t.modes, t.lr_extend)
    return {**grid, "runs": [r for lr in grid["lrs"] for r in runs_at(lr)], "base": base}


def tokens_axis(p: Preset, src) -> tuple[list[LLMRun], dict | None]:
    """Every tokens-axis run decidable now, and ``{(size, ratio, kind): point}`` once all are done."""
    runs, table = [], {}
    for size, ratio, kind in p.tokens.points():
        point = tokens_point(p, src, size, ratio, kind)
        runs += point["runs"]
        table[(size, ratio, kind)] = point
    return runs, (table if all(pt["done"] for pt in table.values()) else None)


# -- the delay axis ------------------------------------------------------------------------------------


def delay_base(p: Preset, setting) -> dict:
    """The TrainConfig fields of a delay setting's delayed runs (its sync runs: :func:`delay_sync`)."""
    g = p.delays
    delay = {"delay_dist": setting.delay_dist} if setting.delay_dist is not None else {
        "delay": list(setting.delay) if isinstance(setting.delay, tuple) else setting.delay}
    return {**g.base, **setting.model, **delay}


def delay_sync(p: Preset, setting=None) -> tuple[str, dict]:
    """(variant, base) of the sync runs a setting's gaps are taken against: one folder per model."""
    model = {} if setting is None else setting.model
    suffix = "".join(f"-{k.replace('_', '')}{v}" for k, v in sorted(model.items()))
    return f"delays-sync{suffix}", {**p.delays.base, **model}


def _lattice(p: Preset, opt: str, lr: float) -> float:
    """``lr`` rounded to the nearest point of ``opt``'s factor-2 lr lattice (in log lr)."""
    lr0 = p.delays.lrs[opt][0]
    return lr0 * 2.0 ** round(math.log2(lr / lr0))


def delay_sync_grid(p: Preset, src, opt: str) -> dict:
    g = p.delays
    variant, base = delay_sync(p)

    def runs_at(lr):
        return _runs(variant, base, opt, lr, g.momentum.get(opt), ("sync",), g.scan_seeds)

    return adaptive_lrs(src, g.lrs[opt], runs_at, ("sync",), g.lr_extend)


def delay_mode_grid(p: Preset, src, name: str, opt: str, mode: str, start: float) -> dict:
    """A mode's lr grid at a tuned setting: the three lattice lrs around ``start``, grown at an edge."""
    g = p.delays
    s = g.setting(name)
    base = delay_base(p, s)

    def runs_at(lr):
        return _runs(f"delays-{name}", base, opt, lr, g.momentum.get(opt), (mode,), g.scan_seeds)

    return adaptive_lrs(src, [start / 2, start, start * 2], runs_at, (mode,), g.lr_extend)


def interpolate_lr(p: Preset, opt: str, optima: dict[float, float], mean_delay: float) -> float:
    """The lr at ``mean_delay`` from ``{mean delay: best lr}`` of the tuned settings: linear in log lr
    against log mean delay between the two nearest (the nearest one outside their range), rounded to
    the lr lattice."""
    taus = sorted(optima)
    if mean_delay <= taus[0] or len(taus) == 1:
        return optima[taus[0]]
    if mean_delay >= taus[-1]:
        return optima[taus[-1]]
    hi = next(t for t in taus if t >= mean_delay)
    lo = max(t for t in taus if t <= mean_delay)
    if hi == lo:
        return optima[lo]
    w = (math.log(mean_delay) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return _lattice(p, opt, math.exp((1 - w) * math.log(optima[lo]) + w * math.log(optima[hi])))


def delay_lrs(p: Preset, src) -> tuple[list[LLMRun], dict, bool]:
    """The lr grids' runs decidable now, the lrs decided so far and whether all are:
    ``{"sync": {opt: grid}, (setting, opt, mode): {"lr", "grid" (None where interpolated), "tuned"}}``.
    A tuned setting's grid starts once the previous one's has finished; the interpolated lrs once
    every tuned grid of their (optimizer, mode) has."""
    g = p.delays
    runs, lrs, done = [], {"sync": {}}, True
    variant, base = delay_sync(p)
    for opt in g.optimizers:
        grid = delay_sync_grid(p, src, opt)
        runs += [r for lr in grid["lrs"] for r in _runs(variant, base, opt, lr, g.momentum.get(opt), ("sync",),
                                                         g.scan_seeds)]
        if not grid["done"]:
            done = False
            continue
        lrs["sync"][opt] = grid
        for mode in dict.fromkeys(m for s in g.settings for m in g.modes_of(s)):
            start, tuned = grid["best"]["sync"], True
            for name in (n for n in g.tuned if mode in g.modes_of(g.setting(n))):
                mg = delay_mode_grid(p, src, name, opt, mode, start)
                runs += [r for lr in mg["lrs"] for r in _runs(f"delays-{name}", delay_base(p, g.setting(name)), opt,
                                                               lr, g.momentum.get(opt), (mode,), g.scan_seeds)]
                if not mg["done"]:
                    tuned = done = False
                    break
                start = mg["best"][mode]
                lrs[(name, opt, mode)] = {"lr": start, "grid": mg, "tuned": True}
            if not tuned:
                continue
            optima = {g.setting(n).mean_delay: lrs[(n, opt, mode)]["lr"] for n in g.tuned
                      if (n, opt, mode) in lrs}
            for s in g.settings:
                if mode in g.modes_of(s) and (s.name, opt, mode) not in lrs:
                    lrs[(s.name, opt, mode)] = {"lr": interpolate_lr(p, opt, optima, s.mean_delay), "grid": None,
                                                "tuned": False}
    return runs, lrs, done


def delay_cells(p: Preset, lrs: dict) -> dict[tuple, list[LLMRun]]:
    """The reported cells decided so far (the setting's seeds): ``(setting, opt, "sync")`` at the best
    sync lr (the setting's own model) and ``(setting, opt, mode)`` at the mode's lr."""
    g = p.delays
    cells = {}
    for opt in lrs["sync"]:
        sync_lr = lrs["sync"][opt]["best"]["sync"]
        for s in g.settings:
            variant, base = delay_sync(p, s)
            n = g.seeds_of(s)
            cells[(s.name, opt, "sync")] = _runs(variant, base, opt, sync_lr, g.momentum.get(opt), ("sync",), n)
            for mode in g.modes_of(s):
                if (s.name, opt, mode) in lrs:
                    cells[(s.name, opt, mode)] = _runs(f"delays-{s.name}", delay_base(p, s), opt,
                                                       lrs[(s.name, opt, mode)]["lr"], g.momentum.get(opt), (mode,), n)
    return cells


def delay_overhead(p: Preset, src, cells: dict) -> dict[tuple, dict]:
    """``{(setting, opt, mode, seed): overhead_runs(...)}`` for the ``overhead`` settings and modes."""
    g = p.delays
    res = {}
    for name in g.overhead:
        s = g.setting(name)
        for opt in g.optimizers:
            for mode in g.overhead_modes:
                if (name, opt, mode) not in cells:
                    continue
                for seed in range(g.overhead_seeds):
                    sync, other = cells[(name, opt, "sync")][seed], cells[(name, opt, mode)][seed]
                    res[(name, opt, mode, seed)] = overhead_runs(src, delay_base(p, s), sync, other,
                                                                 g.overhead_lengths)
    return res


def delay_axis(p: Preset, src) -> tuple[list[LLMRun], dict | None]:
    """Every delay-axis run decidable now, and once all are finished ``{"lrs", "cells", "overhead"}``."""
    runs, lrs, done = delay_lrs(p, src)
    cells = delay_cells(p, lrs)
    runs += [r for rs in cells.values() for r in rs]
    overhead = delay_overhead(p, src, cells)
    runs += [r for o in overhead.values() for r in o["runs"]]
    finished = (done and all(src.summary(r) is not None for r in runs)
                and all(o["done"] for o in overhead.values()))
    return runs, ({"lrs": lrs, "cells": cells, "overhead": overhead} if finished else None)


# -- the field's claims (docs/field.md) -------------------------------------------------------------------


def field_setting(p: Preset):
    """The random-delay setting of the staleness-threshold comparison (on the delay axis's base model)."""
    from delaylab.reproduce.presets import DelaySetting

    return DelaySetting(f"field-{p.field.random.replace(':', '-')}", delay_dist=p.field.random)


def field_drop_mode(p: Preset) -> str:
    return f"drop-{p.field.drop}"


def _field_grid(p: Preset, src, variant: str, base: dict, mode: str, start: float) -> dict:
    """A mode's lr grid of the field part: three lattice lrs around ``start``, grown at an edge, with
    its runs and, once done, its best lr's cell (``seeds`` seeds; the grid's share the lower seeds)."""
    f, opt = p.field, p.field.optimizer
    mom = p.delays.momentum.get(opt)

    def runs_at(lr):
        return _runs(variant, base, opt, lr, mom, (mode,), f.scan_seeds)

    grid = adaptive_lrs(src, [start / 2, start, start * 2], runs_at, (mode,), f.lr_extend)
    runs = [r for lr in grid["lrs"] for r in runs_at(lr)]
    cell = _runs(variant, base, opt, grid["best"][mode], mom, (mode,), f.seeds) if grid["done"] else None
    return {"grid": grid, "runs": runs + (cell or []), "cell": cell}


def field_axis(p: Preset, src) -> tuple[list[LLMRun], dict | None]:
    """Every run of the field part decidable now (:class:`~delaylab.reproduce.presets.FieldGrid`), and
    once all are finished ``{"held", "retuned", "raw_momentum", "random", "budgets"}``: the cells (run
    lists) and grids each claim reads; the delay axis's own cells are :func:`delay_axis`'s."""
    f, g = p.field, p.delays
    opt = f.optimizer
    mom = g.momentum.get(opt)
    _, lrs, done = delay_lrs(p, src)
    runs: list[LLMRun] = []
    table: dict = {"held": {}, "retuned": {}, "raw_momentum": {}, "random": {}, "budgets": {}}
    ready = done and opt in lrs["sync"]
    if not ready:
        return runs, None
    held_lr = lrs[("tau-1", opt, "delayed")]["lr"]
    for name in f.held:
        s = g.setting(name)
        table["held"][name] = cell = _runs(f"delays-{name}", delay_base(p, s), opt, held_lr, mom, ("delayed",),
                                           g.seeds_of(s))
        runs += cell
    for name in f.retuned:
        s = g.setting(name)
        rec = _field_grid(p, src, f"delays-{name}", delay_base(p, s), "delayed", lrs[(name, opt, "delayed")]["lr"])
        table["retuned"][name] = rec
        runs += rec["runs"]
    for name in f.raw_momentum:
        s = g.setting(name)
        lr = lrs.get((name, opt, "predict"), lrs[(name, opt, "delayed")])["lr"]
        table["raw_momentum"][name] = cell = _runs(f"delays-{name}", delay_base(p, s), opt, lr, mom,
                                                   ("predict-momentum",), g.seeds_of(s))
        runs += cell
    rand = field_setting(p)
    optima = {g.setting(n).mean_delay: lrs[(n, opt, "delayed")]["lr"] for n in g.tuned if (n, opt, "delayed") in lrs}
    start = interpolate_lr(p, opt, optima, rand.mean_delay)
    for mode in ("delayed", field_drop_mode(p)):
        rec = _field_grid(p, src, rand.name, delay_base(p, rand), mode, start)
        table["random"][mode] = rec
        runs += rec["runs"]
    s = g.setting(f.budget_setting)
    sync_variant, sync_base = delay_sync(p, s)
    sync_lr, lr = lrs["sync"][opt]["best"]["sync"], lrs[(s.name, opt, "delayed")]["lr"]
    for factor in f.budgets:
        tag = "" if factor == 1 else f"-budget-{factor:g}x"
        base, sbase = (delay_base(p, s), sync_base) if factor == 1 else (
            length_base(delay_base(p, s), factor), length_base(sync_base, factor))
        per = {}
        for seed in range(f.overhead_seeds):
            sync = _runs(sync_variant + tag, sbase, opt, sync_lr, mom, ("sync",), [seed])[0]
            other = _runs(f"delays-{s.name}" + tag, base, opt, lr, mom, ("delayed",), [seed])[0]
            per[seed] = {"sync": sync, **overhead_runs(src, base, sync, other, f.overhead_lengths)}
            runs += [sync, *per[seed]["runs"]]
        table["budgets"][factor] = per
    finished = (all(src.summary(r) is not None for r in runs)
                and all(rec["cell"] is not None for part in ("retuned", "random") for rec in table[part].values())
                and all(o["done"] for per in table["budgets"].values() for o in per.values()))
    return runs, (table if finished else None)


# -- findings 5 and 6 --------------------------------------------------------------------------------


def schedule_delays(depth: int) -> list[int]:
    """PipeDream's per-stage delays at ``depth`` stages, from the pipeline's schedule model."""
    from delaylab.llm.config import schedule_delays as delays

    return delays("pipedream", depth)


def schedules(p: Preset) -> dict[str, list[LLMRun]]:
    """Finding 5, by schedule: ``sync``, ``2bw`` and ``pipedream-P`` for each depth P."""
    s = p.schedules
    base = {**p.llm.base, **s.overrides}
    prefix = "" if not s.overrides else "sched-"
    main = MAIN if not s.overrides else "sched"
    out = {"sync": [], "2bw": []}
    for opt in s.optimizers:
        lr, mom = s.lrs[opt], _momentum(p, opt)
        out["sync"] += _runs(main, base, opt, lr, mom, ("sync",), s.seeds)
        out["2bw"] += _runs(main, base, opt, lr, mom, ("delayed",), s.seeds, label="2bw")
        for depth in s.depths:
            name = f"pipedream-{depth}"
            pd_base = {**base, "delay": schedule_delays(depth)}
            out.setdefault(name, []).extend(_runs(prefix + name, pd_base, opt, lr, mom, ("delayed",), s.seeds,
                                                  label=name))
    return out


def toy(p: Preset) -> dict[str, list[ToyRun]]:
    """Finding 6: the rate suite, the delay cost and the comparison, as toy runs."""
    from delaylab.toy.problems import PROBLEMS
    from delaylab.toy.rates import SUITE_MODES, suite_settings

    t = p.toy
    rates = []
    for problem, method, delay, corr in suite_settings(t.problems, t.methods, SUITE_MODES):
        mode = "sync" if delay == 0 else f"tau{delay}" + ("" if corr == "none" else f"-{corr}")
        rates.append(ToyRun(f"rates-{problem}-{method}-{mode}", "rates",
                            dict(problem=problem, method=method, delay=delay, correction=corr, steps=list(t.T),
                                 seeds=t.seeds)))
    assert t.cost_problem in PROBLEMS and t.compare_problem in PROBLEMS
    cost = ToyRun(f"cost-{t.cost_problem}-{t.cost_method}", "cost",
                  dict(problem=t.cost_problem, method=t.cost_method, steps=t.cost_T, seeds=t.seeds,
                       betas=list(t.cost_betas)))
    compare = ToyRun(f"compare-{t.compare_problem}", "compare",
                     dict(problem=t.compare_problem, steps=t.compare_T, seeds=t.compare_seeds))
    return {"rates": rates, "cost": [cost], "compare": [compare]}


# -- everything ----------------------------------------------------------------------------------------


def decide(p: Preset, src) -> dict:
    """Every decision that can be made now, each made once, with the runs it leads to (the Ledger
    keeps this at the fixed point: what the report reads). ``axis``, ``delay_axis``, ``tokens_axis``:
    (runs, table or None until done); ``grid``; ``schedules`` and ``toy``: {group: runs}; and once
    every main grid has finished, ``best`` (:func:`best_sync`, else None), ``power`` ({opt:
    :func:`headline_seeds`} of the headline optimizers), ``headline``, ``mitigations``,
    ``momentum_grid`` ({(opt, momentum): grid}), ``momentum``, ``ef_grid`` ({opt: grid}), ``ef_lrs``,
    ``overhead`` (:func:`overhead_plan`) and ``ablations``."""
    d: dict = {}
    if p.scale is not None:
        d["axis"] = axis(p, src)
    if p.delays is not None:
        d["delay_axis"] = delay_axis(p, src)
    if p.tokens is not None:
        d["tokens_axis"] = tokens_axis(p, src)
    if p.field is not None:
        d["field_axis"] = field_axis(p, src)
    if p.schedules is not None:
        d["schedules"] = schedules(p)
    if p.toy is not None:
        d["toy"] = toy(p)
    if p.llm is None:
        return d
    g = p.llm
    d["grid"] = grid(p, src)
    best = d["best"] = best_sync(p, src)
    if best is None:
        return d
    d["power"] = power = {opt: headline_seeds(p, src, opt, best) for opt in g.headline}
    d["momentum_grid"] = {(opt, mom): momentum_grid(p, src, opt, mom, best) for opt, moms in g.momenta.items()
                          for mom in moms}
    d["ef_grid"] = {opt: ef_grid(p, src, opt, best) for opt in g.ef_lrs}
    d.update(headline=headline(p, best, power), mitigations=mitigations(p, best, power),
             momentum=momentum(p, d["momentum_grid"]), ef_lrs=ef_lrs(p, best, d["ef_grid"]),
             overhead=overhead_plan(p, src, best), ablations=ablations(p, best))
    return d


def llm_runs(p: Preset, d: dict) -> list[LLMRun]:
    """Every GPT run of the decisions ``d`` (:func:`decide`), in runs.jsonl's order."""
    runs = [r for key in ("axis", "delay_axis", "tokens_axis", "field_axis") if key in d for r in d[key][0]]
    runs += d.get("grid", []) + [r for group in d.get("schedules", {}).values() for r in group]
    if d.get("best") is not None:
        runs += d["headline"] + d["mitigations"] + d["momentum"] + d["ef_lrs"]
        runs += [r for rec in d["overhead"].values() for r in rec["runs"]]
        runs += [r for group in d["ablations"].values() for r in group]
    return runs


def plan(p: Preset, src) -> list:
    """Every run the report needs that can be decided now."""
    d = decide(p, src)
    return _unique(llm_runs(p, d) + [r for group in d.get("toy", {}).values() for r in group])


def _unique(runs: list) -> list:
    """Drop repeats of a folder (a run shared by two findings); a folder used with two different
    configurations is a bug in the plan."""
    seen: dict[str, object] = {}
    out = []
    for r in runs:
        prev = seen.get(r.folder)
        if prev is None:
            seen[r.folder] = r
            out.append(r)
        elif (getattr(prev, "base", None), getattr(prev, "kwargs", None)) != (getattr(r, "base", None),
                                                                               getattr(r, "kwargs", None)):
            raise AssertionError(f"two configurations for {r.folder}")
    return out


def check_protocol(p: Preset) -> None:
    """The protocol's rules (:func:`delaylab.reproduce.verdicts.protocol_issues`) on the runs a
    preset's headline depends on: the momentum grid, the headline optimizers' runs, the schedule
    comparison and every point of the axes. Another optimizer that breaks them (cpu-small's Lion
    and Adan) runs, and every verdict on it says undetermined. ci's runs are too short to mean
    anything (under 100 updates): not checked here, and its verdicts are all undetermined."""
    def check(opt, mom, base):
        if base["steps"] < 100:
            return
        issues = protocol_issues(opt, mom, base["steps"], base.get("warmup"))
        if issues:
            raise ConfigError(f"preset {p.name}: {issues[0]}")

    g = p.llm
    if g is not None:
        for opt, grid in g.momenta.items():
            for m in grid:
                check(opt, m, g.base)
        for opt in g.headline:
            check(opt, g.momentum.get(opt), g.base)
    if p.schedules is not None:
        for opt in p.schedules.optimizers:
            check(opt, p.llm.momentum.get(opt), {**p.llm.base, **p.schedules.overrides})
    if p.scale is not None:
        for size, ratio in p.scale.points():
            for opt in p.scale.optimizers:
                check(opt, p.scale.momentum.get(opt), axis_base(p, size, ratio))
    if p.tokens is not None:
        for size, ratio, kind in p.tokens.points():
            check(p.tokens.optimizer, p.tokens.momentum, tokens_base(p, size, ratio, kind))
    if p.delays is not None:
        for s in p.delays.settings:
            for opt in p.delays.optimizers:
                check(opt, p.delays.momentum.get(opt), {**p.delays.base, **s.model})
