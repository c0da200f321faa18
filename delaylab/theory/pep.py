"""Exact worst cases by performance estimation (PEPit): how far the bounds are from the truth.

A performance estimation problem (PEP; Drori & Teboulle 2014, Taylor, Hendrickx & Glineur 2017)
asks for the largest value of a performance measure after T steps of a fixed method, over *every*
L-smooth function with f(x0) - inf f <= Delta. For a method whose iterates are fixed linear
combinations of the gradients it has seen, this is a small semidefinite program in the Gram
matrix of the iterates and gradients; PEPit builds it and an open solver (Clarabel through cvxpy)
solves it. The value returned is PEPit's *dual* value, a certified upper bound on the PEP's
optimum up to the solver's accuracy; every solve checks that the relative primal-dual gap is
below ``GAP_TOL`` (1e-6; at most about 1e-7 on the docs' grid).

What is expressed here (docs/theory.md#how-tight-are-the-bounds):

* ``method="sgdm"``: deterministic SGD with EMA momentum, m_t = beta m_{t-1} + (1-beta) g_t,
  x_{t+1} = x_t - eta m_t, g_t = grad f(x_{max(t-tau,0)}) (Theorem 4's method, sigma = 0);
  ``momentum="heavyball"`` uses m_t = beta m_{t-1} + g_t (torch.optim.SGD, lr = eta), which is
  the EMA method at eta_ema = eta/(1-beta); ``ef=True`` applies Error Feedback,
  x_{t+1} = x_t + (tau+1) D_t - tau D_{t-1} with D_t = -eta m_t (the Delayed wrapper's EF).
* ``method="gd"``: plain gradient descent (sgdm with beta = 0, tau = 0), the sanity case.

Not expressible: the LMO methods (Muon, normalized SGD, sign descent). Their step
eta LMO(m_t) is not a linear combination of gradients (it is normalized, or a sign, or a polar
factor), so the iterates are not Gram-representable and the method cannot be written as a PEP. Theorems 1-3 are checked instead by their tight lemma (Lemma 3's drift-phase equality) and
on toy problems with known constants (tests/theory, tests/toy).

The reference value: ``reference="inf"`` models f(x0) - inf f <= Delta with a free scalar f_*,
f(x0) - f_* <= Delta and f_i - ||g_i||^2/(2L) >= f_* at every oracle point. Each of these holds
for every L-smooth f with inf f >= f_* (one gradient step from x_i decreases f by at least
||g_i||^2/(2L)), so the PEP is a relaxation: its value is >= the true worst case, the safe side
for "our bound >= worst case". ``reference="final"`` uses f(x0) - f(x_T) <= Delta (PEPit's own
gradient-descent example, whose tight value 4 L Delta/(3T) is the sanity test).

This module imports PEPit lazily; without it, every entry point raises
:class:`delaylab.errors.MissingExtra` naming the extra to install.
"""

from __future__ import annotations

import contextlib
import io
import time
import warnings
from dataclasses import asdict, dataclass

import numpy as np

from delaylab.errors import ConfigError, MissingExtra, install_hint

INSTALL_HINT = install_hint("pep")
METHODS = ("sgdm", "gd")
MOMENTA = ("ema", "heavyball")
METRICS = ("min", "mean")
REFERENCES = ("inf", "final")
# Largest relative primal-dual gap accepted; Clarabel reaches ~1e-8 on these sizes.
GAP_TOL = 1e-6
NOT_EXPRESSIBLE = {
    "lmo": "PEPit cannot express LMO steps (Muon, normalized SGD, sign descent): eta LMO(m) is not "
           "linear in the gradients; Theorems 1-3 are checked on toy problems and by Lemma 3's "
           "drift-phase equality instead (docs/theory.md#how-tight-are-the-bounds)",
}
REF_PEP = ("Taylor, Hendrickx & Glineur 2017, Exact worst-case performance of first-order methods for "
           "composite convex optimization, SIAM J. Optim. 27(3) (Thm 3.10: smooth interpolation); PEPit: "
           "Goujaud et al. 2024, Math. Program. Comput., arXiv:2201.04040")


