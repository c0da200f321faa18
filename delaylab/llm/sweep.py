"""Grids of runs (optimizer x mode x lr x momentum x seed) and the delay gap they measure.

``sweep(base, out, optimizers, modes, lrs, momenta, seeds)`` runs every cell in
``out/cells/<cell>/`` through :func:`delaylab.llm.run.trainer.train` (finished cells are read, not
rerun; interrupted ones resume from their checkpoint), then writes

- ``gaps.json``: per optimizer, at its best sync lr, the sync, delayed and EF losses with
  their seed spread, the gap ``delayed - sync`` (paired by seed: same init, same batches) and
  the share of the gap EF recovers; and the same numbers for every (lr, momentum) of the grid;
- per row also the iso-loss token overhead of each mode against sync and the regime diagnostics
  (loss spike, plateau exit) of each mode, from the runs' metrics.jsonl (:mod:`delaylab.llm.metrics`);
- ``llm_loss_curves.png``, ``llm_iso_loss.png`` (val loss against tokens, the crossings of
  sync's final loss marked), ``llm_gap_vs_momentum.png`` and ``llm_loss_vs_lr.png``.

A sweep whose runs validate fewer than 8 times warns (stderr, and ``warnings`` in gaps.json):
the overhead interpolates between validation points.

Modes: ``sync``, ``delayed``, ``ef`` (delayed + error feedback), ``dc-asgd``, every other single
corrector of :mod:`delaylab.optim.corrections`, and ``ef+predict`` (EF and weight prediction together).
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from delaylab._io import write_json
from delaylab._progress import Progress
from delaylab.errors import ConfigError, Diverged
from delaylab import stats
from delaylab.llm import metrics
from delaylab.llm.checkpoint import ROOT, latest_complete
from delaylab.llm.config import CORRECTIONS_BY_ENGINE, Config
from delaylab.optim.corrections import CORRECTORS
from delaylab.run_folder import METRICS
from delaylab.llm.run.setup import resolve
from delaylab.llm.run.trainer import train

# Sweep mode -> (delayed?, correction). A delayed mode uses the base's delay (default 1). A corrector
# list is a mode named with "+" (``--modes`` is a comma list): ef+predict is the one the delay axis runs.
# A corrector that takes an argument is a mode written ``name-K`` (``drop-4``: correction drop:4).
SWEEP_MODES = {"sync": (False, "none"), "delayed": (True, "none"),
               **{c: (True, c) for c in CORRECTIONS_BY_ENGINE["simulator"]
                  if c != "none" and CORRECTORS[c].argument is None},
               "ef+predict": (True, "ef,predict")}
FIXES = tuple(m for m in SWEEP_MODES if m not in ("sync", "delayed"))  # the corrected modes


def mode_setting(mode: str) -> tuple[bool, str]:
    """(delayed?, correction) of a sweep mode: a :data:`SWEEP_MODES` key, or ``name-K`` for a
    corrector that takes an argument (``drop-4``)."""
    if mode in SWEEP_MODES:
        return SWEEP_MODES[mode]
    name, _, k = mode.rpartition("-")
    if name in CORRECTORS and CORRECTORS[name].argument is not None and k.isdigit():
        return True, f"{name}:{int(k)}"
    with_arg = [f"{n}-K" for n, e in CORRECTORS.items() if e.argument is not None]
    raise ConfigError(f"unknown sweep mode {mode!r} (choose from {', '.join([*SWEEP_MODES, *with_arg])})")


@dataclass(frozen=True)
class Cell:
    optimizer: str
    mode: str  # a SWEEP_MODES key
    lr: float
    momentum: float | None
    seed: int

    @property
    def name(self) -> str:
        mom = "default" if self.momentum is None else f"{self.momentum:g}"
        return f"{self.optimizer}_{self.mode}_lr{self.lr:g}_m{mom}_s{self.seed}"

    def config(self, base: Config) -> Config:
        delayed, correction = mode_setting(self.mode)
        dist = base.delay.delay_dist if delayed else None  # a delayed mode keeps the base's --delay-dist
        delay = 0 if dist is not None or not delayed else (base.delay.delay or 1)
        cfg = base.replace(optimizer=self.optimizer, delay=delay, delay_dist=dist, correction=correction,
                            lr=self.lr, momentum=self.momentum, seed=self.seed)
        return resolve(cfg, "simulator")


def plan(base: Config, optimizers, modes, lrs=None, momenta=None, seeds=1) -> list[Cell]:
    """The cells of the grid. ``lrs`` and ``momenta``: a list for every optimizer, or
    ``{optimizer: [...]}``; ``None`` (or a missing optimizer) uses the optimizer's default."""
    for m in modes:
        mode_setting(m)
    seeds = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    if not seeds or not optimizers or not modes:
        raise ConfigError("a sweep needs at least one optimizer, mode and seed")
    cells = []
    for opt in optimizers:
        resolve(base.replace(optimizer=opt), "simulator")  # unknown optimizer: fail before running anything
        grid = lrs.get(opt) if isinstance(lrs, dict) else lrs
        for lr in grid or [base.replace(optimizer=opt, lr=None).resolved_lr()]:
            for mom in (momenta.get(opt) if isinstance(momenta, dict) else momenta) or [None]:
                for mode in modes:
                    for seed in seeds:
                        cell = Cell(opt, mode, float(lr), mom, seed)
                        cell.config(base)  # resolving checks it
                        cells.append(cell)
    return cells


