"""The :class:`Bound` object and its vectorised numeric evaluation.

A bound is a sum of named sympy terms plus the data a reader needs to trust it: the
assumptions it rests on, the conditions under which it is valid, the section of
``docs/theory.md`` that proves it, and the papers it takes constants from.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import sympy as sp

from delaylab.errors import ConfigError
from delaylab.theory import symbols as S

DOCS = "docs/theory.md"


@dataclass(frozen=True)
class Assumption:
    """One assumption, as data: an id used in docs/theory.md and the constants it defines."""

    id: str
    statement: str
    constants: tuple[str, ...] = ()


ASSUMPTIONS: dict[str, Assumption] = {
    a.id: a
    for a in (
        Assumption("A1", "f is bounded below: Delta = f(x0) - inf f < inf", ("Delta",)),
        Assumption(
            "A2",
            "L-smooth in the method's norm: ||grad f(x) - grad f(y)||_* <= L ||x - y||",
            ("L",),
        ),
        Assumption(
            "A3",
            "unbiased fresh samples: g_t = grad f(y_t) + xi_t with E[xi_t | past] = 0, "
            "y_t determined by the past",
        ),
        Assumption(
            "A4",
            "bounded Euclidean variance E[||xi_t||_2^2 | past] <= sigma^2 and norm "
            "equivalence ||v||_* <= rho ||v||_2 (noise constant sigma_* = rho sigma)",
            ("sigma", "rho"),
        ),
        Assumption(
            "A5",
            "mean direction drift: (1/T) sum_t E||d_{t-1} - d_{t-2}|| <= delta_bar "
            "(measured on the run; delta_bar <= 2 holds always)",
            ("delta_bar",),
        ),
        Assumption(
            "A2e",
            "L-smooth in the Euclidean norm: ||grad f(x) - grad f(y)||_2 <= L ||x - y||_2",
            ("L",),
        ),
        Assumption(
            "A4e",
            "bounded Euclidean variance E[||xi_t||_2^2 | past] <= sigma^2",
            ("sigma",),
        ),
    )
}


@dataclass(frozen=True)
class Bound:
    """An upper bound on ``metric``, the sum of its named ``terms`` (sympy expressions).

    ``power`` is the power of the gradient norm in ``metric`` (1 for the LMO bounds on
    mean E||grad f||_*, 2 for SGD-type bounds on mean E||grad f||_2^2), so tools can put
    both on one scale as ``value ** (1 / power)`` (Jensen). ``conditions`` are sympy
    relations that must hold for the bound to apply; :func:`evaluate` reports the bound as
    +inf where one fails; ``eta_max``, if set, is the largest step size they allow (in closed
    form). ``options`` records how the bound was built (delay, ef, ...).
    ``norm`` is the norm that L, G0 and rho must be in (one of
    :data:`delaylab.theory.assumptions.NORMS`; None: the method's norm, whichever it is):
    :func:`evaluate` and :func:`delaylab.theory.tune` refuse constants that carry another
    (``constants["norm"]``, as :func:`delaylab.theory.assumptions.estimate_constants` returns them).
    """

    name: str
    metric: str
    terms: tuple[tuple[str, sp.Expr], ...]
    assumptions: tuple[str, ...]
    proof: str
    references: tuple[str, ...] = ()
    conditions: tuple[sp.Basic, ...] = ()
    power: int = 1
    options: tuple[tuple[str, object], ...] = ()
    notes: str = ""
    eta_max: sp.Expr | None = None
    norm: str | None = None

    @property
    def expr(self) -> sp.Expr:
        return sp.Add(*(e for _, e in self.terms))

    @property
    def term_dict(self) -> dict[str, sp.Expr]:
        return dict(self.terms)

    @property
    def symbols(self) -> tuple[str, ...]:
        """Names of the constants the bound needs, in a fixed order."""
        free = set()
        for e in [e for _, e in self.terms] + list(self.conditions):
            free |= sp.sympify(e).free_symbols
        return tuple(s.name for s in S.ALL if s in free)

    @property
    def option(self) -> dict[str, object]:
        return dict(self.options)

    def subs(self, **values) -> "Bound":
        """The same bound with some constants fixed (e.g. ``tau=0``); numbers stay exact."""
        rep = {S.BY_NAME[k]: sp.nsimplify(v) for k, v in values.items()}
        terms = tuple((n, sp.simplify(e.subs(rep))) for n, e in self.terms)
        conds = tuple(c.subs(rep) for c in self.conditions)
        conds = tuple(c for c in conds if c is not sp.true)
        eta_max = None if self.eta_max is None else self.eta_max.subs(rep)
        return Bound(self.name, self.metric, terms, self.assumptions, self.proof, self.references,
                     conds, self.power, self.options + tuple(values.items()), self.notes, eta_max, self.norm)

    def latex(self) -> str:
        return sp.latex(self.expr)

    def describe(self) -> str:
        lines = [f"{self.name}: {self.metric} <=", f"  {self.expr}"]
        lines += [f"  {n:>10} = {e}" for n, e in self.terms]
        if self.conditions:
            lines.append("  valid if " + ", ".join(str(c) for c in self.conditions))
        lines.append("  assumes " + "; ".join(f"{a}: {ASSUMPTIONS[a].statement}" for a in self.assumptions))
        if self.norm is not None:
            lines.append(f"  constants in the {self.norm} norm")
        lines.append(f"  proof: {self.proof}")
        if self.references:
            lines.append("  references: " + "; ".join(self.references))
        return "\n".join(lines)


@dataclass(frozen=True)
class Evaluation:
    """Numeric value of a bound and of each term (numpy arrays broadcast from the inputs)."""

    value: np.ndarray | float
    terms: Mapping[str, np.ndarray | float] = field(default_factory=dict)
    valid: np.ndarray | bool = True


# Domain of each constant: (lower, lower inclusive?, upper, upper inclusive?).
_DOMAIN = {
    "L": (0.0, False, np.inf, False),
    "sigma": (0.0, True, np.inf, False),
    "rho": (0.0, False, np.inf, False),
    "Delta": (0.0, True, np.inf, False),
    "T": (1.0, True, np.inf, False),
    "eta": (0.0, False, np.inf, False),
    "beta": (0.0, True, 1.0, False),
    "tau": (0.0, True, np.inf, False),
    "G0": (0.0, True, np.inf, False),
    "delta_bar": (0.0, True, 2.0, True),
    "E_bar": (0.0, True, np.inf, False),
}


def _interval(name: str) -> str:
    lo, lo_in, hi, hi_in = _DOMAIN[name]
    return f"{'[' if lo_in else '('}{lo:g}, {hi:g}{']' if hi_in else ')'}"


def check_norm_of(bound: Bound, constants: Mapping[str, object]) -> dict:
    """``constants`` without its ``"norm"`` entry, once that norm is known to be the bound's.

    Constants without a norm (numbers typed by hand) pass: their norm is the caller's word.
    """
    from delaylab.theory.assumptions import NORMS

    out = dict(constants)
    norm = out.pop("norm", None)
    if norm is None:
        return out
    if norm not in NORMS:
        raise ConfigError(f"unknown norm {norm!r} in the constants; choose from {', '.join(NORMS)}")
    if bound.norm is not None and norm != bound.norm:
        raise ConfigError(f"{bound.name} needs L, G0 and rho in the {bound.norm} norm, but these constants are in "
                          f"the {norm} norm (estimate them with norm={bound.norm!r})")
    return out


def check_constants(values: Mapping[str, object]) -> dict[str, np.ndarray]:
    """Validate constants against the vocabulary; ValueError on an unknown name or bad value."""
    out = {}
    for name, v in values.items():
        if name not in _DOMAIN:
            raise ConfigError(f"unknown constant {name!r}; known: {', '.join(_DOMAIN)}")
        arr = np.asarray(v, dtype=float)
        lo, lo_in, hi, hi_in = _DOMAIN[name]
        ok = np.isfinite(arr) & ((arr >= lo) if lo_in else (arr > lo)) & ((arr <= hi) if hi_in else (arr < hi))
        if not np.all(ok):
            bad = arr[~ok].flat[0] if arr.ndim else float(arr)
            raise ConfigError(f"{name} must be in {_interval(name)}, got {bad:g}")
        out[name] = arr
    return out


@functools.lru_cache(maxsize=256)
def _compiled(bound: Bound):
    args = [S.BY_NAME[n] for n in bound.symbols]
    fns = {n: sp.lambdify(args, e, modules="numpy", cse=True) for n, e in bound.terms}
    conds = [sp.lambdify(args, c, modules="numpy") for c in bound.conditions]
    return bound.symbols, fns, conds


def evaluate(bound: Bound, **constants) -> Evaluation:
    """Evaluate ``bound`` at ``constants`` (floats or numpy arrays, broadcast together).

    Constants the bound does not use are ignored, so one dict can serve many bounds.
    Raises ValueError for a missing or unknown constant or a value outside its domain
    (eta <= 0, beta outside [0, 1), T < 1, tau < 0, ...). Where a validity condition
    fails the value is +inf: the bound says nothing there. A ``norm`` entry (the norm the
    constants were estimated in) must match ``bound.norm`` (:func:`check_norm_of`).
    """
    vals = check_constants(check_norm_of(bound, constants))
    names, fns, conds = _compiled(bound)
    missing = [n for n in names if n not in vals]
    if missing:
        raise ConfigError(f"{bound.name} needs constant(s) {', '.join(missing)}")
    args = [vals[n] for n in names]
    shape = np.broadcast_shapes(*(a.shape for a in args)) if args else ()
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        terms = {n: np.broadcast_to(np.asarray(f(*args), dtype=float), shape) for n, f in fns.items()}
        valid = np.ones(shape, dtype=bool)
        for c in conds:
            valid &= np.broadcast_to(np.asarray(c(*args), dtype=bool), shape)
    value = sum(terms.values()) if terms else np.zeros(shape)
    value = np.where(valid, value, np.inf)
    terms = {n: np.where(valid, t, np.inf) for n, t in terms.items()}
    if shape == ():
        return Evaluation(float(value), {n: float(t) for n, t in terms.items()}, bool(valid))
    return Evaluation(value, terms, valid)
