r"""RotatedAdam: Adam in the eigenbasis of the gradient's Kronecker factors (basis rotation).

Jung, Shin and Lee, "Mitigating Staleness in Asynchronous Pipeline Parallelism via Basis Rotation",
ICML 2026 (arXiv 2602.03515), Algorithm 1 with the eigenbasis estimated from second-order
statistics on both sides of the matrix (their ``rotation_geometry="bi"``, ``approx_source="2nd"``,
the setting of their released runs). Their finding: Adam's delay penalty grows when the Hessian's
eigenbasis is misaligned with the coordinate axes, and running Adam in a basis that approximately
diagonalises the curvature keeps delayed updates useful.

For a matrix parameter ``W`` (m x n) with gradient ``G_t`` at its step ``t = 1, 2, ...``:

.. math::
    L_t = \beta_s L_{t-1} + (1-\beta_s) G_t G_t^\top, \qquad
    R_t = \beta_s R_{t-1} + (1-\beta_s) G_t^\top G_t, \qquad L_0 = R_0 = 0,

the bases ``Q_L, Q_R`` are refreshed at ``t = 1`` (eigenvectors of ``L_1, R_1``, eigenvalues in
descending order) and at every ``t`` divisible by ``k`` (one warm-started power-iteration step:
``est = diag(Q^T L Q)``, the columns of ``Q`` and the matching axis of ``V`` sorted by ``est``
descending, then ``Q <- qr(L Q)``), before the moments are updated;

.. math::
    M_t = \beta_1 M_{t-1} + (1-\beta_1) G_t, \qquad
    V_t = \beta_2 V_{t-1} + (1-\beta_2) (Q_L^\top G_t Q_R)^{\odot 2},

    W_{t} = (1 - \eta\lambda) W_{t-1} - \eta \frac{\sqrt{1-\beta_2^t}}{1-\beta_1^t}
            Q_L \frac{Q_L^\top M_t Q_R}{\sqrt{V_t} + \epsilon} Q_R^\top,

with ``beta_s = beta_2`` unless ``shampoo_beta`` is given. The first moment is kept in the
parameter's own coordinates and rotated when it is used; the second in the rotated ones.

**Against SOAP.** Vyas et al.'s SOAP (``pytorch_optimizer.SOAP``, the registry's ``soap``) is the
same idea with three differences in the update, so it does not serve as this method: SOAP skips its
first step (it only sets the bases), projects each gradient with the bases of the previous step
(its statistics and bases are refreshed after the update), and decays the weights after the step,
``(W - eta s U)(1 - eta lambda)``. The registry's ``rotated-adam`` is this class on the hidden
matrices and AdamW on the rest (embeddings, head, norms, biases), the split of the paper's code.

Every parameter's step reads only its own gradient and state, so it steps one parameter at a time
(:mod:`delaylab.optim.capabilities`) and runs under ``Delayed`` with any corrector.
"""

from __future__ import annotations

import math

import torch
from torch.optim import Optimizer

from delaylab.errors import ConfigError
from delaylab.optim._closure import closure_loss


