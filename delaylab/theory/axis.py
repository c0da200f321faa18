r"""The theory along the delay axis: what the bounds and the stability model predict at
tau = 1, 2, 4, 8, ..., as numbers free of the problem's constants (L, Delta, sigma).

* **LMO methods** (Muon: spectral LMO, Nesterov momentum): Theorem 1 adds ``2 L eta tau`` to the
  eta-linear part of the bound, ``L eta C_tau`` with ``C_tau = 1/2 + 2 lag + 2 tau`` (``lag =
  beta/(1-beta)``, ``beta^2/(1-beta)`` with Nesterov; plus the start-up term's share). So

  - the *relative penalty* (delay term / momentum term) is ``tau / lag``, linear in tau;
  - with eta tuned at a fixed beta, the eta-part of the bound grows by ``sqrt(C_tau / C_0)``
    (``bound_ratio``) and the bound-optimal eta shrinks by its inverse (``lr_shift``);
  - a *random* delay enters Theorem 1 through its mean: Lemma L3 bounds the momentum error by
    ``L eta (1-beta) sum_k beta^{t-k} (t - k + tau_k)`` realisation by realisation, linear in
    ``tau_k``, so its expectation has ``E tau`` where a constant delay has ``tau``
    (docs/beyond.md, "Theory along the axis");
  - with EF the delay term becomes ``L eta tau (tau+1) delta_bar`` (Theorem 3, virtual point):
    EF's bound is below the plain one iff ``delta_bar < 2 / (tau + 1)`` (``ef_drift_limit``),
    1 at tau = 1 and 0.22 at tau = 8: the longer the delay, the steadier the update direction
    must be for EF to pay.

* **Adam-type methods** (AdamW; frozen preconditioner, :mod:`delaylab.theory.stability`): the
  largest stable ``eta lambda`` at delay tau, without and with EF (lag tau), and how much the
  delay shrinks it against sync.

This module imports nothing of delaylab but :mod:`delaylab.theory`; the momentum of a named
optimizer comes from the caller (:func:`delaylab.reproduce.predict.direction_beta` reads it
off the optimizer that delaylab builds).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from typing import Sequence

import sympy as sp

from delaylab.errors import ConfigError

TAUS = (1, 2, 4, 8)


@functools.lru_cache(maxsize=None)
def _eta_coefficient(nesterov: bool):
    """``C(beta, tau, T)``: the coefficient of ``L eta`` in Theorem 1 (all eta-linear terms)."""
    from delaylab.theory import lmo_bound

    bound = lmo_bound(None, nesterov=nesterov)
    total = sp.expand(sum(expr for _, expr in bound.terms))
    syms = {s.name: s for s in total.free_symbols}
    coeff = total.coeff(syms["eta"], 1).subs(syms["L"], 1)
    args = [syms[n] for n in ("beta", "tau", "T")]
    return sp.lambdify(args, coeff, "math")


@dataclass(frozen=True)
class LMOPoint:
    tau: float
    relative_penalty: float  # delay term / momentum term: tau / lag
    bound_ratio: float  # eta-tuned (fixed beta) eta-part of the bound, delayed / sync: sqrt(C_tau / C_0)
    lr_shift: float  # bound-optimal eta, delayed / sync: 1 / bound_ratio
    ef_drift_limit: float  # EF's bound beats the plain delayed one iff delta_bar < this: 2 / (tau + 1)


def lmo_point(beta: float, tau: float, nesterov: bool = False, T: float = 1000.0) -> LMOPoint:
    """Theorem 1's numbers at delay ``tau`` (a mean delay may be fractional) and momentum ``beta``."""
    if not 0 < beta < 1:
        raise ConfigError(f"beta must be in (0, 1) for the relative penalty, got {beta}")
    if not tau >= 0:
        raise ConfigError(f"tau must be >= 0, got {tau}")
    c = _eta_coefficient(bool(nesterov))
    lag = beta**2 / (1 - beta) if nesterov else beta / (1 - beta)
    ratio = math.sqrt(c(beta, tau, T) / c(beta, 0, T))
    return LMOPoint(float(tau), tau / lag, ratio, 1 / ratio, 2 / (tau + 1))


@dataclass(frozen=True)
class AdamPoint:
    tau: int
    stable_sync: float  # largest stable eta*lambda (frozen preconditioner), sync
    stable: float  # ... at delay tau
    stable_ef: float  # ... at delay tau with EF (lag tau)
    shrink: float  # stable_sync / stable
    ef_gain: float  # stable_ef / stable