def _pepit():
    """(PEP, Expression, SmoothFunction), or MissingExtra with the one-line install hint."""
    try:
        from PEPit import PEP, Expression
        from PEPit.functions import SmoothFunction
        import cvxpy  # noqa: F401  (PEPit's open-solver wrapper)
    except ImportError as err:
        raise MissingExtra(f"the PEP needs PEPit and an SDP solver ({err.name or err}); "
                           f"install them with: {INSTALL_HINT}") from None
    return PEP, Expression, SmoothFunction


def _solver() -> str:
    import cvxpy

    installed = cvxpy.installed_solvers()
    for name in ("CLARABEL", "SCS"):  # interior point first: tighter than SCS's first-order 1e-4
        if name in installed:
            return name
    raise MissingExtra(f"no open SDP solver for cvxpy (Clarabel or SCS); install one with: {INSTALL_HINT}")


def _check(method, T, eta, beta, tau, ef, momentum, metric, reference, L, Delta):
    if method in NOT_EXPRESSIBLE:
        raise ConfigError(NOT_EXPRESSIBLE[method])
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r}; the PEP covers {', '.join(METHODS)}")
    if momentum not in MOMENTA:
        raise ConfigError(f"momentum must be one of {MOMENTA}, got {momentum!r}")
    if metric not in METRICS:
        raise ConfigError(f"metric must be one of {METRICS}, got {metric!r}")
    if reference not in REFERENCES:
        raise ConfigError(f"reference must be one of {REFERENCES}, got {reference!r}")
    if isinstance(T, bool) or int(T) != T or T < 1:
        raise ConfigError(f"T must be an integer >= 1, got {T!r}")
    if isinstance(tau, bool) or int(tau) != tau or tau < 0:
        raise ConfigError(f"delay must be a non-negative integer, got {tau!r}")
    if not (np.isfinite(eta) and eta > 0):
        raise ConfigError(f"eta must be > 0, got {eta!r}")
    if not 0.0 <= beta < 1.0:
        raise ConfigError(f"beta must be in [0, 1), got {beta!r}")
    if not (np.isfinite(L) and L > 0 and np.isfinite(Delta) and Delta > 0):
        raise ConfigError(f"L and Delta must be > 0, got L={L!r}, Delta={Delta!r}")
    if method == "gd" and (beta != 0 or tau != 0 or ef):
        raise ConfigError("gd is plain gradient descent: beta 0, delay 0, no EF (use --method sgdm)")
    if int(tau) >= int(T):
        raise ConfigError(f"delay {tau} >= T {T}: every gradient would be taken at x_0")


@dataclass(frozen=True)
class WorstCase:
    """The solved PEP: ``value`` (dual, an upper bound on the optimum), ``primal`` (a lower one)."""

    value: float
    primal: float
    metric: str
    n_points: int       # distinct points where the metric looks at the gradient
    gram_size: int
    solver: str
    status: str
    gap: float          # (value - primal)/value: the solver's accuracy on this instance
    seconds: float


