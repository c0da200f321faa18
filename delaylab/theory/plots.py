"""Figures of the tuned bounds (matplotlib, Agg; every function takes ``ax=None``, returns the Figure).

The stability region is drawn by :func:`delaylab.theory.stability.plot_stability`.
"""

from __future__ import annotations

import numpy as np

from delaylab.theory.bounds import get_bound
from delaylab.theory.tuning import delay_penalty, tune


def _axes(ax, size=(6, 4)):
    import sys

    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:  # a script or the CLI: no display needed
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=size)
    return ax


def plot_bounds_vs_T(constants: dict, Ts, tau: int = 1, delta_bar: float | None = None, nesterov: bool = False,
                     ax=None):
    """Tuned sync, delayed and (if ``delta_bar`` is given) delayed+EF LMO bounds against T.

    EF runs at the delayed bound's tuned (eta, beta): its drift is measured, not chosen.
    """
    ax = _axes(ax)
    Ts = np.asarray(Ts, dtype=float)
    sync = [tune(get_bound("lmo", 0, nesterov=nesterov), T, constants).value for T in Ts]
    tuned = [tune(get_bound("lmo", tau, nesterov=nesterov), T, constants) for T in Ts]
    ax.loglog(Ts, sync, label="sync", color="C0")
    ax.loglog(Ts, [r.value for r in tuned], label=f"delay {tau}", color="C3")
    if delta_bar is not None:
        from delaylab.theory.bound import evaluate

        ef = get_bound("lmo", tau, ef=True, nesterov=nesterov)
        vals = [float(evaluate(ef, **constants, T=T, eta=r.eta, beta=r.beta, delta_bar=delta_bar).value)
                for T, r in zip(Ts, tuned)]
        ax.loglog(Ts, vals, label=f"delay {tau} + EF (delta_bar={delta_bar:.2f})", color="C2", ls="--")
    ax.set_xlabel("T (updates)")
    ax.set_ylabel("bound on mean E||grad f||_*")
    ax.set_title("tuned momentum-LMO bounds")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return ax.figure


def plot_penalty(Ts, tau: int, constants: dict, method: str = "lmo", ef: bool = False, nesterov: bool = False,
                 init: str = "zero", beta: float | None = None, ax=None):
    """Tuned delayed bound / tuned sync bound against T (tends to 1 with noise)."""
    ax = _axes(ax)
    Ts = np.asarray(Ts, dtype=float)
    ratios = [delay_penalty(T, tau, constants, method, ef, nesterov, init, beta).ratio for T in Ts]
    ax.semilogx(Ts, ratios, marker="o", label=f"{method}, delay {tau}{' + EF' if ef else ''}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xlabel("T (updates)")
    ax.set_ylabel("tuned bound ratio, delayed / sync")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return ax.figure
