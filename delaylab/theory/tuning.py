"""Tuning a bound over (eta, beta): sympy closed forms, checked by a scipy minimisation.

Derivation (docs/theory.md#tuning-and-rate): every LMO bound has the shape
a/eta + b(beta) eta + c(beta), so for a given beta the best step is exactly
eta*(beta) = sqrt(a/b) with value 2 sqrt(a b) + c. With noise, 1 - beta = A T^(-1/2)
balances the momentum's bias (grows as 1/(1-beta)) against its noise (shrinks as
sqrt(1-beta)); sympy takes the T -> infinity limit of T^(1/4) times the value and solves
for the best A. Without noise (sigma = 0) beta = 0 is optimal. The SGDM bound grows with
beta at every eta (beta enters only through the staleness kappa), so its beta* is 0 and
eta = E T^(-1/2) is tuned to leading order.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
import sympy as sp

from delaylab.errors import ConfigError
from delaylab.theory import symbols as S
from delaylab.theory.bound import Bound, _compiled, check_constants, check_norm_of, evaluate
from delaylab.theory.bounds import get_bound

_A = sp.Symbol("A", positive=True)   # 1 - beta = A / sqrt(T)
_E = sp.Symbol("E", positive=True)   # eta = E / sqrt(T) (SGDM)


@dataclass(frozen=True)
class ClosedForm:
    """Symbolic tuned parameters and value (expressions in T and the constants).

    ``beta`` can be negative at small T (then the stochastic regime has not begun; numeric
    use clips it to 0). ``exponent`` is lim_{T->oo} log(value)/log(T), by sympy.
    """

    eta: sp.Expr
    beta: sp.Expr
    value: sp.Expr
    exponent: sp.Expr
    eta_of_beta: sp.Expr | None = None   # exact best eta for a given beta (LMO bounds)
    regime: str = "stochastic"


def _eta_structure(expr: sp.Expr):
    """(a, b, c) with expr == a/eta + b eta + c, or None if expr has another shape."""
    parts = sp.collect(sp.expand(expr), S.eta, evaluate=False)
    if not set(parts) <= {1 / S.eta, S.eta, sp.Integer(1)} or 1 / S.eta not in parts:
        return None
    a, b, c = parts[1 / S.eta], parts.get(S.eta, sp.Integer(0)), parts.get(sp.Integer(1), sp.Integer(0))
    if any(S.eta in x.free_symbols for x in (a, b, c)):
        return None
    return a, b, c


_s = sp.Symbol("s", positive=True)     # T = s^(-4): the ansatz powers of T become integers in s
_SIGMA_POS = sp.Symbol("sigma", positive=True)


def leading(expr: sp.Expr) -> tuple[sp.Expr, sp.Expr]:
    """(c, r) with expr ~ c T^r as T -> infinity (sympy leading term)."""
    lt = sp.sympify(expr).subs(S.T, _s ** -4).as_leading_term(_s)
    c, p = lt.as_coeff_exponent(_s)
    if _s in c.free_symbols:
        raise RuntimeError(f"could not find the leading term of {expr}")
    return c, -p / 4


def _positive_root(expr: sp.Expr, var: sp.Symbol, what: str) -> sp.Expr:
    sols = [x for x in sp.solve(expr, var) if x.is_positive]
    if len(sols) != 1:
        raise RuntimeError(f"no unique positive {what}: {sols}")
    return sols[0]


@functools.lru_cache(maxsize=64)
def closed_form(bound: Bound, noise_free: bool = False) -> ClosedForm:
    """The tuned (eta*, beta*, value*) of ``bound`` in closed form, from sympy."""
    expr = bound.expr
    # With noise, sigma > 0: tell sympy so it can pick the positive root.
    expr = expr.subs(S.sigma, 0) if noise_free else expr.subs(S.sigma, _SIGMA_POS)
    regime = "noise-free" if noise_free else "stochastic"
    beta_fixed = noise_free or bound.power == 2 or S.beta not in expr.free_symbols
    if beta_fixed:  # see the module docstring: beta* = 0 in these cases
        expr = expr.subs(S.beta, 0)
    shape = _eta_structure(expr)
    eta_of_beta = None
    if shape is not None:
        a, b, c = shape
        eta_of_beta = sp.sqrt(a / b)
        value_b = 2 * sp.sqrt(a * b) + c
        if beta_fixed:
            beta_star = sp.Integer(0)
        else:
            lead, _ = leading(value_b.subs(S.beta, 1 - _A / sp.sqrt(S.T)))
            beta_star = 1 - _positive_root(sp.diff(lead, _A), _A, "1-beta") / sp.sqrt(S.T)
        eta_star = eta_of_beta.subs(S.beta, beta_star)
        value = value_b.subs(S.beta, beta_star)
    elif not noise_free:  # SGDM: eta = E / sqrt(T) to leading order
        lead, _ = leading(expr.subs(S.eta, _E / sp.sqrt(S.T)))
        eta_star = _positive_root(sp.diff(lead, _E), _E, "eta") / sp.sqrt(S.T)
        beta_star = sp.Integer(0)
        value = expr.subs(S.eta, eta_star)
    else:  # SGDM without noise: the bound is Delta h(eta) / T, minimised exactly
        num, _ = sp.fraction(sp.together(sp.diff(expr, S.eta)))
        eta_star = _positive_root(num, S.eta, "eta")
        beta_star = sp.Integer(0)
        value = expr.subs(S.eta, eta_star)
    _, exponent = leading(value)
    back = {_SIGMA_POS: S.sigma}
    return ClosedForm(eta_star.subs(back), beta_star.subs(back), value.subs(back), exponent,
                      None if eta_of_beta is None else eta_of_beta.subs(back), regime)


def leading_order(bound: Bound, noise_free: bool = False) -> dict[str, tuple[sp.Expr, sp.Expr]]:
    """Leading terms (c, r), meaning c T^r, of the tuned eta, 1 - beta and value."""
    cf = closed_form(bound, noise_free)
    sub = {} if noise_free else {S.sigma: _SIGMA_POS}
    out = {"eta": leading(cf.eta.subs(sub)), "value": leading(cf.value.subs(sub))}
    if cf.beta != 0:
        out["1-beta"] = leading((1 - cf.beta).subs(sub))
    back = {_SIGMA_POS: S.sigma}
    return {k: (c.subs(back), r) for k, (c, r) in out.items()}


@dataclass(frozen=True)
class Tuned:
    """Result of :func:`tune`.

    ``eta``, ``beta``, ``value``: the minimiser of the full bound (scipy, started from the
    closed form). ``closed``: the closed form's (eta, beta, value), the value evaluated on the
    full bound. ``rel_gap`` = closed value / numeric value - 1 (>= 0 up to round-off).
    ``exponent``: the rate in T of the tuned bound (sympy limit); ``exponent_norm`` the same
    for the gradient norm (exponent / power).
    """

    eta: float
    beta: float
    value: float
    terms: dict
    exponent: float
    exponent_norm: float
    closed: dict = field(default_factory=dict)
    rel_gap: float = 0.0
    regime: str = "stochastic"

    def as_dict(self) -> dict:
        return {"eta": self.eta, "beta": self.beta, "value": self.value, "exponent": self.exponent,
                "exponent_norm": self.exponent_norm, "terms": self.terms, "closed_form": self.closed,
                "rel_gap": self.rel_gap, "regime": self.regime}


def _scalar_fn(bound: Bound, consts: dict):
    """f(eta, beta) -> bound value (inf where a validity condition fails), constants bound."""
    names, fns, conds = _compiled(bound)

    def f(eta: float, beta: float) -> float:
        vals = dict(consts, eta=eta, beta=beta)
        args = [vals[n] for n in names]
        with np.errstate(all="ignore"):
            if not all(bool(c(*args)) for c in conds):
                return math.inf
            v = float(sum(fn(*args) for fn in fns.values()))
        return v if math.isfinite(v) else math.inf
    return f


@functools.lru_cache(maxsize=64)
def _eta_max_fn(bound: Bound):
    args = [S.BY_NAME[n] for n in bound.symbols if n != "eta"]
    return [a.name for a in args], sp.lambdify(args, bound.eta_max, "math")


def eta_cap(bound: Bound, beta: float, consts: dict) -> float:
    """Largest eta the bound's validity conditions allow (inf when there are none)."""
    if not bound.conditions:
        return math.inf
    if bound.eta_max is None:
        raise ConfigError(f"{bound.name} has conditions but no eta_max")
    names, fn = _eta_max_fn(bound)
    vals = dict(consts, beta=beta)
    return float(fn(*[vals[n] for n in names]))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def _logit(p: float) -> float:
    p = min(max(p, 1e-15), 1 - 1e-15)
    return math.log(p / (1 - p))