def run_cell(base: dict, cell: Cell, folder: str) -> dict:
    """Run (or read, or resume) one cell; a diverged run is a result, not an error."""
    cfg = cell.config(Config.from_dict(base))
    folder = Path(folder)
    summary = folder / "summary.json"
    if summary.is_file():
        saved = json.loads((folder / "config.json").read_text())
        if cfg.differences(saved):
            raise ConfigError(f"{folder} was run with another config; use another sweep folder")
        return json.loads(summary.read_text())
    resume = latest_complete(folder / ROOT, 1) is not None
    if not resume and folder.exists():
        shutil.rmtree(folder)  # an attempt that stopped before its first checkpoint
    try:
        return train(cfg, folder, resume=resume)
    except Diverged:
        return json.loads(summary.read_text())


def summarize(records: list[dict], diagnostics: bool = True) -> dict:
    """The gap table from cell records ``{optimizer, mode, lr, momentum, seed, val_loss}``.

    Gaps and EF recovery are computed per seed (sync and delayed runs of one seed share init
    and batches), then summarized over seeds (:func:`delaylab.stats.sample`: mean, std,
    t interval; :func:`~delaylab.llm.metrics.recovery`, with Fieller's set). A diverged run
    has ``val_loss`` None. Records that carry ``metrics`` (the run's metrics.jsonl lines) add,
    per row, ``overhead[mode]`` (iso-loss token overhead against the sync run of the same seed,
    :func:`~delaylab.llm.metrics.overhead_over_seeds`) and ``diagnostics[mode]`` (loss spike and
    plateau exit after warmup, over seeds; ``diagnostics=False``: not computed, for records whose
    ``metrics`` are validation points alone).
    """
    groups: dict[tuple, dict] = {}
    curves: dict[tuple, dict] = {}
    for r in records:
        key = (r["optimizer"], r["lr"], r["momentum"])
        groups.setdefault(key, {}).setdefault(r["mode"], {})[r["seed"]] = r["val_loss"]
        if r.get("metrics"):
            curves.setdefault(key, {}).setdefault(r["mode"], {})[r["seed"]] = r["metrics"]
    grid = []
    for (opt, lr, mom), by_mode in groups.items():
        row = {"optimizer": opt, "lr": lr, "momentum": mom}
        for mode, per_seed in sorted(by_mode.items()):
            row[mode] = stats.sample([per_seed[s] for s in sorted(per_seed)])
        sync, delayed = by_mode.get("sync", {}), by_mode.get("delayed", {})
        seeds, gaps = stats.paired(sync, delayed)
        if seeds:
            row["gap"] = stats.sample(gaps)
        for fix in FIXES:
            runs = by_mode.get(fix, {})
            if seeds and any(s in runs for s in seeds):
                row[f"{fix}_recovered_pct"] = metrics.recovery(sync, delayed, runs)
        row.update(_curve_metrics(curves.get((opt, lr, mom), {}), diagnostics))
        grid.append(row)
    grid.sort(key=lambda r: (r["optimizer"], r["momentum"] is not None, r["momentum"] or 0, r["lr"]))

    def sync_mean(row):
        m = row.get("sync", {}).get("mean")
        return math.inf if m is None else m

    best = {}
    for opt in dict.fromkeys(r["optimizer"] for r in grid):
        rows = [r for r in grid if r["optimizer"] == opt and "sync" in r]
        if rows:
            best[opt] = min(rows, key=sync_mean)
    return {"metric": "final val loss", "best": best, "grid": grid}


