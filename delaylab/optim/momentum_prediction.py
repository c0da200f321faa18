r"""Weight prediction along the raw momentum (``--correction predict-momentum``), the variant of
marin's delayed-gradient study (marin-community/marin #6423, #6431) that extrapolates the
momentum buffer instead of the applied update:

.. math:: \hat x = x - a\, \eta\, m, \qquad m_k = \beta m_{k-1} + (1-\beta) g_k, \quad m_{-1} = 0,

the forward/backward of the next batch run at ``x_hat`` (``Delayed.predicted_weights``), with
``a`` the updates its gradient will wait for (``tau`` once the queue is full, as ``predict``),
``eta`` the group's lr for its next update and ``m`` an EMA of the gradients the group applied,
with the group's own momentum ``beta`` (``momentum``: Muon, SGD; ``beta``: LMOMomentum;
``betas[0]``: Adam-type). For Muon this ``m`` is torch's Muon buffer (an EMA, ``lerp``), before
Newton-Schulz; for AdamW it is ``exp_avg``. marin found this worse than no correction for Muon
and prediction along the applied (orthogonalised) update, ``predict``, the one that helps: the
two differ for Muon in direction and in scale (``eta m`` has the gradient's scale, the update
has norm about ``eta``).

One parameter-sized buffer (``state[p]["grad_ema"]``), updated at every update of a group with a
delay. Not defined under a delay distribution (the config refuses it there).
"""

from __future__ import annotations

from delaylab.optim.corrector import Corrector, Spare, Update


def momentum_beta(group: dict) -> float:
    """The momentum of the group's optimizer: ``momentum``, ``beta`` or ``betas[0]``."""
    for key in ("momentum", "beta"):
        if key in group:
            return float(group[key])
    return float(group["betas"][0])


class MomentumPrediction(Corrector):
    name = "predict-momentum"
    keys = ("grad_ema",)

    def weight_shift(self, st: dict, update: Update, ahead: int):
        m = st.get("grad_ema")
        if m is None or not (update.delayed and update.tau and ahead) or update.param_group is None:
            return None
        return m, ahead * float(update.param_group["lr"])

    def wraps(self, update: Update) -> bool:
        return update.tau > 0 and update.param_group is not None

    def before(self, p, st, update, spare: Spare) -> None:
        if p.grad is None:
            return
        m = st.get("grad_ema")
        if m is None:
            m = st["grad_ema"] = p.grad.detach().new_zeros(p.shape)
        m.lerp_(p.grad, 1 - momentum_beta(update.param_group))
