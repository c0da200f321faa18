r"""A staleness threshold: gradients older than ``K`` updates are discarded (``--correction drop:K``).

Ringmaster ASGD (Maranjyan, Tyurin and Richtarik, ICML 2025, arXiv 2501.16168) and Ringmaster LMO
(Sadiev, Maranjyan, Ilin and Richtarik, arXiv 2605.18174, its LMO/Muon-momentum form): a server
that receives the gradient ``g_k = grad f(x_{k - delta_k}; xi)`` uses it only if its delay is under
the threshold ``R``; otherwise the gradient is ignored and no iteration is made. With
``K = R - 1`` (accept ``delta <= K``):

.. math::
    x_{k+1} = x_k - u_k(g_k) \quad \text{if } \delta_k \le K, \qquad
    \text{else the gradient is discarded and } x \text{ and every optimizer state stay as they are}.

Ringmaster LMO's update is Muon's (``m_k = (1 - alpha) m_{k-1} + alpha g_k``,
``x_{k+1} = x_k + eta lmo(m_k)``), so ``drop:K`` on Muon is that method; on another optimizer it is
the same threshold in front of that optimizer.

Here it acts under a delay distribution (``--delay-dist``), where each call's gradient has its own
delay ``tau_c`` (:class:`~delaylab.optim.queue.DelayDistribution`, drawn per call): a call with
``tau_c > K`` in a delayed phase makes no update (the step is skipped, as the paper defines it; the
forward/backward was spent), so ``T`` updates take more calls, each discarded gradient one more.
Delays are drawn per call independently of the discards: a discard does not make the gradients in
flight fresher, as it would in a system of workers (Ringmaster's worker restarts at the current
point). Under a constant delay every gradient has the same age, so a threshold would keep them
all or discard them all: it is refused there.
"""

from __future__ import annotations

from delaylab.errors import ConfigError
from delaylab.optim.corrector import Corrector, Update


class StalenessThreshold(Corrector):
    name = "drop"

    def __init__(self, k: int = 0):
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ConfigError(f"drop:K takes an integer K >= 0 (the largest delay kept), got {k!r}")
        self.k = k

    def hyper(self) -> dict:
        return {"k": self.k}

    def discards(self, update: Update) -> bool:
        return update.delayed and update.tau > self.k