def _curve_metrics(by_mode: dict[str, dict[int, list]], diagnostics: bool = True) -> dict:
    """``overhead`` and ``diagnostics`` of one row from its runs' metrics lines (a diverged run's
    lines stop early: its overhead is None, its diagnostics cover what it logged)."""
    out = {}
    diag = {}
    for mode, runs in sorted(by_mode.items()) if diagnostics else ():
        per = [metrics.diagnostics(runs[s]) for s in sorted(runs)]
        diag[mode] = {"spike": stats.sample([d["spike"]["spike"] for d in per]),
                      "spike_relative": stats.sample([d["spike"]["relative"] for d in per]),
                      "spike_step": [d["spike"]["step"] for d in per],
                      "plateau_exit": stats.sample([d["plateau"]["step"] for d in per]),
                      "plateau_left": [d["plateau"]["left"] for d in per]}
    if diag:
        out["diagnostics"] = diag
    sync = by_mode.get("sync", {})
    overhead = {}
    for mode, runs in sorted(by_mode.items()):
        seeds = sorted(set(sync) & set(runs))
        if mode == "sync" or not seeds:
            continue
        per = []
        for s in seeds:
            try:
                per.append(metrics.iso_loss_overhead(sync[s], runs[s]))
            except ConfigError:  # a run that diverged before its first validation
                per.append(None)
        overhead[mode] = {"seeds": seeds, **metrics.overhead_over_seeds(per)}
    if overhead:
        out["overhead"] = overhead
    return out


def read_metrics(folder: Path) -> list[dict]:
    """The run's metrics.jsonl lines (none for a run that logged nothing)."""
    path = folder / METRICS
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def train_curve(folder: Path) -> tuple[list[int], list[float]]:
    recs = read_metrics(folder)
    return [r["step"] for r in recs], [r["train_loss"] for r in recs]


def _mean_val_curves(out: Path, cells: list[Cell], opt: str, row: dict) -> dict:
    """``{mode: (tokens, mean val loss over seeds, overhead of the mean curve vs sync's)}``."""
    curves = {}
    for mode in SWEEP_MODES:
        runs = [metrics.val_points(read_metrics(out / "cells" / c.name)) for c in cells
                if (c.optimizer, c.lr, c.momentum, c.mode) == (opt, row["lr"], row["momentum"], mode)]
        runs = [r for r in runs if r]
        n = min((len(r) for r in runs), default=0)
        if n:
            curves[mode] = [{"tokens": runs[0][i][0], "val_loss": sum(r[i][1] for r in runs) / len(runs)}
                            for i in range(n)]
    sync = curves.get("sync")
    return {mode: ([r["tokens"] for r in recs], [r["val_loss"] for r in recs],
                   None if mode == "sync" or sync is None else metrics.iso_loss_overhead(sync, recs))
            for mode, recs in curves.items()}


def write_figures(gaps: dict, out: Path, cells: list[Cell]) -> list[str]:
    from delaylab.llm import plots

    written = []
    best = gaps["best"]
    if best:  # loss curves at each optimizer's best sync lr, mean over seeds
        fig, axes = plots.grid(len(best))
        for ax, (opt, row) in zip(axes, best.items()):
            curves = {}
            for mode in SWEEP_MODES:
                runs = [train_curve(out / "cells" / c.name) for c in cells
                        if (c.optimizer, c.lr, c.momentum, c.mode) == (opt, row["lr"], row["momentum"], mode)]
                runs = [r for r in runs if r[0]]
                n = min((len(r[0]) for r in runs), default=0)
                if n:
                    curves[mode] = (runs[0][0][:n], [sum(r[1][i] for r in runs) / len(runs) for i in range(n)],
                                    len(runs))
            plots.loss_curves(curves, f"{opt} (lr {row['lr']:g}): train loss, mean over seeds", ax=ax)
        plots.save(fig, out / "llm_loss_curves.png")
        written.append("llm_loss_curves.png")

    if best:  # validation loss against tokens, mean over seeds, with the iso-loss crossings
        fig, axes = plots.grid(len(best))
        for ax, (opt, row) in zip(axes, best.items()):
            plots.iso_loss(_mean_val_curves(out, cells, opt, row), f"{opt} (lr {row['lr']:g}, mean over seeds)", ax=ax)
        plots.save(fig, out / "llm_iso_loss.png")
        written.append("llm_iso_loss.png")

    def varies(key):  # a grid over ``key`` for at least one optimizer
        return any(len({r[key] for r in gaps["grid"] if r["optimizer"] == o}) > 1 for o in best)

    momenta = {r["momentum"] for r in gaps["grid"]}
    if varies("momentum"):
        rows = {}
        for opt in best:
            for mom in momenta:
                cand = [r for r in gaps["grid"] if r["optimizer"] == opt and r["momentum"] == mom
                        and r.get("gap", {}).get("mean") is not None and r.get("sync", {}).get("mean") is not None]
                if cand:
                    r = min(cand, key=lambda r: r["sync"]["mean"])
                    rows.setdefault(opt, []).append((mom, r["gap"]["mean"], r["gap"]["std"]))
        fig = plots.gap_vs_momentum(rows)
        plots.save(fig, out / "llm_gap_vs_momentum.png")
        written.append("llm_gap_vs_momentum.png")
    if varies("lr"):
        fig, axes = plots.grid(len(best))
        for ax, (opt, brow) in zip(axes, best.items()):
            rows = {}
            for r in gaps["grid"]:
                if r["optimizer"] == opt and r["momentum"] == brow["momentum"]:
                    for mode in SWEEP_MODES:
                        if mode in r:
                            rows.setdefault(mode, []).append((r["lr"], r[mode]["mean"], r[mode]["std"]))
            plots.loss_vs_lr(rows, opt, ax=ax)
        plots.save(fig, out / "llm_loss_vs_lr.png")
        written.append("llm_loss_vs_lr.png")
    return written