def worst_case(method: str = "sgdm", *, T: int, eta: float, beta: float = 0.0, tau: int = 0,
               ef: bool = False, momentum: str = "ema", metric: str = "min", reference: str = "inf",
               points: str = "gradients", L: float = 1.0, Delta: float = 1.0) -> WorstCase:
    """Worst case of ``metric`` over L-smooth f with f(x0) - (inf f or f(x_T)) <= Delta.

    ``metric``: "min" -- min_t ||grad f(p_t)||^2 (PEPit minimises over several performance
    metrics), or "mean" -- (1/T) sum_{t<T} ||grad f(y_t)||^2 with y_t = x_{max(t-tau,0)}
    counted with multiplicity, Theorem 4's left-hand side. ``points``: the p_t of "min": the
    gradients' points y_t (Theorem 4's) or "all" iterates x_0..x_T (PEPit's GD example).
    """
    _check(method, T, eta, beta, tau, ef, momentum, metric, reference, L, Delta)
    if points not in ("gradients", "all"):
        raise ConfigError(f"points must be 'gradients' or 'all', got {points!r}")
    if metric == "mean" and points != "gradients":
        raise ConfigError("the mean is over the gradients' points (Theorem 4's metric)")
    PEP, Expression, SmoothFunction = _pepit()
    T, tau = int(T), int(tau)
    pb = PEP()
    f = pb.declare_function(SmoothFunction, L=L)
    x = [pb.set_initial_point()]
    oracle = {}  # index of x -> (g, f); the method only ever queries x_0 .. x_{T-1-tau}

    def grad(i):
        if i not in oracle:
            oracle[i] = f.oracle(x[i])
        return oracle[i][0]

    m, D_prev = None, None
    ys = []
    for t in range(T):
        ys.append(max(t - tau, 0))
        g = grad(ys[-1])
        if momentum == "ema":
            m = (1 - beta) * g if m is None else beta * m + (1 - beta) * g
        else:
            m = g if m is None else beta * m + g
        D = -eta * m
        if ef and tau > 0:  # x_{t+1} = x_t + (tau+1) D_t - tau D_{t-1}, D_{-1} = 0
            step = (tau + 1) * D if D_prev is None else (tau + 1) * D - tau * D_prev
        else:
            step = D
        x.append(x[-1] + step)
        D_prev = D
    if points == "all" or reference == "final":
        for i in range(len(x)):
            grad(i)
    look = sorted(set(ys)) if points == "gradients" else list(range(len(x)))
    if metric == "min":
        for i in look:
            pb.set_performance_metric(oracle[i][0] ** 2)
    else:
        pb.set_performance_metric(sum(oracle[i][0] ** 2 for i in ys) / T)
    f0 = oracle[0][1]
    if reference == "final":
        pb.set_initial_condition(f0 - oracle[T][1] <= Delta)
    else:
        fstar = Expression()
        for g_i, f_i in oracle.values():
            pb.add_constraint(f_i - g_i ** 2 / (2 * L) >= fstar)
        pb.set_initial_condition(f0 - fstar <= Delta)
    solver = _solver()
    t0 = time.perf_counter()
    # PEPit prints even at verbose=0, and cvxpy warns on Clarabel's "almost solved"; the status and
    # the primal-dual gap are checked below instead.
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        from cvxpy.error import SolverError

        try:
            value = pb.solve(wrapper="cvxpy", solver=solver, verbose=0)
        except (ValueError, SolverError) as err:  # data that overflowed (eta L = 1e308), or too ill-conditioned
            raise ConfigError(f"the PEP does not solve at eta={eta:g}, L={L:g}, Delta={Delta:g} "
                              f"({str(err).splitlines()[0]})") from None
    seconds = time.perf_counter() - t0
    prob = pb.wrapper.prob
    if value is None or prob.value is None or prob.status not in ("optimal", "optimal_inaccurate"):
        raise ConfigError(f"the PEP did not solve ({prob.status}); try a smaller T")
    # Clarabel reports "optimal_inaccurate" when only its reduced tolerances are met; accept the
    # value only if the dual certificate and the primal example still agree closely.
    gap = (float(value) - float(prob.value)) / max(abs(float(value)), 1e-12)
    if abs(gap) > GAP_TOL:
        raise ConfigError(f"the PEP solver did not converge: relative primal-dual gap {gap:.2g} "
                          f"({prob.status}, {solver})")
    return WorstCase(value=float(value), primal=float(prob.value), metric=metric, n_points=len(look),
                     gram_size=int(pb.wrapper.G.shape[0]), solver=solver, status=str(prob.status),
                     gap=gap, seconds=seconds)


