"""What :mod:`delaylab.theory` predicts for each finding, computed from its bounds and stability model.

Two models, for two kinds of optimizer (docs/theory.md):

* **LMO methods** (Muon on the hidden matrices: spectral LMO; Lion: sign LMO) follow Theorem 1:
  the delay adds ``2 L eta tau`` next to the momentum's ``2 L eta lag``, so its relative
  penalty is ``tau / lag`` = ``tau (1-beta)/beta`` (``tau (1-beta)/beta^2`` with Nesterov
  momentum, as Muon and Lion use). It shrinks as momentum grows, and in absolute terms it is
  linear in eta. No step-size threshold: an LMO step has norm eta whatever the gradient.
* **Adam-type methods** (AdamW, SOAP, Adan, MARS) have no descent bound of the LMO kind; the
  theory's model for them is linear stability with a frozen preconditioner: the largest stable
  eta*lambda is ``2(1+beta1)/(1-beta1)`` in sync and 1 with a one-step delay (a factor 38 at
  beta1 = 0.9), and EF moves it to ``(sqrt(1 + 4/(1-beta1)) - 1)/2``.

Lion is mapped onto the LMO model with Nesterov momentum beta = its buffer's decay beta2 (the
factory's momentum knob); its beta1 interpolation makes that an approximation. Muon's
embeddings, head and norms are trained by AdamW (torch.optim.Muon takes 2-D hidden matrices only).
"""

from __future__ import annotations

import functools

LMO_TYPE = ("muon", "lion", "lmo")
ADAM_TYPE = ("adamw", "soap", "adan", "mars")


def kind(optimizer: str) -> str | None:
    """``lmo`` or ``adam`` (the model theory applies), None for an optimizer neither covers."""
    return "lmo" if optimizer in LMO_TYPE else "adam" if optimizer in ADAM_TYPE else None


@functools.lru_cache(maxsize=None)
def direction_beta(optimizer: str, momentum: float | None = None) -> tuple[float, bool]:
    """(beta, nesterov) of the momentum average that drives the step, read from the optimizer
    that :func:`delaylab.optim.build_optimizer` builds (so defaults are never copied here)."""
    import torch

    from delaylab.optim import build_optimizer

    block = torch.nn.Module()
    block.blocks = torch.nn.Linear(4, 4, bias=False)  # a hidden matrix, which Muon takes
    group = build_optimizer(optimizer, block, momentum=momentum).param_groups[0]
    if optimizer == "muon":  # torch's Muon (bfloat16 Newton-Schulz) or LMOMomentum (float32): beta
        return float(group["momentum"] if "momentum" in group else group["beta"]), bool(group.get("nesterov", False))
    if optimizer == "lion":
        return float(group["betas"][1]), True
    if optimizer == "lmo":
        return float(group["beta"]), bool(group.get("nesterov", False))
    return float(group["betas"][0]), False


def lmo_relative_penalty(beta: float, tau: float = 1, nesterov: bool = False) -> float:
    """Theorem 1's delay term over its momentum term at ``beta`` (independent of L and eta)."""
    from delaylab.theory import evaluate, lmo_bound

    unit = dict(L=1.0, eta=1.0, T=1.0, Delta=1.0, sigma=1.0, rho=1.0, G0=1.0)
    terms = evaluate(lmo_bound(None, nesterov=nesterov), beta=beta, tau=tau, **unit).terms
    return terms["delay"] / terms["momentum"]


def adam_stable_range(beta: float, tau: int = 1, ef: bool = False) -> float:
    """Largest stable eta*lambda of Adam with a frozen preconditioner (theory.stability)."""
    from delaylab.theory.stability import max_stable

    return max_stable("adam", beta, tau, ef)


