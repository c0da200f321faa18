r"""Weight prediction (SpecTrain) and Nesterov-style look-ahead: the gradient is taken at
extrapolated weights, one unit with two coefficients.

Both keep ``u_last = x_before - x_after`` of the last update, as applied: after the inner
optimizer's own transform (Adam's scaling, Muon's orthogonalization, weight decay), one
parameter-sized buffer (``state[p]["u_last"]``). The forward/backward of the next batch then
runs at

.. math:: \hat x = x - c\, u_{last},

and the weights are restored, bit for bit, before the update (:meth:`Extrapolation.shifted`).

* ``"predict"`` -- weight prediction (Chen et al. 2019, "Efficient and Robust Parallel DNN
  Training through Model Parallelism on Multi-GPU Platform", SpecTrain, which extrapolates
  ``lr`` times the smoothed gradient; here, as in marin's delayed-gradient study, the last
  applied update): ``c = a``, the number of updates the gradient will wait for
  before it is applied (``tau`` once the queue is full, ``0..tau-1`` while it fills), so
  ``x_hat`` is where a constant-velocity step predicts the weights to be when the gradient is
  used. For Muon this extrapolates the orthogonalized update: marin found extrapolating the raw
  momentum worse than no correction.
* ``"lookahead"`` -- Nesterov-style look-ahead for delayed momentum (after Ajanthan et al.
  2025, "Nesterov Method for Asynchronous Pipeline Parallel Optimization", ICML): NAG takes the
  gradient at the look-ahead point ``x_k + gamma (x_k - x_{k-1}) = x_k - gamma u_last``; here every
  delayed gradient is taken at that point of the (stale) weights it is computed on,
  ``c = gamma`` in a delayed phase. Ajanthan et al. modify NAG's look-ahead step to absorb the
  delay and run it as NAdam with a momentum of 0.99 in their code (our default gamma); whether
  their exact update equals this optimizer-agnostic form is not settled here: it is the NAG
  look-ahead point, not a transcription of their algorithm.

Neither changes anything at ``c = 0`` (before the first update, or outside a delayed phase).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable

import torch

from delaylab.errors import ConfigError

KINDS = ("predict", "lookahead")


class Extrapolation:
    keys = ("u_last",)  # what it holds across steps

    def __init__(self, kind: str, gamma: float = 0.99):
        if kind not in KINDS:
            raise ConfigError(f"unknown extrapolation {kind!r}; expected one of {', '.join(KINDS)}")
        if not gamma >= 0:
            raise ConfigError(f"lookahead_momentum must be >= 0, got {gamma}")
        self.kind, self.gamma = kind, float(gamma)

    def coefficient(self, tau: int, ahead: int) -> float:
        """``c`` for a group with delay ``tau`` whose next gradient waits ``ahead`` updates."""
        if not tau:
            return 0.0
        return float(ahead) if self.kind == "predict" else self.gamma

    @staticmethod
    def before_step(params: Iterable[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of the weights an update is about to change (those with a gradient)."""
        return [(p, p.detach().clone()) for p in params if p.grad is not None]

    @staticmethod
    def after_step(before: list[tuple[torch.Tensor, torch.Tensor]], state) -> None:
        """``u_last = x_before - x_after``, in the copy's memory (the old ``u_last`` is freed)."""
        for p, x_before in before:
            state[p]["u_last"] = x_before.sub_(p)

    @staticmethod
    @contextmanager
    def shifted(shifts: list[tuple[torch.Tensor, torch.Tensor, float]]):
        """Weights at ``x - c u_last`` inside, restored from a copy (bit for bit) on exit."""
        saved = []
        try:
            with torch.no_grad():
                for p, u, c in shifts:
                    saved.append((p, p.detach().clone()))
                    p.sub_(u, alpha=c)
            yield
        finally:
            with torch.no_grad():
                for p, x in saved:
                    p.copy_(x)
