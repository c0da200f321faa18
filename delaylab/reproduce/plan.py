"""Which runs each finding needs, as :class:`~delaylab.reproduce.runner.LLMRun` / ``ToyRun`` lists.

The same functions serve the runner (what to run) and the report (which folders to read), so
the two cannot disagree. Findings 2 and 3 run at each optimizer's best sync lr, which
:func:`best_sync` reads from the finished lr grid; until then they plan nothing.
"""

from __future__ import annotations

from pathlib import Path

from delaylab.llm.sweep import Cell, read_metrics, summarize
from delaylab.reproduce.presets import Preset
from delaylab.reproduce.runner import LLMRun, ToyRun, read_summary

MAIN = "main"
SWEEP_MODE = {"ef": "ef", "dc-asgd": "dc-asgd", "sync-start": "delayed", "sync-cooldown": "delayed"}


def _momentum(p: Preset, opt: str) -> float | None:
    return p.llm.momentum.get(opt)


def _runs(variant: str, base: dict, opt: str, lr: float, momentum, modes, seeds: int, label=None) -> list[LLMRun]:
    return [LLMRun(variant, base, Cell(opt, mode, float(lr), momentum, s), label or mode)
            for mode in modes for s in range(seeds)]


def grid(p: Preset) -> list[LLMRun]:
    """Findings 1 and 4: sync and delayed over every optimizer's lr grid."""
    g = p.llm
    return [r for opt in g.optimizers for lr in g.lrs[opt]
            for r in _runs(MAIN, g.base, opt, lr, _momentum(p, opt), ("sync", "delayed"), g.seeds)]


def records(out: Path, runs: list[LLMRun], curves: bool = False) -> list[dict] | None:
    """Rows for :func:`delaylab.llm.sweep.summarize` (mode = the run's label); None until all finished.
    ``curves``: each row also carries its run's metrics.jsonl lines (``metrics``), from which
    summarize computes iso-loss overheads and the regime diagnostics."""
    rows = []
    for r in runs:
        s = read_summary(out, r)
        if s is None:
            return None
        c = r.cell
        rows.append({"optimizer": c.optimizer, "mode": r.label, "lr": c.lr, "momentum": c.momentum,
                     "seed": c.seed, "val_loss": s.get("val_loss"), "run": r.folder})
        if curves:
            rows[-1]["metrics"] = read_metrics(Path(out) / r.folder)
    return rows


def best_sync(p: Preset, out: Path) -> dict[str, dict] | None:
    """``{optimizer: gaps row}`` at each optimizer's best mean sync loss on the lr grid."""
    rows = records(out, grid(p))
    return None if rows is None else summarize(rows)["best"]


def variant_base(p: Preset, mitigation: str) -> tuple[str, dict]:
    """The (variant, base) a mitigation's delayed runs use."""
    k = p.llm.sync_steps
    if mitigation == "sync-start":
        return f"sync-start-{k}", {**p.llm.base, "sync_start": k}
    if mitigation == "sync-cooldown":
        return f"sync-cooldown-{k}", {**p.llm.base, "sync_cooldown": k}
    return MAIN, p.llm.base


def mitigations(p: Preset, best: dict) -> list[LLMRun]:
    """Finding 2: every mitigation at each optimizer's best sync lr."""
    runs = []
    for opt in p.llm.optimizers:
        row = best[opt]
        for m in p.llm.mitigations:
            variant, base = variant_base(p, m)
            runs += _runs(variant, base, opt, row["lr"], row["momentum"], (SWEEP_MODE[m],), p.llm.seeds, label=m)
    return runs


def neighbours(lrs, best: float) -> list[float]:
    """The three grid lrs around ``best`` (the three nearest when ``best`` is at the grid's edge)."""
    lrs = sorted(lrs)
    i = min(max(lrs.index(best), 1), len(lrs) - 2) if len(lrs) >= 3 else 1
    return lrs[max(0, i - 1):i + 2]


def ef_lrs(p: Preset, best: dict) -> list[LLMRun]:
    """EF at the lrs next to the best sync lr (recovery against lr; EF's own best lr)."""
    return [r for opt in p.llm.ef_lrs for lr in neighbours(p.llm.lrs[opt], best[opt]["lr"])
            for r in _runs(MAIN, p.llm.base, opt, lr, best[opt]["momentum"], ("ef",), p.llm.seeds)]


def momentum(p: Preset, best: dict) -> list[LLMRun]:
    """Finding 3: sync and delayed over the momentum grid, each momentum over the three lrs around
    the best sync lr at the default momentum, so the lr is retuned at each momentum."""
    return [r for opt, grid_ in p.llm.momenta.items() for mom in grid_
            for lr in neighbours(p.llm.lrs[opt], best[opt]["lr"])
            for r in _runs(MAIN, p.llm.base, opt, lr, mom, ("sync", "delayed"), p.llm.seeds)]