def optimizer_prediction(optimizer: str, momentum: float | None = None) -> dict:
    """The model's number for one optimizer: LMO relative penalty, or Adam's stable-range shrink."""
    k = kind(optimizer)
    if k is None:
        return {"kind": None}
    beta, nesterov = direction_beta(optimizer, momentum)
    if k == "lmo":
        return {"kind": k, "beta": beta, "nesterov": nesterov,
                "relative_penalty": lmo_relative_penalty(beta, 1, nesterov)}
    sync, delayed, ef = adam_stable_range(beta, 0), adam_stable_range(beta, 1), adam_stable_range(beta, 1, True)
    return {"kind": k, "beta": beta, "stable_sync": sync, "stable_delayed": delayed, "stable_ef": ef,
            "stable_shrink": sync / delayed, "ef_widening": ef / delayed}


def undelayed_share(base: dict, first: int = 0, last: int = 0) -> float:
    """Share of Theorem 1's delay term, ``sum_t 2 L eta_t tau``, that undelayed updates remove
    when the first ``first`` or the last ``last`` updates run in sync (eta_t: the run's schedule)."""
    from delaylab.llm.config import Config, lr_factor

    cfg = Config.from_dict(base)
    steps = cfg.run.steps
    lrs = [lr_factor(k, cfg) for k in range(steps)]
    undelayed = sum(lrs[:first]) + (sum(lrs[steps - last:]) if last else 0.0)
    return undelayed / sum(lrs)


def mean_delay(delays: list[int]) -> float:
    """Per-stage delays enter the delay term as ``2 eta sum_l L_l tau_l`` (docs/theory.md, "Not
    covered: per-group delays"); with equal L_l per stage that is the 2BW term times mean(tau_l)."""
    return sum(delays) / len(delays)


def lmo_lr_shift(beta: float, nesterov: bool, tau: float = 1, T: float = 1000.0) -> float:
    """Theorem 1's bound-minimising eta with the delay over the one without: the delay term
    2 L eta tau adds to the eta-linear terms, so eta* ~ 1/sqrt(their sum) moves down by
    sqrt(sum_sync / (sum_sync + 2 tau)) (independent of L, Delta and sigma; T enters through
    the init term only). Solved exactly: the bound's d/d eta = 0 with sympy."""
    import sympy as sp

    from delaylab.theory import lmo_bound

    bound = lmo_bound(None, nesterov=nesterov)
    total = sum(expr for _, expr in bound.terms)
    eta = next(sym for sym in total.free_symbols if sym.name == "eta")

    def best(t: float) -> float:
        values = dict(beta=beta, tau=t, L=1.0, T=T, Delta=1.0, sigma=1.0, rho=1.0, G0=1.0)
        e = total.subs({sym: values[sym.name] for sym in total.free_symbols if sym.name in values})
        roots = [complex(r) for r in sp.solve(sp.diff(e, eta), eta)]
        return max(r.real for r in roots if abs(r.imag) < 1e-12 and r.real > 0)

    return best(tau) / best(0)


@functools.lru_cache(maxsize=None)
def lr_shift(optimizer: str, momentum: float | None = None, steps: int = 1000) -> dict:
    """The predicted (delayed best lr) / (sync best lr), and (EF best lr) / (delayed best lr).

    LMO: :func:`lmo_lr_shift` (Theorem 1's optimum; EF: no number, Theorem 3 has no closed
    optimum here). Adam-type: the stability limits, if the best lr sits at a fixed fraction of
    the largest stable one: stable_delayed / stable_sync, and EF's stable_ef / stable_delayed.
    """
    k = kind(optimizer)
    if k is None:
        return {"kind": None, "delayed": None, "ef": None}
    beta, nesterov = direction_beta(optimizer, momentum)
    if k == "lmo":
        return {"kind": k, "delayed": lmo_lr_shift(beta, nesterov, 1, steps), "ef": None,
                "source": "Theorem 1's bound-optimal eta"}
    p = optimizer_prediction(optimizer, momentum)
    return {"kind": k, "delayed": p["stable_delayed"] / p["stable_sync"], "ef": p["ef_widening"],
            "source": "the frozen-preconditioner stability limits"}