def our_bound(T: int, eta: float, beta: float = 0.0, tau: int = 0, momentum: str = "ema",
              L: float = 1.0, Delta: float = 1.0) -> dict:
    """Theorem 4 (``sgdm_bound``) at sigma = 0: our value for mean_t ||grad f(y_t)||^2.

    Heavy ball with step eta is the EMA method at eta/(1-beta) (sgdm_bound's docstring).
    ``value`` is +inf outside the bound's validity condition c > 0.
    """
    from delaylab.theory.bound import evaluate
    from delaylab.theory.bounds import sgdm_bound

    eta_ema = eta / (1 - beta) if momentum == "heavyball" else eta
    b = sgdm_bound(int(tau))
    ev = evaluate(b, L=L, Delta=Delta, sigma=0.0, T=T, eta=eta_ema, beta=beta)
    return {"bound": b.name, "theorem": "Theorem 4", "value": float(ev.value), "valid": bool(ev.valid),
            "eta_ema": eta_ema, "proof": b.proof}


@dataclass(frozen=True)
class Comparison:
    """One grid point: the PEP worst cases, our bound, and how loose it is."""

    method: str
    momentum: str
    ef: bool
    T: int
    tau: int
    eta: float
    beta: float
    L: float
    Delta: float
    worst_mean: float        # PEP: max of (1/T) sum_t ||grad f(y_t)||^2, Theorem 4's metric
    worst_min: float | None  # PEP: max of min_t ||grad f(y_t)||^2 (None: not computed)
    bound: float | None      # Theorem 4 at sigma = 0; None where no bound of ours applies
    bound_name: str | None
    valid: bool | None       # Theorem 4's condition c > 0 (None: no bound covers the method)
    ratio: float | None      # bound / worst_mean: >= 1 iff the bound holds; how loose it is
    solver: str
    gap: float               # largest relative primal-dual gap of the solves
    seconds: float

    @property
    def holds(self) -> bool | None:
        return None if self.bound is None else self.bound >= self.worst_mean

    def as_dict(self) -> dict:
        return dict(asdict(self), holds=self.holds)


def compare(method: str = "sgdm", *, T: int, eta: float, beta: float = 0.0, tau: int = 0, ef: bool = False,
            momentum: str = "ema", L: float = 1.0, Delta: float = 1.0, with_min: bool = True) -> Comparison:
    """The PEP worst case (f(x0) - inf f <= Delta) against our noise-free bound, if one covers it.

    Only Theorem 4 covers these methods (the LMO bounds are for normalized steps); SGDM with EF
    (tau > 0) has no bound of ours, so ``bound`` is None there and only the worst case is reported.
    """
    kw = dict(T=T, eta=eta, beta=beta, tau=tau, ef=ef, momentum=momentum, L=L, Delta=Delta)
    solves = [worst_case(method, metric="mean", **kw)]
    if with_min:
        solves.append(worst_case(method, metric="min", **kw))
    bound = name = valid = ratio = None
    if not (ef and tau > 0):  # EF with lag 0 is the plain method
        ob = our_bound(T, eta, beta, tau, momentum, L, Delta)
        name, valid = ob["bound"], ob["valid"]
        bound = ob["value"] if valid else None
        ratio = None if bound is None else bound / solves[0].value
    return Comparison(method, momentum, bool(ef), int(T), int(tau), float(eta), float(beta), float(L),
                      float(Delta), solves[0].value, solves[1].value if with_min else None, bound, name,
                      valid, ratio, solves[0].solver, max(abs(w.gap) for w in solves),
                      sum(w.seconds for w in solves))