def _minimise(bound: Bound, consts: dict, eta0: float, beta0: float, beta_fixed: float | None):
    """Numeric minimum of the full bound over (eta, beta), from several starts (Nelder-Mead)."""
    from scipy.optimize import minimize

    f = _scalar_fn(bound, consts)

    def unpack(x):
        beta = beta_fixed if beta_fixed is not None else 1.0 - _sigmoid(x[-1])
        if bound.conditions:
            eta = eta_cap(bound, beta, consts) * _sigmoid(x[0])
        else:
            eta = math.exp(x[0])
        return eta, beta

    def obj(x):
        eta, beta = unpack(x)
        return f(eta, beta) if eta > 0 else math.inf

    def start(eta, beta):
        u = _logit(eta / eta_cap(bound, beta, consts)) if bound.conditions else math.log(eta)
        return [u] if beta_fixed is not None else [u, _logit(1.0 - beta)]

    b0 = beta_fixed if beta_fixed is not None else beta0
    # the closed form is near the optimum; a second, distant start guards against a local minimum
    starts = [start(eta0, b0), start(eta0 * 3, 0.5 if beta_fixed is None else b0)]
    best = None
    for x0 in starts:
        r = minimize(obj, np.array(x0, dtype=float), method="Nelder-Mead",
                     options={"xatol": 1e-9, "fatol": 1e-14, "maxiter": 2000})
        if best is None or r.fun < best.fun:
            best = r
    return unpack(best.x), float(best.fun)


def _consts_for(bound: Bound, T: float, constants: dict) -> dict:
    constants = check_norm_of(bound, constants)
    for k in ("eta", "beta"):
        if k in constants:
            raise ConfigError(f"tune chooses {k}; do not pass it in constants (use beta= to fix beta)")
    vals = check_constants(dict(constants, T=T))
    need = [n for n in bound.symbols if n not in ("eta", "beta") and n not in vals]
    if need:
        raise ConfigError(f"{bound.name} needs constant(s) {', '.join(need)}")
    return {k: float(v) for k, v in vals.items()}


@functools.lru_cache(maxsize=64)
def _closed_numeric(bound: Bound, noise_free: bool):
    cf = closed_form(bound, noise_free)
    args = [S.BY_NAME[n] for n in bound.symbols if n not in ("eta", "beta")]
    if S.T not in args:
        args.append(S.T)
    beta_fn = sp.lambdify(args, cf.beta, "math")
    eta_fn = sp.lambdify(args, cf.eta, "math")
    eob_fn = sp.lambdify(args + [S.beta], cf.eta_of_beta, "math") if cf.eta_of_beta is not None else None
    return cf, [a.name for a in args], beta_fn, eta_fn, eob_fn


def tune(bound: Bound, T: float, constants: dict, beta: float | None = None) -> Tuned:
    """Minimise ``bound`` over (eta, beta) at horizon ``T`` (``beta=`` fixes beta).

    ``constants`` gives the other constants (L, Delta, sigma, rho, G0, tau, delta_bar, ...),
    and optionally the ``norm`` they are in, which must be the bound's. Returns the numeric minimiser of the full bound, with the closed form alongside.
    """
    if isinstance(T, bool) or not float(T) >= 1:
        raise ConfigError(f"T must be >= 1, got {T!r}")
    consts = _consts_for(bound, float(T), constants)
    if "Delta" in consts and not consts["Delta"] > 0:
        raise ConfigError("tuning needs Delta > 0 (with f(x0) = inf f there is nothing to minimise)")
    try:
        return _tune(bound, consts, beta)
    except ArithmeticError as err:  # the closed form overflows or divides by 0 at extreme constants
        shown = ", ".join(f"{k}={float(v):g}" for k, v in consts.items())
        raise ConfigError(f"{bound.name} cannot be tuned at {shown} ({type(err).__name__})") from None


def _tune(bound: Bound, consts: dict, beta: float | None) -> Tuned:
    if beta is not None:
        check_constants({"beta": beta})
    noise_free = consts.get("sigma", 1.0) == 0.0
    cf, names, beta_fn, eta_fn, eob_fn = _closed_numeric(bound, noise_free)
    cargs = [consts[n] for n in names]
    if beta is not None:
        b_cf = float(beta)
    else:
        b_cf = min(max(float(beta_fn(*cargs)), 0.0), 1.0 - 1e-15)
    if eob_fn is not None:
        e_cf = float(eob_fn(*cargs, b_cf))
    else:
        e_cf = float(eta_fn(*cargs))
        cap = eta_cap(bound, b_cf, consts)
        e_cf = min(e_cf, 0.5 * cap)
    v_cf = float(evaluate(bound, **consts, eta=e_cf, beta=b_cf).value)
    (e_num, b_num), v_num = _minimise(bound, consts, e_cf, b_cf, beta)
    if not v_num <= v_cf:  # the closed form is itself a candidate
        e_num, b_num, v_num = e_cf, b_cf, v_cf
    ev = evaluate(bound, **consts, eta=e_num, beta=b_num)
    exponent = float(cf.exponent)
    return Tuned(
        eta=e_num, beta=b_num, value=float(ev.value), terms=dict(ev.terms), exponent=exponent,
        exponent_norm=exponent / bound.power,
        closed={"eta": e_cf, "beta": b_cf, "value": v_cf},
        rel_gap=v_cf / v_num - 1.0 if v_num > 0 else 0.0,
        regime=cf.regime,
    )


@functools.lru_cache(maxsize=32)
def penalty_limit(method: str = "lmo", ef: bool = False, nesterov: bool = False, init: str = "zero",
                  noise_free: bool = False) -> sp.Expr:
    """lim_{T->oo} of tuned delayed bound / tuned sync bound, with tau symbolic (sympy).

    1 for every method with noise (the delay is lower order); a constant > 1 without noise.
    """
    sync = closed_form(get_bound(method, 0, False, nesterov, init), noise_free).value
    delayed = closed_form(get_bound(method, None, ef, nesterov, init), noise_free).value
    sub = {} if noise_free else {S.sigma: _SIGMA_POS}
    c, r = leading((delayed / sync).subs(sub))
    if r != 0:
        return sp.oo if r > 0 else sp.Integer(0)
    return sp.simplify(c.subs(_SIGMA_POS, S.sigma))


@dataclass(frozen=True)
class Penalty:
    """Result of :func:`delay_penalty`. ``ratio``: tuned delayed / tuned sync bound.

    ``limit``: the ratio's T -> infinity limit (sympy; 1 means the delay is lower order).
    ``relative_penalty``: delay term / momentum term at the delayed bound's parameters,
    which is tau (1-beta)/beta for plain delay (None where the bound has no such terms).
    """

    ratio: float
    delayed: Tuned
    sync: Tuned
    limit: float | None
    relative_penalty: float | None

    def as_dict(self) -> dict:
        return {"ratio": self.ratio, "limit": self.limit, "relative_penalty": self.relative_penalty,
                "delayed": self.delayed.as_dict(), "sync": self.sync.as_dict()}


def delay_penalty(T: float, tau: int, constants: dict, method: str = "lmo", ef: bool = False,
                  nesterov: bool = False, init: str = "zero", beta: float | None = None) -> Penalty:
    """How much a delay ``tau`` costs at the tuned parameters: bound(tau) / bound(0).

    ``beta`` fixes the momentum (then only eta is tuned); otherwise both are tuned.
    """
    if isinstance(tau, bool) or int(tau) != tau or tau < 0:
        raise ConfigError(f"delay must be a non-negative integer, got {tau!r}")
    sync = tune(get_bound(method, 0, False, nesterov, init), T, constants, beta=beta)
    delayed = tune(get_bound(method, int(tau), ef, nesterov, init), T, constants, beta=beta)
    noise_free = float(constants.get("sigma", 1.0)) == 0.0
    lim = penalty_limit(method, ef, nesterov, init, noise_free)
    lim = lim.subs(S.tau, int(tau))
    lim_val = float(lim) if lim.is_number and lim.is_finite else None
    rel = None
    if "momentum" in delayed.terms and delayed.terms["momentum"] > 0:
        rel = delayed.terms["delay"] / delayed.terms["momentum"]
    return Penalty(delayed.value / sync.value, delayed, sync, lim_val, rel)