def adam_point(beta: float, tau: int) -> AdamPoint:
    from delaylab.theory.stability import max_stable

    sync, plain, ef = max_stable("adam", beta, 0), max_stable("adam", beta, tau), max_stable("adam", beta, tau, ef=True)
    return AdamPoint(int(tau), sync, plain, ef, sync / plain, ef / plain)


def delay_axis(optimizers: dict[str, tuple[str, float, bool]], taus: Sequence[float] = TAUS,
               T: float = 1000.0) -> list[dict]:
    """One row per (optimizer, tau). ``optimizers``: ``{name: (kind, beta, nesterov)}`` with kind
    ``"lmo"`` (Theorem 1) or ``"adam"`` (stability); Adam rows need integer taus."""
    rows = []
    for name, (kind, beta, nesterov) in optimizers.items():
        for tau in taus:
            if kind == "lmo":
                point = asdict(lmo_point(beta, tau, nesterov, T))
            elif kind == "adam":
                if int(tau) != tau:
                    raise ConfigError(f"the stability model takes a constant integer delay, got {tau}")
                point = asdict(adam_point(beta, int(tau)))
            else:
                raise ConfigError(f"kind must be lmo or adam, got {kind!r}")
            rows.append({"optimizer": name, "kind": kind, "beta": beta, "nesterov": nesterov, **point})
    return rows


def axis_markdown(rows: list[dict]) -> str:
    """The rows as two Markdown tables (LMO, Adam-type)."""
    out = []
    lmo = [r for r in rows if r["kind"] == "lmo"]
    if lmo:
        out += ["| optimizer | beta | tau | relative penalty tau/lag | bound ratio (eta tuned) | best eta shift | "
                "EF pays iff delta_bar < |", "|---|---|---|---|---|---|---|"]
        out += [f"| {r['optimizer']} | {r['beta']:g}{' (Nesterov)' if r['nesterov'] else ''} | {r['tau']:g} | "
                f"{r['relative_penalty']:.3f} | {r['bound_ratio']:.3f} | x{r['lr_shift']:.3f} | "
                f"{r['ef_drift_limit']:.3f} |" for r in lmo]
    adam = [r for r in rows if r["kind"] == "adam"]
    if adam:
        out += ["", "| optimizer | beta1 | tau | stable eta*lambda sync | delayed | delayed + EF | shrink vs sync | "
                "EF widens by |", "|---|---|---|---|---|---|---|---|"]
        out += [f"| {r['optimizer']} | {r['beta']:g} | {r['tau']} | {r['stable_sync']:.3g} | {r['stable']:.3g} | "
                f"{r['stable_ef']:.3g} | x{r['shrink']:.1f} | x{r['ef_gain']:.2f} |" for r in adam]
    return "\n".join(out).strip() + "\n"


def plot_delay_axis(rows: list[dict]):
    """Left: LMO relative penalty and bound ratio against tau; right: Adam's stable eta*lambda
    against tau, with and without EF (log-log)."""
    import sys

    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for i, name in enumerate(dict.fromkeys(r["optimizer"] for r in rows if r["kind"] == "lmo")):
        mine = [r for r in rows if r["optimizer"] == name]
        taus = [r["tau"] for r in mine]
        left.plot(taus, [r["relative_penalty"] for r in mine], "o-", color=f"C{i}", label=f"{name}: delay/momentum term")
        left.plot(taus, [r["bound_ratio"] - 1 for r in mine], "s--", color=f"C{i}", label=f"{name}: bound ratio - 1")
    left.set(xscale="log", yscale="log", xlabel="tau", title="Theorem 1 (LMO): penalty against tau")
    for i, name in enumerate(dict.fromkeys(r["optimizer"] for r in rows if r["kind"] == "adam")):
        mine = [r for r in rows if r["optimizer"] == name]
        taus = [r["tau"] for r in mine]
        right.axhline(mine[0]["stable_sync"], color=f"C{i}", ls=":", label=f"{name}: sync")
        right.plot(taus, [r["stable"] for r in mine], "o-", color=f"C{i}", label=f"{name}: delayed")
        right.plot(taus, [r["stable_ef"] for r in mine], "s--", color=f"C{i}", label=f"{name}: delayed + EF")
    right.set(xscale="log", yscale="log", xlabel="tau", ylabel="largest stable eta*lambda",
              title="stability (frozen preconditioner)")
    for ax in (left, right):
        ax.set_xticks(sorted({r["tau"] for r in rows}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.get_xaxis().set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
