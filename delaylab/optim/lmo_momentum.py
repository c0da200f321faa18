"""LMOMomentum: the momentum-LMO method the theory analyses (Muon, Signum, normalized SGD)."""

from __future__ import annotations

import torch
from torch.optim import Optimizer

from delaylab.errors import ConfigError
from delaylab.optim._closure import closure_loss
from delaylab.optim.lmo import (
    MUON_COEFFICIENTS,
    ascent_direction,
    canonical_norm,
    muon_lr_scale,
)

_SCALES = ("none", "muon")
_METHODS = ("svd", "newton-schulz")


class LMOMomentum(Optimizer):
    r"""Momentum followed by a linear minimization oracle over a norm ball.

    .. math::
        m_t = \beta m_{t-1} + (1-\beta) g_t, \qquad
        c_t = \begin{cases} \beta m_t + (1-\beta) g_t & \text{nesterov} \\ m_t \end{cases}, \\
        x_{t+1} = (1 - \eta\lambda) x_t + \eta\, s\, \mathrm{LMO}(c_t),

    with ``m_{-1} = 0``, ``||LMO(c)|| = 1`` in the chosen norm (see :mod:`delaylab.optim.lmo`),
    ``lambda`` the decoupled weight decay and ``s`` the step scale (1, or Muon's
    ``sqrt(max(1, rows/cols))`` with ``scale="muon"``). Without weight decay and with ``s = 1``
    every step has norm exactly ``lr`` -- the property the delayed bounds rest on.

    Relation to ``torch.optim.Muon`` (torch 2.13): it uses the same EMA momentum (``lerp``), the
    same Nesterov combination and, with ``norm="spectral", method="newton-schulz",
    nesterov=True, scale="muon"``, the same Newton-Schulz iteration in bfloat16 and the same
    weight-decay rule, so the two agree bit for bit on 2-D parameters (tested). Its docstring
    writes the buffer as a sum, ``B_t = mu B_{t-1} + g_t``, which is ``1/(1-mu)`` times the EMA;
    the LMO is invariant to positive scaling, so only the EMA form matters.

    Args:
        params: parameters or param groups.
        lr: step norm ``eta`` (> 0).
        beta: momentum in [0, 1).
        norm: ``"spectral"`` (Muon), ``"sign"`` (l_inf ball: Signum), ``"l2"`` (normalized SGD).
        nesterov: take the direction from ``beta m_t + (1-beta) g_t``.
        weight_decay: decoupled decay ``x <- (1 - lr*wd) x``.
        batch_dims: leading dims that index independent problems (e.g. seeds).
        method: ``"svd"`` (exact polar factor) or ``"newton-schulz"``.
        ns_steps, ns_coefficients, ns_dtype: the Newton-Schulz iteration.
        scale: ``"none"`` or ``"muon"`` (see above).
    """

    # Each parameter's step reads only its own gradient and state (delaylab.optim.capabilities); on CUDA the
    # batched SVDs of equal shapes make that true to rounding only, and the per-parameter path is CPU-only.
    steps_per_parameter = True

    def __init__(
        self,
        params,
        lr: float,
        beta: float = 0.95,
        norm: str = "spectral",
        nesterov: bool = False,
        weight_decay: float = 0.0,
        *,
        batch_dims: int = 0,
        method: str = "svd",
        ns_steps: int = 5,
        ns_coefficients: tuple[float, float, float] = MUON_COEFFICIENTS,
        ns_dtype: torch.dtype | None = torch.bfloat16,
        scale: str = "none",
    ):
        if not lr > 0:
            raise ConfigError(f"lr must be > 0, got {lr}")
        if not 0.0 <= beta < 1.0:
            raise ConfigError(f"beta must be in [0, 1), got {beta}")
        if not weight_decay >= 0:
            raise ConfigError(f"weight_decay must be >= 0, got {weight_decay}")
        if method not in _METHODS:
            raise ConfigError(f"unknown method {method!r}; expected one of {_METHODS}")
        if scale not in _SCALES:
            raise ConfigError(f"unknown scale {scale!r}; expected one of {_SCALES}")
        if batch_dims < 0:
            raise ConfigError(f"batch_dims must be >= 0, got {batch_dims}")
        defaults = dict(
            lr=lr,
            beta=beta,
            norm=canonical_norm(norm),
            nesterov=nesterov,
            weight_decay=weight_decay,
            batch_dims=batch_dims,
            method=method,
            ns_steps=ns_steps,
            ns_coefficients=tuple(ns_coefficients),
            ns_dtype=ns_dtype,
            scale=scale,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        for group in self.param_groups:
            lr, beta, wd = group["lr"], group["beta"], group["weight_decay"]
            params, sources = [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - beta)
                params.append(p)
                sources.append(p.grad.lerp(buf, beta) if group["nesterov"] else buf)
            for p, direction in zip(params, self._directions(sources, group)):
                step = lr
                if group["scale"] == "muon":
                    step = lr * muon_lr_scale(p.shape, group["batch_dims"])
                if wd:
                    p.mul_(1 - lr * wd)
                p.add_(direction, alpha=-step)
        return loss

    @staticmethod
    def _directions(sources: list[torch.Tensor], group: dict) -> list[torch.Tensor]:
        """``ascent_direction`` of each source. Exact spectral LMOs (``method="svd"``) of CUDA
        tensors go in one batched SVD per shape: one cuSOLVER call per shape (a few per model)
        instead of one per matrix, each of which may wait for the device. Elsewhere one call per
        tensor (the CPU's results stay those the tests pin)."""
        options = dict(ns_steps=group["ns_steps"], ns_coefficients=group["ns_coefficients"],
                       ns_dtype=group["ns_dtype"])
        norm, batch_dims, method = group["norm"], group["batch_dims"], group["method"]
        batched = norm == "spectral" and method == "svd"
        out: list[torch.Tensor | None] = [None] * len(sources)
        shapes: dict[tuple, list[int]] = {}
        for i, src in enumerate(sources):
            if batched and _batch_svd(src):
                shapes.setdefault((src.shape, src.dtype, src.device), []).append(i)
            else:
                out[i] = ascent_direction(src, norm, batch_dims, method, **options)
        for idx in shapes.values():
            stacked = ascent_direction(torch.stack([sources[i] for i in idx]), norm, batch_dims + 1, method, **options)
            for i, d in zip(idx, stacked.unbind(0)):
                out[i] = d
        return out


def _batch_svd(t: torch.Tensor) -> bool:
    return t.is_cuda
