"""Profile any torch optimizer under a gradient delay: ``profile(make_optimizer, ...)``.

``make_optimizer(params) -> torch.optim.Optimizer`` is any factory (torch's, pytorch-optimizer's,
the user's own). On each problem of the toy suite it runs S seeds as S parameters of the
problem's shape (so Muon sees matrices) through :func:`delaylab.toy.runs.run_optimizer`, hence
through :class:`delaylab.optim.Delayed`, for every mode -- sync, and each delay with and without
EF -- at every lr of a grid (the factory's own lrs times ``lr_scales``). All runs share the
seed, so call c draws the same noise in every mode and the per-seed ratios are paired.

Reported per problem and mode (``metric``: ``(1/T) sum_{t<T} ||grad f(x_t)||_*`` in ``norm``,
the quantity the bounds speak about):

* the best metric at ``T = max(steps)`` over the lr grid, with a 95% t-interval over seeds. A
  seed whose loss f(x_{T-1}) is above f(x_0) counts as diverged (inf), as does one that blew up:
  on the saturating problems (cauchy, logdet, the Cauchy-loss regressions) the gradient vanishes
  far out, so an unstable optimizer that escapes would otherwise score well;
* the delay cost: delayed / sync per seed, each at its own best lr (``cost_best``) and both at
  the sync-best lr (``cost_at_sync_lr``), with intervals. The best lrs are picked on the same
  seeds they are reported on (a small optimistic bias, equal for every mode);
* the log-log slope of the best-over-lr metric against T (constant lr, so the prefix of the
  longest run is the run of length T: one run per lr gives every T);
* once per profile, the largest stable lr on :class:`~delaylab.toy.problems.Quadratic`
  (noise-free, curvature lambda) per mode, by bisection on the lr, next to the linear-stability
  prediction of :mod:`delaylab.theory.stability` when the optimizer's type is declared
  (:class:`Declared`); unstable means the loss grows: its mean over the last quarter of the run
  exceeds twice its mean over the second quarter and ends above f(x0) (or it blew up). For a
  linear method (SGD, heavy ball, EMA momentum) this finds the linear threshold (measured: within
  5% for momentum <= 0.9; 1.2-1.8x above it for momentum 0.99, whose growth is too slow to show
  in 200 steps: tests/toy/test_profile.py). For Adam- and LMO-type methods there is no linear
  threshold; what is found is the lr at which their self-limiting oscillation on the quadratic
  ends above the starting loss, which need not be monotone in the delay;
* for an optimizer declared an LMO method in a norm with momentum beta: the rate check of
  :func:`delaylab.toy.rates.rate_check` (theory-tuned eta at that beta, measured vs bound),
  the same function ``delaylab toy rates`` runs.

Independent seeds: an optimizer whose step of one parameter reads the others (group-level
statistics: a global gradient norm, a shared trust ratio) would couple the seeds. Before
each problem :func:`seeds_coupled` steps two copies of the optimizer whose second parameter
gets different gradients; if the first parameter's trajectory changes, every seed gets an
optimizer of its own (``seeds_coupled: true`` in the result).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Sequence

import torch

from delaylab.errors import ConfigError
from delaylab.optim import LMOMomentum
from delaylab.optim.declared import Declared, infer_declared
from delaylab.toy.problems import PROBLEMS, Problem, Quadratic, make_problem
from delaylab.toy.rates import Progress, interval, loglog_slope, rate_check, start_progress
from delaylab.toy.report import mode_label
from delaylab.toy.runs import OptimizerFactory, build, get_method, run_optimizer

DEFAULT_DELAYS = (0, 1, 2)
DEFAULT_LR_SCALES = (0.25, 0.5, 1.0, 2.0, 4.0)
DEFAULT_STEPS = (25, 50, 100, 200)
DEFAULT_SEEDS = 8
STABILITY_STEPS = 200
STABILITY_RANGE = (1e-4, 1e4)  # scanned lr scales; a threshold outside it is reported as 0 or inf
STABILITY_RTOL = 0.05


def registry_optimizer(method: str, lr: float, beta: float) -> OptimizerFactory:
    """A factory for a method of ``toy rates``' registry, as :func:`delaylab.toy.runs.run` builds it
    (per seed: ``batch_dims=0``). ``lr`` is the torch lr (for sgdm: ``eta (1 - beta)``)."""
    m = get_method(method)

    def make(params):
        groups = [{"params": [p]} for p in params]
        if m.norm is not None:
            return LMOMomentum(groups, lr=lr, beta=beta, norm=m.norm, method="svd")
        if m.name == "sgdm":
            return torch.optim.SGD(groups, lr=lr, momentum=beta)
        return torch.optim.Adam(groups, lr=lr, betas=(beta, 0.999))

    make.__qualname__ = method
    return make


def seeds_coupled(make_optimizer: OptimizerFactory, problem: Problem, steps: int = 3) -> bool:
    """Whether a parameter's trajectory depends on another parameter's gradient (module docstring)."""
    gen = torch.Generator().manual_seed(0)
    a = [problem.x0.clone(), problem.x0.clone()]
    b = [problem.x0.clone(), problem.x0.clone()]
    oa, ob = build(make_optimizer, a), build(make_optimizer, b)
    for _ in range(steps):
        g0 = torch.randn(problem.shape, generator=gen, dtype=problem.x0.dtype)
        g1 = torch.randn(problem.shape, generator=gen, dtype=problem.x0.dtype)
        a[0].grad, a[1].grad = g0.clone(), g1
        b[0].grad, b[1].grad = g0.clone(), 100.0 * g1.flip(0)
        oa.step()
        ob.step()
    return not torch.allclose(a[0], b[0], rtol=1e-12, atol=0.0)


def _modes(delays: Sequence[int], ef: bool) -> list[tuple[int, str]]:
    out = [(0, "none")]
    for d in sorted(set(delays) - {0}):
        out.append((d, "none"))
        if ef:
            out.append((d, "ef"))
    return out


def _stats(values: torch.Tensor) -> dict:
    """Mean and 95% interval over seeds; a diverged seed makes all three inf."""
    if not torch.isfinite(values).all():
        return {"mean": math.inf, "ci": [math.inf, math.inf]}
    mean, lo, hi = interval(values)
    return {"mean": mean, "ci": [lo, hi]}


def _check_inputs(delays, lr_scales, steps, seeds) -> tuple[list[int], list[float], list[int]]:
    delays = [int(d) for d in delays]
    if not delays or any(d < 0 for d in delays):
        raise ConfigError(f"delays must be integers >= 0, got {list(delays)}")
    if not any(d > 0 for d in delays):
        raise ConfigError("delays must contain a delay >= 1 (sync is always run)")
    scales = sorted({float(s) for s in lr_scales})
    if not scales or not all(s > 0 and math.isfinite(s) for s in scales):
        raise ConfigError(f"lr_scales must be finite numbers > 0, got {list(lr_scales)}")
    ts = sorted({int(t) for t in steps})
    if not ts or ts[0] < 1:
        raise ConfigError(f"every T must be >= 1, got {list(steps)}")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ConfigError(f"seeds must be an integer >= 1, got {seeds!r}")
    return delays, scales, ts


def _problem_list(problems) -> list[Problem]:
    out = []
    for p in (tuple(PROBLEMS) if problems is None else problems):
        if isinstance(p, Problem):
            out.append(p)
        elif isinstance(p, str):
            if p not in PROBLEMS:
                raise ConfigError(f"unknown problem {p!r}; expected one of {', '.join(PROBLEMS)}")
            out.append(make_problem(p))
        else:
            raise ConfigError(f"a problem is a name or a Problem instance, got {type(p).__name__}")
    if not out:
        raise ConfigError("no problem to profile")
    return out


def _built(make_optimizer: OptimizerFactory, problem: Problem) -> tuple[torch.optim.Optimizer | None, str | None]:
    """``make_optimizer`` on ``problem``'s shape, or (None, why) where its own code refused the
    shape (e.g. Muon on a vector); one that returns no optimizer at all is an error."""
    try:
        return build(make_optimizer, [problem.x0.clone()]), None
    except ConfigError as err:
        if err.__cause__ is None:
            raise
        return None, str(err)


@dataclass
class _Plan:
    """What :func:`profile` runs, fixed (and every input checked) before the first run."""

    name: str
    declare: Declared | None
    source: str | None
    norm: str
    delays: list[int]
    scales: list[float]
    ts: list[int]
    modes: list[tuple[int, str]]
    problems: list[tuple[Problem, bool, float]]  # the ones it runs on: (problem, seeds coupled, base lr)
    skipped: list[dict]
    stability: bool
    stability_skipped: str | None  # why the optimizer cannot run on the quadratic
    bound_problems: list[Problem] | None  # None: no bound check

    @property
    def runs(self) -> int:
        """How many runs (progress calls) :func:`profile` makes."""
        modes = len(self.modes)
        return (len(self.problems) * modes * len(self.scales)
                + (modes if self.stability and self.stability_skipped is None else 0)
                + len(self.bound_problems or ()) * modes)


def _plan(make_optimizer, problems, delays, ef, lr_scales, steps, seeds, norm, declare, stability_check,
          bound_check, name) -> _Plan:
    delays, scales, ts = _check_inputs(delays, lr_scales, steps, seeds)
    plist = _problem_list(problems)
    name = name or getattr(make_optimizer, "__qualname__", None) or repr(make_optimizer)
    source = "given" if declare is not None else None
    if declare is None and getattr(make_optimizer, "declared", None) is not None:
        declare, source = make_optimizer.declared, "given"
    if declare is None:  # inferred from the optimizer built on the first problem it accepts
        for problem in plist:
            opt, _ = _built(make_optimizer, problem)
            if opt is not None:
                declare = infer_declared(opt)
                source = "inferred" if declare is not None else None
                break
    if norm is None:
        norm = declare.norm if declare is not None and declare.kind == "lmo" else "l2"
    runnable, skipped = [], []
    for problem in plist:
        if norm not in problem.norms:
            skipped.append({"problem": problem.name, "reason": f"no constant for the {norm} norm"})
            continue
        probe, why = _built(make_optimizer, problem)
        if probe is None:
            skipped.append({"problem": problem.name, "reason": why})
            continue
        runnable.append((problem, seeds_coupled(make_optimizer, problem), float(probe.param_groups[0]["lr"])))
    if not runnable:
        raise ConfigError("the optimizer ran on no problem: " + "; ".join(f"{s['problem']}: {s['reason']}"
                                                                            for s in skipped))
    stability_skipped = _built(make_optimizer, Quadratic())[1] if stability_check else None
    lmo = bound_check and declare is not None and declare.kind == "lmo"
    return _Plan(name, declare, source, norm, delays, scales, ts, _modes(delays, ef), runnable, skipped,
                 stability_check, stability_skipped,
                 [p for p in plist if declare.norm in p.norms] if lmo else None)


def profile(
    make_optimizer: OptimizerFactory,
    *,
    problems: Sequence[str | Problem] | None = None,
    delays: Sequence[int] = DEFAULT_DELAYS,
    ef: bool = True,
    lr_scales: Sequence[float] = DEFAULT_LR_SCALES,
    steps: Sequence[int] = DEFAULT_STEPS,
    seeds: int = DEFAULT_SEEDS,
    seed: int = 0,
    norm: str | None = None,
    declare: Declared | None = None,
    stability_check: bool = True,
    bound_check: bool = True,
    bound_steps: Sequence[int] | None = None,
    name: str | None = None,
    progress: Progress | None = None,
) -> dict:
    """Profile ``make_optimizer`` under delays (module docstring); returns a JSON-ready dict.

    Args:
        make_optimizer: ``make_optimizer(params) -> torch.optim.Optimizer``.
        problems: names of the suite (default: all of it) or :class:`Problem` instances. A
            problem the factory cannot build on (Muon on a vector) is listed under
            ``skipped`` with the factory's error; if none is left it raises ConfigError.
        delays: the delays; sync (0) always runs. ``ef``: also each delay >= 1 with EF.
        lr_scales: the lr grid, as multiples of every group's lr as the factory sets it.
        steps: the horizons T (one run of ``max(steps)`` per lr; the rest are its prefixes).
        seeds, seed: independent runs and the noise seed (shared by every mode: paired).
        norm: the dual norm of the metric (default: the declared LMO norm, else ``l2``).
        declare: the optimizer's type (default: ``make_optimizer.declared`` if set, else
            :func:`~delaylab.optim.declared.infer_declared`); it enables the stability
            prediction and, for ``lmo``, the bound check (``bound_steps``, default
            ``(min(steps), max(steps))``).
        stability_check: measure the largest stable lr on :class:`Quadratic`.
        progress: :data:`delaylab.toy.rates.Progress`; every input is checked (and the factory
            built on each problem) before its ``start``.
    """
    start = time.perf_counter()
    plan = _plan(make_optimizer, problems, delays, ef, lr_scales, steps, seeds, norm, declare, stability_check,
                 bound_check, name)
    start_progress(progress, plan.runs)
    modes, ts, declare = plan.modes, plan.ts, plan.declare
    results = [_profile_problem(make_optimizer, problem, modes, plan.scales, ts, seeds, seed, plan.norm, coupled,
                                base_lr, progress) for problem, coupled, base_lr in plan.problems]
    out = {
        "optimizer": plan.name,
        "declared": None if declare is None else asdict(declare),
        "declared_source": plan.source,
        "norm": plan.norm,
        "metric": f"mean_t<T ||grad f(x_t)||_* ({plan.norm} dual) at T = {ts[-1]}",
        "delays": plan.delays, "ef": ef, "lr_scales": plan.scales, "steps": ts, "seeds": seeds, "seed": seed,
        "problems": results,
        "skipped": plan.skipped,
    }
    if plan.stability and plan.stability_skipped is None:
        coupled = any(r["seeds_coupled"] for r in results)
        out["stability"] = stability_profile(make_optimizer, modes, declare, coupled, progress=progress)
    elif plan.stability:  # an optimizer that takes no matrices
        out["stability"], out["stability_skipped"] = None, plan.stability_skipped
    if plan.bound_problems is not None:
        out["bound_check"] = _bound_checks(make_optimizer, plan.bound_problems, modes, declare,
                                           bound_steps or (ts[0], ts[-1]), seeds, seed, progress)
    out["seconds"] = time.perf_counter() - start
    return out


def _profile_problem(make_optimizer, problem, modes, scales, ts, seeds, seed, norm, coupled, base_lr,
                     progress) -> dict:
    idx = torch.tensor(ts) - 1
    counts = torch.tensor(ts, dtype=torch.float64).unsqueeze(1)
    per_mode = []
    for delay, corr in modes:
        # prefix[i] is (len(ts), S): the metric at every T for lr scale i
        prefix = []
        for s in scales:
            traj = run_optimizer(problem, make_optimizer, steps=ts[-1], lr_scale=s, seeds=seeds, seed=seed,
                                 delay=delay, correction=corr, norms=(norm,), per_seed_optimizers=coupled)
            metric = traj.grad_norm[norm].cumsum(dim=0)[idx] / counts
            # A run whose loss ends above its start has left the basin; on the saturating problems
            # the gradient vanishes far out, so the gradient norm alone would reward escaping.
            prefix.append(metric.masked_fill(traj.value[idx] > traj.value[0], math.inf))
            if progress:
                progress({"problem": problem.name, "mode": mode_label(delay, corr), "lr": s * base_lr,
                          "metric": float(prefix[-1][-1].mean())})
        per_mode.append(torch.stack(prefix))  # (lrs, Ts, S)
    sync = per_mode[0]
    final = lambda v: v[:, -1].mean(dim=1)  # noqa: E731  (lrs,) mean over seeds at max T; inf if any diverged
    sync_best = int(torch.argmin(final(sync)))
    rows = []
    for (delay, corr), v in zip(modes, per_mode):
        means = final(v)
        best = int(torch.argmin(means))
        best_per_t = v.mean(dim=2).min(dim=0).values  # (Ts,) best lr at each T
        row = {
            "delay": delay, "correction": corr, "mode": mode_label(delay, corr),
            "lrs": [s * base_lr for s in scales],
            "values": [float(x) for x in means],
            "diverged": [int((~torch.isfinite(v[i, -1])).sum()) for i in range(len(scales))],
            "best_lr": scales[best] * base_lr,
            "best_at_edge": best in (0, len(scales) - 1),
            "best": _stats(v[best, -1]),
            "rate": {"T": ts, "best": [float(x) for x in best_per_t],
                     "slope": (loglog_slope(ts, best_per_t.tolist())
                               if bool(torch.isfinite(best_per_t).all()) and len(ts) > 1 else math.nan)},
        }
        if delay:
            row["cost_best"] = _stats(v[best, -1] / sync[sync_best, -1])
            row["cost_at_sync_lr"] = _stats(v[sync_best, -1] / sync[sync_best, -1])
        rows.append(row)
    return {"problem": problem.name, "shape": list(problem.shape), "base_lr": base_lr, "seeds_coupled": coupled,
            "modes": rows}


# -- linear stability on the quadratic ----------------------------------------------------------------


def _grows(make_optimizer, problem, scale, delay, corr, coupled) -> bool:
    traj = run_optimizer(problem, make_optimizer, steps=STABILITY_STEPS, lr_scale=scale, seeds=1, delay=delay,
                         correction=corr, norms=("l2",), per_seed_optimizers=coupled)
    f = traj.value[:, 0]
    q = STABILITY_STEPS // 4
    late, mid = float(f[3 * q:].mean()), float(f[q:2 * q].mean())
    # Growing and above the start: an oscillation that settles (Adam near 0, an LMO's steps of
    # fixed length) is bounded, and a run that converged and then wobbles ends below f(x0).
    return bool(traj.diverged.any()) or not (late <= 2.0 * mid or float(f[3 * q:].max()) <= float(f[0]))


def largest_stable_scale(make_optimizer, problem, delay, corr, coupled=False) -> float:
    """The largest lr scale at which the loss on ``problem`` does not grow (module docstring).

    A geometric scan by factors of 4 from scale 1 (up while stable, down while not) within
    :data:`STABILITY_RANGE`, then bisection in log-space to a relative width of
    :data:`STABILITY_RTOL`; 0 or inf when the threshold lies outside the range. It assumes one
    threshold (stable below, unstable above), which is what the linear recursions have.
    """
    lo_edge, hi_edge = STABILITY_RANGE
    grows = lambda s: _grows(make_optimizer, problem, s, delay, corr, coupled)  # noqa: E731
    if grows(1.0):
        hi = 1.0
        while True:
            lo = hi / 4.0
            if lo < lo_edge:
                return 0.0
            if not grows(lo):
                break
            hi = lo
    else:
        lo = 1.0
        while True:
            hi = lo * 4.0
            if hi > hi_edge:
                return math.inf
            if grows(hi):
                break
            lo = hi
    while hi / lo > 1.0 + STABILITY_RTOL:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if _grows(make_optimizer, problem, mid, delay, corr, coupled) else (mid, hi)
    return lo


def stability_profile(make_optimizer, modes, declare: Declared | None, coupled: bool = False,
                      problem: Quadratic | None = None, progress=None) -> dict:
    """Largest stable lr per mode on the quadratic, measured and (if declared) predicted."""
    problem = problem or Quadratic()
    base_lr = float(build(make_optimizer, [problem.x0.clone()]).param_groups[0]["lr"])
    rows = []
    for delay, corr in modes:
        scale = largest_stable_scale(make_optimizer, problem, delay, corr, coupled)
        pred = None if declare is None else declare.predicted_stable_lr(delay, corr == "ef", problem.curvature)
        rows.append({"delay": delay, "correction": corr, "mode": mode_label(delay, corr),
                     "measured_lr": scale * base_lr, "predicted_lr": pred})
        if progress:
            progress({"stability": mode_label(delay, corr), "measured_lr": scale * base_lr, "predicted_lr": pred})
    sync_m, sync_p = rows[0]["measured_lr"], rows[0]["predicted_lr"]
    for r in rows:
        r["measured_ratio"] = _ratio(r["measured_lr"], sync_m)
        r["predicted_ratio"] = None if sync_p is None else _ratio(r["predicted_lr"], sync_p)
    return {"problem": problem.name, "shape": list(problem.shape), "curvature": problem.curvature,
            "steps": STABILITY_STEPS, "scan": list(STABILITY_RANGE), "rtol": STABILITY_RTOL,
            "criterion": "f grows: mean over the last quarter > 2 x mean over the second quarter and "
                         "its max > f(x0); or blow-up",
            "modes": rows}


def _ratio(a: float, b: float) -> float | None:
    """a / b; None where it says nothing (no threshold found for sync, or none at all)."""
    if math.isinf(b) or b == 0:
        return None
    return a / b


# -- the bound check, for a declared LMO method ---------------------------------------------------------


def _bound_checks(make_optimizer, problems, modes, declare, steps, seeds, seed, progress) -> list[dict]:
    out = []
    method = f"lmo-{declare.norm}"
    for problem in problems:
        for delay, corr in modes:
            r = rate_check(problem, method, steps=steps, delay=delay, correction=corr, seeds=seeds, seed=seed,
                           beta=declare.beta, make_optimizer=make_optimizer)
            if progress:
                progress({"bound_check": problem.name, "mode": mode_label(delay, corr), "holds": r["holds"]})
            out.append({"problem": problem.name, "mode": mode_label(delay, corr), **{
                k: r[k] for k in ("delay", "correction", "bound_name", "holds", "bound_holds", "slope", "exponent",
                                  "tolerance", "slope_holds", "points")}})
    return out


__all__ = ["profile", "registry_optimizer", "seeds_coupled", "stability_profile",
           "largest_stable_scale"]
