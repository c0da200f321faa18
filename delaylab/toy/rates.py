"""Measured rates against the bounds of :mod:`delaylab.theory`, on the toy problems.

Three checks, each putting theory's prediction next to the measurement:

* :func:`rate_check` -- for each T on a grid, run with the (eta, beta) that theory's ``tune``
  gives for T and the problem's constants, and compare the measured average
  ``(1/T) sum_t E||grad f||_*`` (mean over seeds, t-interval) with the bound: it must stay
  below (the upper end of the interval <= bound, at every T) and its log-log slope must be at
  most the bound's exponent plus a stated tolerance.
* :func:`delay_cost` -- at fixed (eta, beta), the delayed-minus-sync gap (paired seeds: the
  two runs see the same noise) against the bound's delay term: the gap should grow with eta
  and shrink relative to the sync value as beta grows.
* :func:`compare` -- sync vs delayed vs delayed+EF per method at one fixed beta, all measured
  in one norm, with the bound's predicted penalty and EF's measured direction drift.

Which bound goes with which run (measured quantity in brackets):

* lmo-*: Theorem 1 (``lmo_bound(tau)``) [mean ||grad f(x_t)||_* over the iterates]; with EF,
  Theorem 3 at the real point (``lmo_bound(tau, ef=True, point="real")``) with the measured
  drift delta_bar [mean over the points the applied gradients were taken at]. EF runs use the
  plain delayed run's tuned (eta, beta), since delta_bar is only known after the run.
  Per-block delays with the sign LMO (whose ball is the product of the blocks' balls) use
  tau = max of the blocks' delays, since every block is at most that many steps stale.
* sgdm: Theorem 4 (``sgdm_bound(tau)``, on mean E||grad||_2^2) [root mean square of ||grad||_2
  at the gradient points, so measured and bound are on the norm's scale by Jensen].
* adam and dc-asgd: no bound; Adam runs with the sign LMO's tuned parameters (Adam is close
  to sign descent with momentum) and is measured only.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Sequence

import numpy as np
import torch

from delaylab.errors import ConfigError
from delaylab.stats import t_bounds
from delaylab.theory import evaluate, lmo_bound, sgdm_bound, tune
from delaylab.toy.problems import Problem
from delaylab.toy.runs import METHODS, OptimizerFactory, Trajectory, get_method, run, run_optimizer, sgdm_lr

DEFAULT_TS = (100, 400, 1600, 6400)
SLOPE_TOLERANCE = 0.1
"""Allowed excess of the fitted slope over the bound's exponent (slopes of -0.21 to -0.26 against
-1/4 were measured over T = 1e3 .. 1.6e4 when the check was designed)."""
CONFIDENCE = 0.95

Progress = Callable[[dict], None]
"""What the checks report to: called with a small dict after every run. If it also has a
``start(total)`` method, each check calls that once, after every input is checked and before
the first run, with the number of calls that follow (a progress bar's total; the command's run
folder is written from there on, so bad input leaves none behind)."""


def start_progress(progress: Progress | None, total: int) -> None:
    """Tell ``progress`` (where it listens) that the inputs are valid and ``total`` runs follow."""
    start = getattr(progress, "start", None)
    if start is not None:
        start(total)


def interval(samples: torch.Tensor, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(mean, low, high): the Student-t interval of the mean of per-seed values
    (:func:`delaylab.stats.t_bounds`, the one every report uses); one seed gives (mean, mean, mean)."""
    x = samples.detach().double().cpu().numpy().ravel()
    mean = float(x.mean())
    if x.size < 2:
        return mean, mean, mean
    lo, hi = t_bounds(x, confidence)
    return mean, float(lo), float(hi)