class RotatedAdam(Optimizer):
    """Adam in the eigenbasis of the gradient's Kronecker factors (see the module docstring).

    Args:
        params: 2-D parameters or param groups of them.
        lr: peak lr ``eta`` (> 0).
        betas: ``(beta1, beta2)``, each in [0, 1).
        eps: added to ``sqrt(V)``.
        weight_decay: decoupled decay ``lambda``.
        precondition_frequency: ``k``, updates between basis refreshes (>= 1).
        shampoo_beta: ``beta_s`` of the Kronecker factors; None: ``beta2``.
    """

    steps_per_parameter = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.0,
                 precondition_frequency: int = 10, shampoo_beta: float | None = None):
        if not lr > 0:
            raise ConfigError(f"lr must be > 0, got {lr}")
        b1, b2 = betas
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ConfigError(f"betas must be in [0, 1), got {tuple(betas)}")
        if shampoo_beta is not None and not 0 <= shampoo_beta < 1:
            raise ConfigError(f"shampoo_beta must be in [0, 1), got {shampoo_beta}")
        if isinstance(precondition_frequency, bool) or not isinstance(precondition_frequency, int) \
                or precondition_frequency < 1:
            raise ConfigError(f"precondition_frequency must be an integer >= 1, got {precondition_frequency!r}")
        if not (eps >= 0 and weight_decay >= 0):
            raise ConfigError(f"eps and weight_decay must be >= 0, got {eps} and {weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      precondition_frequency=precondition_frequency, shampoo_beta=shampoo_beta))
        for g in self.param_groups:
            for p in g["params"]:
                if p.ndim != 2:
                    raise ConfigError(f"RotatedAdam rotates matrices; got a parameter of shape {tuple(p.shape)} "
                                      f"(give the others to AdamW, as build_optimizer('rotated-adam') does)")

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        for group in self.param_groups:
            b1, b2 = group["betas"]
            bs = b2 if group["shampoo_beta"] is None else group["shampoo_beta"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                self._step_one(p, p.grad, self.state[p], group, b1, b2, bs)
        return loss

    def _step_one(self, p, g, st, group, b1, b2, bs) -> None:
        if not st:
            st["step"] = 0
            st["exp_avg"] = torch.zeros_like(p)
            st["exp_avg_sq"] = torch.zeros_like(p)
            st["L"] = torch.zeros(p.shape[0], p.shape[0], dtype=p.dtype, device=p.device)
            st["R"] = torch.zeros(p.shape[1], p.shape[1], dtype=p.dtype, device=p.device)
        st["step"] += 1
        t = st["step"]
        st["L"].lerp_(g @ g.T, 1 - bs)
        st["R"].lerp_(g.T @ g, 1 - bs)
        if "QL" not in st:
            st["QL"], st["QR"] = _eigenbasis(st["L"]), _eigenbasis(st["R"])
        elif t % group["precondition_frequency"] == 0:
            st["QL"], st["exp_avg_sq"] = _power_step(st["L"], st["QL"], st["exp_avg_sq"], 0)
            st["QR"], st["exp_avg_sq"] = _power_step(st["R"], st["QR"], st["exp_avg_sq"], 1)
        ql, qr = st["QL"], st["QR"]
        st["exp_avg"].lerp_(g, 1 - b1)
        rotated = ql.T @ g @ qr
        st["exp_avg_sq"].mul_(b2).addcmul_(rotated, rotated, value=1 - b2)
        direction = ql @ ((ql.T @ st["exp_avg"] @ qr) / (st["exp_avg_sq"].sqrt() + group["eps"])) @ qr.T
        if group["weight_decay"]:
            p.mul_(1 - group["lr"] * group["weight_decay"])
        p.add_(direction, alpha=-group["lr"] * math.sqrt(1 - b2 ** t) / (1 - b1 ** t))


def _eigenbasis(m: torch.Tensor) -> torch.Tensor:
    """Eigenvectors of the symmetric ``m``, eigenvalues descending (at least float32)."""
    dtype = torch.promote_types(m.dtype, torch.float32)
    _, q = torch.linalg.eigh(m.to(dtype))
    return q.flip(1).to(m.dtype)


def _power_step(m: torch.Tensor, q: torch.Tensor, v: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One warm-started power-iteration step of the basis ``q`` of ``m``; the second moment ``v``'s
    axis ``dim`` permuted with the columns (sorted by the estimated eigenvalue, descending)."""
    mq = m @ q
    order = torch.argsort((q * mq).sum(0), descending=True)
    dtype = torch.promote_types(m.dtype, torch.float32)
    new, _ = torch.linalg.qr(mq[:, order].to(dtype))
    return new.to(m.dtype), v.index_select(dim, order)
