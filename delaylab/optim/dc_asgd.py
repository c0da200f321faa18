r"""DC-ASGD and DC-ASGD-a (Zheng et al. 2017, "Asynchronous Stochastic Gradient Descent with
Delay Compensation", ICML), correctors of the queue: a snapshot on each push, the compensation
on each pop.

A stale gradient is corrected by a first-order Taylor step with the diagonal approximation
``g * g`` of the Hessian:

.. math:: \tilde g = g + \lambda\, g \odot g \odot (x_{now} - x_{stale}).

That needs the weights each queued gradient was taken at, so a copy of the weights is kept
next to it (``state[p]["snapshots"]``: tau copies in steady state).

DC-ASGD-a (the paper's adaptive form, its Section 5) makes lambda element-wise:

.. math:: s_t = m\, s_{t-1} + (1 - m)\, g_t \odot g_t, \qquad
          \lambda_t = \lambda_0 / \sqrt{s_t + \epsilon},

with ``g_t`` the stale gradient being applied, ``s_{-1} = 0`` (no bias correction) and
``epsilon = 1e-7``. ``s`` is one more parameter-sized buffer (``state[p]["dc_ms"]``) and, being a
statistic of the gradients rather than of the queue, survives a drop of the queue. The paper
used ``m = 0.95`` and ``lambda0 = 2``, our defaults.
"""

from __future__ import annotations

import torch

from delaylab.errors import ConfigError
from delaylab.optim.corrector import Corrector

EPS = 1e-7  # DC-ASGD-a's epsilon (the paper's value)


class DCASGD(Corrector):
    """Fixed lambda."""

    name = "dc-asgd"
    keys = ("snapshots",)
    keywords = {"dc_lambda": "dc_lambda"}

    def __init__(self, dc_lambda: float = 0.04):
        self.dc_lambda = _at_least_0("dc_lambda", dc_lambda)

    def hyper(self) -> dict:
        return {"dc_lambda": self.dc_lambda}

    def on_push(self, p: torch.Tensor, st: dict) -> None:
        st.setdefault("snapshots", []).append(p.detach().clone())

    def on_pop(self, p: torch.Tensor, st: dict, g: torch.Tensor | None) -> torch.Tensor | None:
        stale = st["snapshots"].pop(0)
        if g is not None:
            self._compensate(g, p - stale, st)
        return g

    def _compensate(self, g: torch.Tensor, drift: torch.Tensor, st: dict) -> None:
        if self.dc_lambda:
            g.addcmul_(g * g, drift, value=self.dc_lambda)

    def on_drop(self, st: dict) -> None:
        st.pop("snapshots", None)


class DCASGDAdaptive(DCASGD):
    """DC-ASGD-a: lambda0 / sqrt(EMA of g * g + eps), element-wise."""

    name = "dc-asgd-a"
    keys = ("snapshots", "dc_ms")
    keywords = {"dc_lambda0": "dc_lambda0", "dc_ms_decay": "ms_decay"}

    def __init__(self, dc_lambda0: float = 2.0, ms_decay: float = 0.95):
        self.dc_lambda = _at_least_0("dc_lambda0", dc_lambda0)
        if not 0 <= ms_decay < 1:
            raise ConfigError(f"dc_ms_decay must be in [0, 1), got {ms_decay}")
        self.ms_decay = float(ms_decay)

    def hyper(self) -> dict:
        return {"dc_lambda0": self.dc_lambda, "ms_decay": self.ms_decay}

    def _compensate(self, g: torch.Tensor, drift: torch.Tensor, st: dict) -> None:
        sq = g * g
        ms = st.get("dc_ms")
        if ms is None:
            ms = st["dc_ms"] = torch.zeros_like(g)
        ms.mul_(self.ms_decay).add_(sq, alpha=1 - self.ms_decay)
        g.add_(sq.mul_(drift).div_((ms + EPS).sqrt_()).mul_(self.dc_lambda))


def _at_least_0(name: str, value: float) -> float:
    if not value >= 0:
        raise ConfigError(f"{name} must be >= 0, got {value}")
    return float(value)