def loglog_slope(ts: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of log(value) against log(T)."""
    if len(ts) < 2:
        return math.nan
    return float(np.polyfit(np.log(np.asarray(ts, float)), np.log(np.asarray(values, float)), 1)[0])


def _max_delay(delay: int | Sequence[int]) -> int:
    return int(delay) if isinstance(delay, int) else max(int(d) for d in delay)


class Setting:
    """A (problem, method, delay, correction) with the theory that applies to it.

    ``constants`` are the problem's, in the method's norm, updated by ``overrides`` (e.g.
    ``{"L": L / 100}`` to plant a wrong constant and see the check fail). ``make_optimizer``
    runs a user's optimizer in place of the registry's (one tensor per seed, through
    :func:`~delaylab.toy.runs.run_optimizer`, with every group's lr set to the tuned eta): an
    optimizer that declares itself the LMO method ``method`` in its norm is held to that
    method's bound.
    """

    def __init__(self, problem: Problem, method: str, delay: int | Sequence[int] = 0,
                 correction: str = "none", overrides: dict | None = None,
                 make_optimizer: OptimizerFactory | None = None):
        self.problem, self.method = problem, get_method(method)
        self.make_optimizer = make_optimizer
        if make_optimizer is not None and (self.method.norm is None or not isinstance(delay, int)):
            raise ConfigError("a user optimizer is checked against an LMO method's bound, with one delay")
        self.delay, self.correction = delay, correction
        self.tau = _max_delay(delay)
        self.blocks = 1 if isinstance(delay, int) else len(delay)
        norm = self.method.norm or "l2"
        if self.method.name == "adam":
            norm = "sign"  # tuned as sign descent
        problem.check_norm(norm)
        self.constants = dict(problem.constants(norm), tau=self.tau, **(overrides or {}))
        self.measure_norm = self.method.measure_norm
        self.bound, self.tune_bound = self._bounds()

    def _bounds(self):
        """(the bound to check, the bound to tune with); the first is None where none applies."""
        m, corr = self.method, self.correction
        tune_bound = sgdm_bound(self.tau) if m.name == "sgdm" else lmo_bound(self.tau)
        if m.name == "adam" or corr == "dc-asgd":
            return None, tune_bound
        if self.blocks > 1 and (m.norm != "sign" or corr == "ef"):
            # blocks turn the l2/spectral ball into a product of balls; no blockwise EF bound
            return None, tune_bound
        if corr == "ef":
            return (None if m.name == "sgdm" else lmo_bound(self.tau, ef=True, point="real")), tune_bound
        return tune_bound, tune_bound

    def tuned(self, steps: int, beta: float | None = None):
        return tune(self.tune_bound, steps, self.constants, beta=beta)

    def torch_lr(self, eta: float, beta: float) -> float:
        return sgdm_lr(eta, beta) if self.method.name == "sgdm" else eta

    def run(self, eta: float, beta: float, steps: int, seeds: int, seed: int) -> Trajectory:
        if self.make_optimizer is not None:
            return run_optimizer(self.problem, self.make_optimizer, lr=eta, steps=steps, seeds=seeds, seed=seed,
                                 delay=self.delay, correction=self.correction, norms=(self.measure_norm,),
                                 direction_norm=self.method.norm if self.correction == "ef" else None)
        return run(self.problem, self.method.name, lr=self.torch_lr(eta, beta), beta=beta, steps=steps,
                   seeds=seeds, seed=seed, delay=self.delay, correction=self.correction,
                   norms=(self.measure_norm,))

    def measured(self, traj: Trajectory) -> torch.Tensor:
        """Per-seed value of the quantity ``self.bound`` speaks about (see the module docstring)."""
        if self.method.name == "sgdm":
            return traj.at_gradient_points("l2", self.tau).pow(2).mean(dim=0)
        if self.correction == "ef":
            return traj.at_gradient_points(self.measure_norm, self.tau).mean(dim=0)
        return traj.mean_grad_norm(self.measure_norm)

    def bound_value(self, traj: Trajectory, eta: float, beta: float, steps: int) -> tuple[float | None, dict]:
        if self.bound is None:
            return None, {}
        consts = dict(self.constants, eta=eta, beta=beta, T=steps)
        if "delta_bar" in self.bound.symbols:
            consts["delta_bar"] = min(float(traj.delta_bar().mean()), 2.0)
        ev = evaluate(self.bound, **consts)
        extra = {"delta_bar": consts["delta_bar"]} if "delta_bar" in consts else {}
        return float(ev.value), {"terms": dict(ev.terms), **extra}

    @property
    def power(self) -> int:
        return self.bound.power if self.bound is not None else 1


def _horizons(steps: Sequence[int], seeds: int) -> list[int]:
    """The sorted distinct horizons T (each run once), with ``seeds`` checked."""
    ts = sorted({int(t) for t in steps})
    if not ts or ts[0] < 1:
        raise ConfigError(f"every T must be >= 1, got {ts}")
    if seeds < 1:
        raise ConfigError(f"seeds must be >= 1, got {seeds}")
    return ts


def rate_check(
    problem: Problem,
    method: str,
    *,
    steps: Sequence[int] = DEFAULT_TS,
    delay: int | Sequence[int] = 0,
    correction: str = "none",
    seeds: int = 16,
    seed: int = 0,
    tolerance: float = SLOPE_TOLERANCE,
    overrides: dict | None = None,
    beta: float | None = None,
    make_optimizer: OptimizerFactory | None = None,
    progress: Callable[[dict], None] | None = None,
) -> dict:
    """Run the rate check (module docstring) and return its JSON-ready result.

    ``beta`` fixes the momentum (theory then tunes eta alone); by default the tuning picks
    both. ``make_optimizer`` (with ``beta``: its own momentum) runs a user's optimizer that
    declares itself the LMO ``method``, as :class:`Setting` says.

    Keys: ``holds`` (every bound check and the slope check pass; None when no bound applies),
    ``slope`` (fitted), ``exponent`` (the bound's, for the gradient norm), ``tolerance``,
    ``bound_slope`` (the tuned bound's own slope over the same grid), ``points`` (per T:
    ``T``, ``eta``, ``beta``, ``measured``, ``ci``, ``bound``, ``ratio``, ``holds``,
    ``terms``), ``seconds`` and the setting.
    """
    start = time.perf_counter()
    steps = _horizons(steps, seeds)
    if beta is not None and not 0 <= beta < 1:
        raise ConfigError(f"beta must be in [0, 1), got {beta}")
    if make_optimizer is not None and beta is None:
        raise ConfigError("a user optimizer keeps its own momentum: pass it as beta")
    setting = Setting(problem, method, delay, correction, overrides, make_optimizer)
    start_progress(progress, len(steps))
    ef = correction == "ef"
    points, exponent = [], None
    for i, t in enumerate(steps):
        # EF has no tuning of its own (delta_bar is measured): it runs at the delayed tuning.
        tuned = setting.tuned(t, beta=beta)
        exponent = tuned.exponent_norm
        traj = setting.run(tuned.eta, tuned.beta, t, seeds, seed + i)
        mean, lo, hi = interval(setting.measured(traj))
        bound, info = setting.bound_value(traj, tuned.eta, tuned.beta, t)
        root = 1.0 / setting.power
        point = {
            "T": t,
            "eta": tuned.eta,
            "beta": tuned.beta,
            "lr": setting.torch_lr(tuned.eta, tuned.beta),
            "measured": mean**root,
            "ci": [max(lo, 0.0) ** root, hi**root],
            "bound": None if bound is None else bound**root,
            "ratio": None if bound is None else (mean / bound) ** root,
            "holds": None if bound is None else bool(hi <= bound),
            **info,
        }
        points.append(point)
        if progress:
            progress(point)
    ts = [p["T"] for p in points]
    slope = loglog_slope(ts, [p["measured"] for p in points])
    has_bound = setting.bound is not None
    slope_ok = bool(slope <= exponent + tolerance) if len(ts) > 1 else True
    result = {
        "problem": problem.name,
        "method": method,
        "delay": delay,
        "correction": correction,
        "beta": beta,
        "norm": setting.measure_norm,
        "metric": ("rms ||grad f||_2 at the gradient points" if setting.method.name == "sgdm"
                   else f"mean ||grad f||_* ({setting.measure_norm} dual)"
                   + (" at the gradient points" if ef else " over the iterates")),
        "bound_name": None if not has_bound else setting.bound.name,
        "seeds": seeds,
        "constants": setting.constants,
        "holds": (all(p["holds"] for p in points) and slope_ok) if has_bound else None,
        "bound_holds": all(p["holds"] for p in points) if has_bound else None,
        "slope": slope,
        "exponent": exponent,
        "tolerance": tolerance,
        "slope_holds": slope_ok,
        "bound_slope": loglog_slope(ts, [p["bound"] for p in points]) if has_bound else None,
        "points": points,
        "seconds": time.perf_counter() - start,
    }
    return result


# -- the delay's cost at fixed (eta, beta) ------------------------------------------------------


def _paired(problem: Problem, method: str, eta: float, beta: float, steps: int, tau, seeds: int, seed: int,
            norm: str, correction: str = "none") -> dict:
    """Sync and delayed runs on the same noise (same seed: call c draws the same sample), so
    their per-seed difference isolates the delay."""
    sync = Setting(problem, method, 0)
    kw = dict(lr=sync.torch_lr(eta, beta), beta=beta, steps=steps, seeds=seeds, seed=seed, norms=(norm,))
    a = run(problem, method, **kw).mean_grad_norm(norm)
    b = run(problem, method, delay=tau, correction=correction, **kw).mean_grad_norm(norm)
    s_mean, _, _ = interval(a)
    gap, lo, hi = interval(b - a)
    return {"sync": s_mean, "delayed": float(b.mean()), "gap": gap, "gap_ci": [lo, hi],
            "relative_gap": gap / s_mean}


def _predicted_gap(setting_sync: Setting, setting_delayed: Setting, eta: float, beta: float, steps: int):
    """The bound's delay cost at (eta, beta): bound(tau) - bound(0), absolute and relative to
    bound(0), and the delay term over the momentum term (``tau (1-beta)/beta`` for LMO)."""
    if setting_delayed.bound is None or setting_sync.bound is None or setting_sync.bound.power != 1:
        return None, None, None
    consts = dict(setting_sync.constants, eta=eta, beta=beta, T=steps)
    b0 = float(evaluate(setting_sync.bound, **consts).value)
    ev = evaluate(setting_delayed.bound, **dict(consts, tau=setting_delayed.tau))
    momentum = ev.terms.get("momentum", 0.0)
    ratio = ev.terms["delay"] / momentum if momentum > 0 else None
    return float(ev.value) - b0, (float(ev.value) - b0) / b0, ratio


def _monotone(values: Sequence[float], increasing: bool) -> bool:
    d = np.diff(np.asarray(values, float))
    return bool(np.all(d > 0) if increasing else np.all(d < 0))


def delay_cost(
    problem: Problem,
    method: str,
    *,
    steps: int = 1000,
    delay: int = 1,
    etas: Sequence[float] | None = None,
    betas: Sequence[float] = (0.0, 0.5, 0.8, 0.9, 0.95, 0.99),
    eta_scales: Sequence[float] = (0.25, 0.5, 1.0, 2.0, 4.0),
    beta: float = 0.9,
    beta_sweep_eta: str = "tuned",
    seeds: int = 8,
    seed: int = 0,
    progress: Callable[[dict], None] | None = None,
) -> dict:
    """Delayed-minus-sync gap at fixed (eta, beta), measured against the bound's delay term.

    Every row is one (eta, beta), run synchronously and delayed on the same noise. Sweep 1
    varies eta at ``beta`` (default etas: ``eta_scales`` times the sync bound's best eta at
    that beta). Sweep 2 varies beta, with eta the sync bound's best eta at each beta
    (``beta_sweep_eta="tuned"``, where theory would run it) or held at its value for
    ``beta`` (``"fixed"``). Theorem 1 predicts a gap bound of ``2 L eta tau`` (linear in eta)
    and a delay term that shrinks relative to the sync bound, and to the momentum term
    (``tau (1-beta)/beta``), as beta grows. Gaps are in the method's own dual norm.
    """
    start = time.perf_counter()
    if steps < 1:
        raise ConfigError(f"T must be >= 1, got {steps}")
    if seeds < 1:
        raise ConfigError(f"seeds must be >= 1, got {seeds}")
    if delay < 1:
        raise ConfigError(f"delay must be >= 1 for a delay cost, got {delay}")
    if beta_sweep_eta not in ("tuned", "fixed"):
        raise ConfigError(f"beta_sweep_eta must be 'tuned' or 'fixed', got {beta_sweep_eta!r}")
    sync, delayed = Setting(problem, method, 0), Setting(problem, method, delay)
    norm = sync.measure_norm
    eta0 = sync.tuned(steps, beta=beta).eta
    if etas is None:
        etas = [eta0 * s for s in eta_scales]
    start_progress(progress, len(etas) + len(betas))

    def row(e, b):
        meas = _paired(problem, method, e, b, steps, delay, seeds, seed, norm)
        pg, pr, pm = _predicted_gap(sync, delayed, e, b, steps)
        out = {"eta": e, "beta": b, **meas, "predicted_gap": pg, "predicted_relative_gap": pr,
               "delay_over_momentum": pm}
        if progress:
            progress(out)
        return out

    eta_rows = [row(e, beta) for e in etas]
    beta_rows = [row(eta0 if beta_sweep_eta == "fixed" else sync.tuned(steps, beta=b).eta, b) for b in betas]
    have_prediction = eta_rows[0]["predicted_gap"] is not None
    trends = {
        "gap_grows_with_eta": {
            "measured": _monotone([r["gap"] for r in eta_rows], True),
            "predicted": _monotone([r["predicted_gap"] for r in eta_rows], True) if have_prediction else None,
        },
        "relative_gap_shrinks_with_beta": {
            "measured": _monotone([r["relative_gap"] for r in beta_rows], False),
            "predicted": (_monotone([r["predicted_relative_gap"] for r in beta_rows], False)
                          if have_prediction else None),
        },
    }
    return {
        "problem": problem.name, "method": method, "delay": delay, "T": steps, "seeds": seeds,
        "norm": norm, "beta_sweep_eta": beta_sweep_eta, "eta_sweep": eta_rows, "beta_sweep": beta_rows,
        "trends": trends, "seconds": time.perf_counter() - start,
    }


# -- sync vs delayed vs EF, per method ------------------------------------------------------------

MODES = {"sync": (False, "none"), "delayed": (True, "none"), "ef": (True, "ef"), "dc-asgd": (True, "dc-asgd")}


def compare(
    problem: Problem,
    methods: Sequence[str] = tuple(METHODS),
    *,
    steps: int = 1000,
    delay: int = 1,
    beta: float = 0.9,
    eta_scale: float = 1.0,
    modes: Sequence[str] = ("sync", "delayed", "ef"),
    norm: str | None = None,
    seeds: int = 8,
    seed: int = 0,
    progress: Callable[[dict], None] | None = None,
) -> dict:
    """Each method at one fixed ``beta`` and its sync-tuned eta, in every mode, in one norm.

    ``eta_scale`` multiplies every method's tuned eta (the delay's cost grows with eta).
    All runs of a method share the seed, so they see the same noise and their gaps are
    paired. ``norm`` (default: the problem's first, spectral for matrices) is the common
    yardstick ``mean_t ||grad f(x_t)||_*`` for every method. Per method the result carries
    the measured means and intervals, the gaps relative to sync, EF's recovered fraction
    of the delay gap, its measured direction drift delta_bar, and the bound's predicted
    relative cost of the delay (Theorem 1's delay term over the sync bound, at the same
    eta and beta) where a bound applies.
    """
    start = time.perf_counter()
    if steps < 1:
        raise ConfigError(f"T must be >= 1, got {steps}")
    if seeds < 1:
        raise ConfigError(f"seeds must be >= 1, got {seeds}")
    if delay < 1:
        raise ConfigError(f"delay must be >= 1 for a comparison, got {delay}")
    if not eta_scale > 0:
        raise ConfigError(f"eta_scale must be > 0, got {eta_scale}")
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ConfigError(f"unknown mode {bad[0]!r}; expected one of {', '.join(MODES)}")
    norm = norm or problem.norms[0]
    problem.check_norm(norm)
    syncs = [Setting(problem, name, 0) for name in methods]
    start_progress(progress, len(methods) * len(modes))
    rows = []
    for name, sync in zip(methods, syncs):
        eta = eta_scale * sync.tuned(steps, beta=beta).eta
        row = {"method": name, "eta": eta, "beta": beta, "lr": sync.torch_lr(eta, beta)}
        values = {}
        for mode in modes:
            delayed, corr = MODES[mode]
            traj = run(problem, name, lr=sync.torch_lr(eta, beta), beta=beta, steps=steps, seeds=seeds,
                       seed=seed, delay=delay if delayed else 0, correction=corr, norms=(norm,))
            values[mode] = traj.mean_grad_norm(norm)
            mean, lo, hi = interval(values[mode])
            row[mode] = {"mean": mean, "ci": [lo, hi]}
            if mode == "ef" and traj.direction_change is not None:
                row["delta_bar"] = float(traj.delta_bar().mean())
            if progress:
                progress({"method": name, "mode": mode, "eta": eta, "beta": beta, **row[mode]})
        if "sync" in values:
            base = values["sync"]
            for mode in modes:
                if mode != "sync":
                    gap, lo, hi = interval((values[mode] - base) / base.mean())
                    row[mode]["relative_gap"] = gap
                    row[mode]["relative_gap_ci"] = [lo, hi]
            if "delayed" in values and "ef" in values:
                full = float((values["delayed"] - base).mean())
                row["ef_recovers"] = float((values["delayed"] - values["ef"]).mean()) / full if full > 0 else None
                # EF's gain, paired by seed, relative to sync's mean: the interval finding 6 scores
                gain, lo, hi = interval((values["delayed"] - values["ef"]) / base.mean())
                row["ef_gain"], row["ef_gain_ci"] = gain, [lo, hi]
        _, pred, _ = _predicted_gap(sync, Setting(problem, name, delay), eta, beta, steps)
        row["predicted_relative_gap"] = pred
        rows.append(row)
    return {"problem": problem.name, "shape": list(problem.shape), "T": steps, "delay": delay, "beta": beta,
            "eta_scale": eta_scale, "seeds": seeds, "norm": norm, "modes": list(modes), "rows": rows,
            "seconds": time.perf_counter() - start}


# -- the rate suite (what CI runs on a reduced grid) -------------------------------------------

SUITE_MODES = ((0, "none"), (1, "none"), (1, "ef"))
"""sync, delay 1, delay 1 with EF."""


def suite_modes(delays: Sequence[int] = (1,)) -> tuple[tuple[int, str], ...]:
    """sync, then each delay without and with EF (``(1,)``: :data:`SUITE_MODES`)."""
    return ((0, "none"), *((int(t), c) for t in delays for c in ("none", "ef")))


def suite_settings(problem_names: Sequence[str], methods: Sequence[str] | None = None,
                   modes: Sequence[tuple[int, str]] = SUITE_MODES) -> list[tuple[str, str, int, str]]:
    """Every (problem, LMO method, delay, correction) whose norm the problem has a constant for."""
    from delaylab.toy.problems import PROBLEMS

    methods = methods or [m.name for m in METHODS.values() if m.norm is not None]
    out = []
    for name in problem_names:
        norms = PROBLEMS[name].norms
        for method in methods:
            if get_method(method).norm in norms:
                out.extend((name, method, d, c) for d, c in modes)
    return out


def rate_suite(
    problem_names: Sequence[str],
    methods: Sequence[str] | None = None,
    *,
    steps: Sequence[int] = DEFAULT_TS,
    seeds: int = 16,
    seed: int = 0,
    tolerance: float = SLOPE_TOLERANCE,
    progress: Progress | None = None,
    delays: Sequence[int] = (1,),
) -> dict:
    """:func:`rate_check` for every setting of :func:`suite_settings` on the problems' default
    instances, at sync and at each of ``delays`` without and with EF; each result gets
    ``max_ratio`` (measured / bound, max over T) and every metrics item its setting. ``holds``:
    every check holds."""
    from delaylab.toy.problems import PROBLEMS, make_problem

    start = time.perf_counter()
    bad = [n for n in problem_names if n not in PROBLEMS]
    if bad:
        raise ConfigError(f"unknown problem {bad[0]!r}; expected one of {', '.join(PROBLEMS)}")
    lmo = [m.name for m in METHODS.values() if m.norm is not None]
    if methods is not None and any(m not in lmo for m in methods):
        raise ConfigError(f"the rate suite runs the LMO methods only ({', '.join(lmo)})")
    if not delays or any(isinstance(t, bool) or int(t) != t or t < 1 for t in delays):
        raise ConfigError(f"the suite's delays must be integers >= 1, got {list(delays)}")
    settings = suite_settings(problem_names, methods, suite_modes(delays))
    start_progress(progress, len(settings) * len(_horizons(steps, seeds)))
    results = []
    for name, method, delay, corr in settings:
        context = {"problem": name, "method": method, "delay": delay, "correction": corr}
        item = None if progress is None else (lambda x, c=context: progress({**c, **x}))
        r = rate_check(make_problem(name), method, steps=steps, delay=delay, correction=corr, seeds=seeds,
                       seed=seed, tolerance=tolerance, progress=item)
        r["max_ratio"] = max(p["ratio"] for p in r["points"])
        results.append(r)
    return {"holds": all(r["holds"] for r in results), "T": list(steps), "seeds": seeds, "tolerance": tolerance,
            "results": results, "seconds": time.perf_counter() - start}
