r"""Weight prediction (SpecTrain) and Nesterov-style look-ahead: the gradient is taken at
extrapolated weights; two correctors on one base.

Both keep ``u_last = x_before - x_after`` of the last update, as applied: after the inner
optimizer's own transform (Adam's scaling, Muon's orthogonalization, weight decay) and after
the other correctors (with error feedback, EF's displacement ``(l+1) u_k - l u_{k-1}``), one
parameter-sized buffer (``state[p]["u_last"]``), recorded at every update of a group with a
delay (sync-phase ones too). The forward/backward of the next batch then runs at

.. math:: \hat x = x - c\, u_{last},

and the weights are restored, bit for bit, before the update (``Delayed.predicted_weights``).

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

import torch

from delaylab.errors import ConfigError
from delaylab.optim.corrector import Corrector, Spare, Update


class Extrapolation(Corrector):
    keys = ("u_last",)

    def coefficient(self, tau: int, ahead: int) -> float:
        """``c`` for a group with delay ``tau > 0`` whose next gradient waits ``ahead`` updates."""
        raise NotImplementedError

    def weight_shift(self, st: dict, update: Update, ahead: int):
        u = st.get("u_last")
        if u is None or not (update.delayed and update.tau):
            return None
        c = self.coefficient(update.tau, ahead)
        return (u, c) if c else None

    def wraps(self, update: Update) -> bool:
        return update.tau > 0

    def before(self, p, st, update, spare: Spare) -> torch.Tensor:
        return spare.copy_of(p)

    def after(self, p, st, update, x_before, spare: Spare) -> None:
        old = st.get("u_last")
        st["u_last"] = x_before.sub_(p)
        if old is not None:
            spare.give(old)


class WeightPrediction(Extrapolation):
    name = "predict"

    def coefficient(self, tau: int, ahead: int) -> float:
        return float(ahead)


class Lookahead(Extrapolation):
    name = "lookahead"
    keywords = {"lookahead_momentum": "gamma"}

    def __init__(self, gamma: float = 0.99):
        if not gamma >= 0:
            raise ConfigError(f"lookahead_momentum must be >= 0, got {gamma}")
        self.gamma = float(gamma)

    def hyper(self) -> dict:
        return {"gamma": self.gamma}

    def coefficient(self, tau: int, ahead: int) -> float:
        return self.gamma
