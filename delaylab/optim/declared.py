"""What an optimizer is, for the predictions: :class:`Declared` and :func:`infer_declared`.

The linear-stability thresholds of :mod:`delaylab.theory.stability` and the LMO bounds of
:mod:`delaylab.theory` hold for a few exactly known update rules. A user declares which one an
optimizer follows (``--declare lmo:spectral:0.95``), or :func:`infer_declared` reads it off a
torch optimizer whose rule is known exactly (torch SGD / Adam / AdamW, :class:`LMOMomentum`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from delaylab.errors import ConfigError
from delaylab.optim.lmo_momentum import LMOMomentum

KINDS = ("heavyball", "ema", "adam", "lmo")


@dataclass(frozen=True)
class Declared:
    """What the optimizer is, for the predictions: ``kind`` with momentum ``beta`` (and ``norm``).

    * ``heavyball``: ``b = beta b + g, x -= lr b`` (torch SGD, dampening 0);
    * ``ema``: ``m = beta m + (1 - beta) g, x -= lr m`` (torch SGD with dampening = beta);
    * ``adam``: Adam-type, beta = beta1 (a threshold on the preconditioned curvature only);
    * ``lmo``: ``x += lr LMO(m)``, ``m`` an EMA of the gradients, in ``norm`` (spectral, sign,
      l2): every step has norm lr, so there is no threshold, and the bounds of
      :mod:`delaylab.theory` apply.
    """

    kind: str
    beta: float = 0.0
    norm: str | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ConfigError(f"unknown optimizer kind {self.kind!r}; expected one of {', '.join(KINDS)}")
        if not 0.0 <= self.beta < 1.0:
            raise ConfigError(f"declared momentum must be in [0, 1), got {self.beta}")
        if (self.kind == "lmo") != (self.norm is not None):
            raise ConfigError("kind 'lmo' needs a norm (lmo:NORM:BETA) and the other kinds take none")
        if self.norm is not None and self.norm not in ("spectral", "sign", "l2"):
            raise ConfigError(f"unknown LMO norm {self.norm!r}; expected spectral, sign or l2")

    @classmethod
    def parse(cls, text: str) -> "Declared":
        """``heavyball:0.9``, ``ema:0.9``, ``adam:0.9`` or ``lmo:spectral:0.95``."""
        parts = text.split(":")
        try:
            if parts[0] == "lmo" and len(parts) == 3:
                return cls("lmo", float(parts[2]), parts[1])
            if len(parts) == 2:
                return cls(parts[0], float(parts[1]))
        except ValueError as err:
            if isinstance(err, ConfigError):
                raise
        raise ConfigError(f"cannot read the declaration {text!r}; expected heavyball:BETA, ema:BETA, "
                          "adam:BETA or lmo:NORM:BETA")

    def predicted_stable_lr(self, tau: int, ef: bool, curvature: float) -> float | None:
        """Largest stable lr on ``(lambda/2)||x||^2``; inf for LMO, None for Adam (no lr threshold:
        its preconditioner adapts, the threshold is on the preconditioned curvature)."""
        if self.kind == "lmo":
            return math.inf
        if self.kind == "adam":
            return None
        from delaylab.theory import stability  # sympy: only when a threshold is asked for

        return stability.max_stable(self.kind, self.beta, tau, ef) / curvature


def infer_declared(opt: torch.optim.Optimizer) -> Declared | None:
    """The type of an optimizer whose update rule is known exactly, else None.

    torch SGD (no Nesterov, no weight decay): heavy ball (dampening 0) or EMA (dampening =
    momentum); torch Adam/AdamW: Adam-type; LMOMomentum with the exact LMO, no Nesterov, no
    weight decay, unit step scale: an LMO method. Anything else must be declared.
    """
    groups = opt.param_groups
    same = lambda key: len({repr(g.get(key)) for g in groups}) == 1  # noqa: E731
    g = groups[0]
    if type(opt) is torch.optim.SGD and all(same(k) for k in ("momentum", "dampening", "nesterov")):
        if g["nesterov"] or any(x["weight_decay"] for x in groups):
            return None
        if g["dampening"] == 0:
            return Declared("heavyball", float(g["momentum"]))
        if g["dampening"] == g["momentum"]:
            return Declared("ema", float(g["momentum"]))
        return None
    if type(opt) in (torch.optim.Adam, torch.optim.AdamW) and same("betas"):
        return Declared("adam", float(g["betas"][0]))
    if type(opt) is LMOMomentum and all(same(k) for k in ("beta", "norm")):
        exact = all(not x["nesterov"] and not x["weight_decay"] and x["method"] == "svd" and x["scale"] == "none"
                    for x in groups)
        return Declared("lmo", float(g["beta"]), g["norm"]) if exact else None
    return None