def sweep(base: Config, out, optimizers, modes=("sync", "delayed", "ef"), lrs=None,
          momenta=None, seeds=1, jobs: int = 1, progress: bool | None = None) -> dict:
    """Run the grid (``jobs`` cells at a time, one thread each when ``jobs > 1``) and return gaps.json."""
    resolve(base, "simulator")
    if jobs < 1:
        raise ConfigError(f"jobs must be >= 1, got {jobs}")
    cells = plan(base, optimizers, modes, lrs, momenta, seeds)
    out = Path(out)
    # The iso-loss overhead interpolates between validations: too few cannot place the crossing.
    evals = metrics.eval_points(base.run.steps, base.run.eval_every)
    warning = None
    if evals < metrics.MIN_EVAL_POINTS:
        warning = (f"{evals} validation points per run (steps {base.run.steps}, eval_every {base.run.eval_every}): "
                   f"too coarse for the iso-loss overhead; use eval_every <= "
                   f"{max(1, base.run.steps // metrics.MIN_EVAL_POINTS)}")
        print(f"delaylab: warning: {warning}", file=sys.stderr, flush=True)
    spec_path = out / "sweep.json"
    base_dict = base.replace(progress=False).flat()
    if jobs > 1 and base.run.threads is None:
        base_dict["threads"] = 1  # two single-threaded runs use two cores better than one with two
    if spec_path.is_file():
        saved = json.loads(spec_path.read_text())["base"]
        diff = Config.from_dict(base_dict).differences(saved)
        if diff:
            raise ConfigError(f"{out} holds a sweep with another base config ({'; '.join(diff)}); use another --out")
    write_json(spec_path, {"base": base_dict, "cells": [c.name for c in cells]})
    bar = Progress("sweep", len(cells), progress)

    def finished(c: Cell, result: dict, seconds: float | None) -> None:
        results[c] = result
        loss = result.get("val_loss")
        bar.update(c.name, seconds, "diverged" if loss is None else f"val loss {loss:.3f}")

    results = {}
    try:
        if jobs == 1:
            for c in cells:
                t0 = time.perf_counter()
                finished(c, run_cell(base_dict, c, str(out / "cells" / c.name)), time.perf_counter() - t0)
        else:
            import multiprocessing as mp

            with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
                futures = {pool.submit(run_cell, base_dict, c, str(out / "cells" / c.name)): c for c in cells}
                for fut in as_completed(futures):
                    result = fut.result()
                    finished(futures[fut], result, result.get("train_time_s"))
    finally:
        bar.close()
    records = [{"optimizer": c.optimizer, "mode": c.mode, "lr": c.lr, "momentum": c.momentum,
                "seed": c.seed, "val_loss": results[c].get("val_loss"),
                "metrics": read_metrics(out / "cells" / c.name)} for c in cells]
    gaps = summarize(records)
    gaps["figures"] = write_figures(gaps, out, cells)
    gaps["steps"], gaps["preset"] = base.run.steps, base.model.preset
    gaps["eval_points"] = evals
    if warning:
        gaps["warnings"] = [warning]
    write_json(out / "gaps.json", gaps)
    return gaps