# The grid of docs/theory.md: T in 2..12, tau in {0, 1, 2}, beta in {0, 0.5, 0.9}, and eta a fraction
# of Theorem 4's step-size cap (beyond it the bound says nothing).
GRID_T = (2, 4, 6, 8, 10, 12)
GRID_TAU = (0, 1, 2)
GRID_BETA = (0.0, 0.5, 0.9)
GRID_FRAC = (0.5, 0.9)


def eta_cap(beta: float, tau: int, L: float = 1.0) -> float:
    """Theorem 4's largest step size (``sgdm_bound(tau).eta_max``), EMA parametrisation."""
    from delaylab.theory import symbols as S
    from delaylab.theory.bounds import sgdm_bound

    return float(sgdm_bound(int(tau)).eta_max.subs({S.L: L, S.beta: beta}))


def sweep(Ts=None, taus=None, betas=None, fracs=None, L: float = 1.0, Delta: float = 1.0,
          with_min: bool = True) -> list[Comparison]:
    """``compare`` for SGDM over the grid (default: the GRID_* above, the docs' table),
    eta = frac * eta_cap(beta, tau); T <= tau is skipped."""
    Ts, taus = Ts or GRID_T, taus or GRID_TAU
    betas, fracs = betas or GRID_BETA, fracs or GRID_FRAC
    rows = []
    for tau in taus:
        for beta in betas:
            for frac in fracs:
                eta = frac * eta_cap(beta, tau, L)
                rows += [compare("sgdm", T=T, eta=eta, beta=beta, tau=tau, L=L, Delta=Delta, with_min=with_min)
                         for T in Ts if T > tau]
    return rows


def tightness_table(rows: list[Comparison]) -> str:
    """Markdown: one line per (tau, beta, eta), the ratio bound / worst case for each T."""
    Ts = sorted({r.T for r in rows})
    groups: dict[tuple, dict[int, Comparison]] = {}
    for r in rows:
        groups.setdefault((r.tau, r.beta, r.eta), {})[r.T] = r
    lines = ["| tau | beta | eta (x cap) | " + " | ".join(f"T={T}" for T in Ts) + " |",
             "|---|---|---|" + "---|" * len(Ts)]
    for (tau, beta, eta), by_T in groups.items():
        frac = eta / eta_cap(beta, tau, rows[0].L)
        cells = []
        for T in Ts:
            r = by_T.get(T)
            cells.append("-" if r is None or r.ratio is None else f"{r.ratio:.2f}" + ("" if r.holds else " FAIL"))
        lines.append(f"| {tau} | {beta:g} | {eta:.4g} ({frac:.2g}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_tightness(rows: list[Comparison]):
    """Bound / PEP worst case against T, one panel per delay; returns the matplotlib Figure."""
    import sys

    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:  # a script or the CLI: no display needed
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    taus = sorted({r.tau for r in rows})
    fig, axes = plt.subplots(1, len(taus), figsize=(4 * len(taus), 3.6), sharey=True, squeeze=False)
    betas = sorted({r.beta for r in rows})
    for ax, tau in zip(axes[0], taus):
        lines: dict[tuple, list[Comparison]] = {}
        for r in rows:
            if r.tau == tau and r.ratio is not None:
                lines.setdefault((r.beta, round(r.eta / eta_cap(r.beta, tau, r.L), 3)), []).append(r)
        for (beta, frac), rs in sorted(lines.items()):
            rs = sorted(rs, key=lambda r: r.T)
            ax.semilogy([r.T for r in rs], [r.ratio for r in rs], marker="o", ms=3,
                        color=f"C{betas.index(beta)}", ls="-" if frac < 0.75 else "--",
                        label=f"beta={beta:g}, eta={frac:g} cap")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_title(f"delay tau = {tau}")
        ax.set_xlabel("T (updates)")
    axes[0][0].set_ylabel("Theorem 4 / PEP worst case")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=7, frameon=False)
    fig.suptitle("SGDM, sigma = 0: bound over exact worst case of mean ||grad f||^2 (1 = tight)", fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig
