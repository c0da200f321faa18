"""Linear stability of delayed updates on the quadratic f = lambda x^2 / 2.

Near a minimum every linear-in-gradient method is a linear recursion; it is stable iff all
roots of its characteristic polynomial lie strictly inside the unit circle. With
``h = eta * lambda`` (the quantity a user controls) and the momentum buffer
m_t = beta m_{t-1} + c g_t (c = 1 - beta for EMA momentum and Adam, c = 1 for heavy ball
and GD), x_{t+1} = x_t - eta m_t, g_t = lambda x_{max(t-tau,0)} and a = c h:

==========  ==================================================
sync        (z - 1)(z - beta) + a z
delay tau   z^(tau-1) (z - 1)(z - beta) + a            (tau >= 1)
EF, lag tau z^tau (z - 1)(z - beta) + a ((tau+1) z - tau)
==========  ==================================================

(docs/theory.md#linear-stability derives them). EF is x_{t+1} = x_t + (tau+1) u_t - tau u_{t-1}.

Adam near a minimum, with its second-moment estimate frozen (Cohen et al. 2022, "Adaptive
Gradient Methods at the Edge of Stability", arXiv:2207.14484), is EMA momentum on the
preconditioned problem: lambda is an eigenvalue of diag(sqrt(v) + eps)^(-1) H. An LMO method
has no such threshold: its step has norm eta whatever the gradient, so a delay cannot make it
blow up; it only widens the oscillation around the minimum (by O(L eta tau), Theorem 1).

The stability test is the Schur-Cohn-Jury reduction (:func:`is_schur_stable`), cross-checked
by numpy roots (:func:`spectral_radius`) and by iterating the method itself (:func:`iterate`).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import sympy as sp
from delaylab.errors import ConfigError

METHODS = ("gd", "heavyball", "ema", "adam")

z, h_sym, beta_sym = sp.symbols("z h beta")


def _check(method: str, beta: float, tau: int) -> None:
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    if not (0.0 <= beta < 1.0) or math.isnan(beta):
        raise ConfigError(f"beta must be in [0, 1), got {beta}")
    if method == "gd" and beta != 0.0:
        raise ConfigError("gd has no momentum: use beta = 0 (or heavyball / ema)")
    if isinstance(tau, bool) or int(tau) != tau or tau < 0:
        raise ConfigError(f"delay must be a non-negative integer, got {tau!r}")


def gradient_weight(method: str, beta):
    """c in m_t = beta m_{t-1} + c g_t: 1 - beta for EMA momentum / Adam, 1 for heavy ball / GD."""
    return 1 - beta if method in ("ema", "adam") else 1


@functools.lru_cache(maxsize=None)
def char_poly(method: str, tau: int, ef: bool = False) -> sp.Poly:
    """Characteristic polynomial in z, with symbols h = eta*lambda and beta (see module doc)."""
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    b = sp.Integer(0) if method == "gd" else beta_sym
    a = gradient_weight(method, b) * h_sym
    if ef and tau > 0:
        expr = z**tau * (z - 1) * (z - b) + a * ((tau + 1) * z - tau)
    elif tau == 0:
        expr = (z - 1) * (z - b) + a * z
    else:
        expr = z ** (tau - 1) * (z - 1) * (z - b) + a
    return sp.Poly(sp.expand(expr), z)


@functools.lru_cache(maxsize=None)
def _coeff_fn(method: str, tau: int, ef: bool):
    return sp.lambdify((h_sym, beta_sym), char_poly(method, tau, ef).all_coeffs(), "math")


def coefficients(method: str, beta: float, tau: int, ef: bool, eta_lambda: float) -> list[float]:
    """Numeric coefficients of the characteristic polynomial, highest power first."""
    return [float(c) for c in _coeff_fn(method, int(tau), bool(ef))(eta_lambda, beta)]


def is_schur_stable(coeffs) -> bool:
    """True iff every root of the polynomial (coefficients highest first) has |z| < 1.

    Schur-Cohn-Jury reduction: p is stable iff |p_0| < |p_n| and
    q(z) = (p_n p(z) - p_0 z^n p(1/z)) / z, of degree n - 1, is stable.
    Exact for integer/Fraction coefficients; for floats a root within ~1e-12 of the unit
    circle may be classed either way.
    """
    a = list(coeffs)[::-1]  # lowest power first
    while len(a) > 1 and a[-1] == 0:
        a.pop()
    while len(a) > 1:
        a0, an = a[0], a[-1]
        if abs(a0) >= abs(an):
            return False
        n = len(a) - 1
        a = [an * a[k + 1] - a0 * a[n - k - 1] for k in range(n)]
        scale = max(abs(x) for x in a)  # keep floats in range; stability is scale-free
        if scale == 0:
            return False
        if not isinstance(scale, int):
            a = [x / scale for x in a]
    return True


def spectral_radius(method: str, beta: float, tau: int, ef: bool, eta_lambda: float) -> float:
    """Largest |root| of the characteristic polynomial (numpy), the per-step growth factor."""
    return float(np.max(np.abs(np.roots(coefficients(method, beta, tau, ef, eta_lambda)))))


def max_stable(method: str, beta: float = 0.0, tau: int = 0, ef: bool = False, rtol: float = 1e-12) -> float:
    """The largest eta*lambda such that every eta*lambda in (0, it) is stable.

    Scans a geometric grid up from 1e-9 to find the first unstable point, then bisects.
    """
    _check(method, beta, tau)

    def stable(x):
        return is_schur_stable(coefficients(method, beta, tau, ef, x))

    c = float(gradient_weight(method, beta))
    top = 20.0 * 2 * (1 + beta) / c  # 20x the sync threshold, above every delayed one
    lo = 1e-9
    if not stable(lo):
        return 0.0
    hi = lo * 1.05
    while stable(hi):
        lo, hi = hi, hi * 1.05
        if hi > top:
            return math.inf
    while hi - lo > rtol * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if stable(mid) else (lo, mid)
    return lo


def threshold_closed_form(method: str, beta: float = 0.0, tau: int = 0, ef: bool = False) -> float | None:
    """The threshold in closed form where one is known (docs/theory.md#linear-stability), else None.

    sync: a < 2(1+beta); delay 1: a < 1 - beta; EF lag 1: a^2 + (1-beta) a = 1 - beta;
    GD with delay tau: eta lambda < 2 sin(pi / (2 (2 tau + 1))). Here a = c eta lambda.
    """
    _check(method, beta, tau)
    c = float(gradient_weight(method, beta))
    if tau == 0:
        return 2 * (1 + beta) / c
    if tau == 1 and not ef:
        return (1 - beta) / c
    if tau == 1 and ef:
        q = 1 - beta
        return (math.sqrt(q * q + 4 * q) - q) / 2 / c
    if method == "gd" and not ef:
        return 2 * math.sin(math.pi / (2 * (2 * tau + 1)))
    return None


def iterate(method: str, beta: float, tau: int, ef: bool, eta_lambda: float, steps: int,
            x0: float = 1.0) -> np.ndarray:
    """Run the method itself on f = x^2/2 (lambda = 1, eta = eta_lambda); returns |x_t|.

    A direct time-domain simulation (gradient queue, momentum buffer, EF buffer), independent
    of the characteristic polynomial, to cross-check it.
    """
    _check(method, beta, tau)
    c = float(gradient_weight(method, beta))
    eta = float(eta_lambda)
    hist = [x0]
    m = 0.0
    u_prev = 0.0
    out = np.empty(steps)
    x = x0
    for t in range(steps):
        g = hist[max(t - tau, 0)]        # lambda = 1: the gradient is the (stale) iterate
        m = beta * m + c * g
        u = -eta * m                     # the inner optimizer's update
        x = x + ((tau + 1) * u - tau * u_prev if ef else u)
        u_prev = u
        hist.append(x)
        out[t] = abs(x)
    return out


def stability_table(method: str, betas, taus, ef: bool = False) -> np.ndarray:
    """max_stable on a (len(betas), len(taus)) grid."""
    return np.array([[max_stable(method, b, t, ef) for t in taus] for b in betas])


def plot_stability(method: str = "ema", betas=None, taus=(0, 1, 2), ax=None):
    """Largest stable eta*lambda against beta, per delay, with and without EF (log scale)."""
    import sys

    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:  # a script or the CLI: no display needed
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    betas = np.linspace(0.0, 0.98, 50) if betas is None else np.asarray(betas)
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    for i, tau in enumerate(taus):
        color = f"C{i}"
        ax.plot(betas, [max_stable(method, b, tau) for b in betas], color=color, label=f"tau={tau}")
        if tau > 0:
            ax.plot(betas, [max_stable(method, b, tau, ef=True) for b in betas], color=color, ls="--",
                    label=f"tau={tau} + EF")
    ax.set_yscale("log")
    ax.set_xlabel("beta")
    ax.set_ylabel("largest stable eta*lambda")
    ax.set_title(f"{method}: linear stability on f = lambda x^2/2")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return ax.figure
