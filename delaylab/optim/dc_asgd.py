"""DC-ASGD (Zheng et al. 2017, "Asynchronous SGD with Delay Compensation") as a queue companion.

A stale gradient is corrected by a first-order Taylor step with the diagonal approximation
``g * g`` of the Hessian: ``g(x_now) ~ g(x_stale) + lambda * g * g * (x_now - x_stale)``.
That needs the weights each queued gradient was taken at, so a copy of the weights is kept
next to it (``state[p]["snapshots"]``).
"""

from __future__ import annotations

import torch

from delaylab.errors import ConfigError


class DCASGD:
    def __init__(self, dc_lambda: float = 0.04):
        if not dc_lambda >= 0:
            raise ConfigError(f"dc_lambda must be >= 0, got {dc_lambda}")
        self.dc_lambda = float(dc_lambda)

    def remember(self, p: torch.Tensor, st: dict) -> None:
        st.setdefault("snapshots", []).append(p.detach().clone())

    def apply(self, p: torch.Tensor, st: dict, g: torch.Tensor | None) -> torch.Tensor | None:
        stale = st["snapshots"].pop(0)
        if g is not None and self.dc_lambda:
            g.addcmul_(g * g, p - stale, value=self.dc_lambda)
        return g

    def forget(self, st: dict) -> None:
        st.pop("snapshots", None)