def ablation_bases(p: Preset) -> dict[str, tuple[str, dict]]:
    """``{ablation: (variant, base)}``: warmup fractions, run lengths and DC-ASGD lambdas."""
    base, g = p.llm.base, p.llm
    out = {}
    for f in g.warmup_fractions:
        out[f"warmup-{round(100 * f)}%"] = (f"warmup-{round(100 * f)}", {**base, "warmup": round(f * base["steps"])})
    for k in g.length_factors:
        out[f"length-{k}x"] = (f"length-{k}x", {**base, **{key: k * base[key] for key in
                                                          ("steps", "eval_every", "ckpt_every")}})
    from delaylab.llm.config import DelayConfig

    for lam in g.dc_lambdas:  # the default lambda's runs are finding 2's dc-asgd runs
        out[f"dc-asgd-{lam:g}"] = ((MAIN, base) if lam == DelayConfig.dc_lambda
                                   else (f"dc-{lam:g}", {**base, "dc_lambda": lam}))
    return out


def ablations(p: Preset, best: dict) -> dict[str, list[LLMRun]]:
    """Each ablation's runs at the best sync lr: ``ablation_modes`` under the changed base; the
    DC-ASGD lambdas and DC-ASGD-a as their corrected runs only (sync and delayed are finding 1's)."""
    g = p.llm
    out: dict[str, list[LLMRun]] = {}
    for name, (variant, base) in ablation_bases(p).items():
        modes = ("dc-asgd",) if name.startswith("dc-asgd") else g.ablation_modes
        out[name] = [r for opt in g.ablation_optimizers for mode in modes
                     for r in _runs(variant, base, opt, best[opt]["lr"], best[opt]["momentum"], (mode,), g.seeds,
                                    label=name if name.startswith("dc-asgd") else mode)]
    if g.dc_adaptive:
        out["dc-asgd-a"] = [r for opt in g.ablation_optimizers
                            for r in _runs(MAIN, g.base, opt, best[opt]["lr"], best[opt]["momentum"],
                                           ("dc-asgd-a",), g.seeds)]
    return out


def scale_base(p: Preset, size: str) -> dict:
    s = p.scale
    steps = s.steps[size]
    return {**p.llm.base, "preset": size, "batch_size": s.batch_size, "block_size": s.block_size, "steps": steps,
            "eval_every": max(1, steps // s.evals), "ckpt_every": max(1, steps // 2),
            "log_every": max(1, steps // 40)}


def scale_scan(p: Preset) -> list[LLMRun]:
    """The one-seed sync lr scan at each scanned size."""
    s = p.scale
    return [r for size in s.scan_sizes for opt in s.optimizers for lr in s.lrs[opt]
            for r in _runs(f"scale-{size}", scale_base(p, size), opt, lr, _momentum(p, opt), ("sync",), 1)]


def scale_lrs(p: Preset, out: Path) -> dict[str, dict[str, dict]] | None:
    """``{size: {optimizer: {"lr", "scanned"}}}`` from the finished scan; None until it has finished."""
    s = p.scale
    loss: dict = {}
    for r in scale_scan(p):
        summary = read_summary(out, r)
        if summary is None:
            return None
        v = summary.get("val_loss")
        loss[(r.variant[len("scale-"):], r.cell.optimizer, r.cell.lr)] = v if v is not None else float("inf")
    lrs: dict = {}
    scanned = None
    for size in s.sizes:
        if size in s.scan_sizes:
            scanned = size
            lrs[size] = {opt: {"lr": min(s.lrs[opt], key=lambda lr: loss[(size, opt, lr)]), "scanned": True}
                         for opt in s.optimizers}
        elif scanned is None:
            raise AssertionError(f"scale size {size} has no scanned size below it")
        else:
            lrs[size] = {opt: {**lrs[scanned][opt], "scanned": False, "from": scanned} for opt in s.optimizers}
    return lrs


def scale(p: Preset, lrs: dict) -> dict[str, list[LLMRun]]:
    """``{size: runs}``: ``modes`` x ``seeds`` of every optimizer at the size's lr."""
    s = p.scale
    return {size: [r for opt in s.optimizers
                   for r in _runs(f"scale-{size}", scale_base(p, size), opt, lrs[size][opt]["lr"],
                                  _momentum(p, opt), s.modes, s.seeds)]
            for size in s.sizes}


def schedule_delays(depth: int) -> list[int]:
    """PipeDream's per-stage delays at ``depth`` stages, from the pipeline's schedule model."""
    from delaylab.llm.pipeline.schedules import schedule_delays as delays

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


def plan(p: Preset, out: Path) -> list:
    """Every run the report needs that can be decided now, cheapest-to-decide first."""
    runs = scale_scan(p) if p.scale else []
    runs += grid(p)
    runs += [r for group in schedules(p).values() for r in group]
    runs += [r for group in toy(p).values() for r in group]
    lrs = scale_lrs(p, out) if p.scale else None
    if lrs is not None:
        runs += [r for group in scale(p, lrs).values() for r in group]
    best = best_sync(p, out)
    if best is not None:
        runs += mitigations(p, best) + momentum(p, best) + ef_lrs(p, best)
        runs += [r for group in ablations(p, best).values() for r in group]
    return _unique(runs)


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
