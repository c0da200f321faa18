"""Linear minimization oracles (LMOs) over unit norm balls, their norms and dual norms.

For a norm ``||.||`` with dual ``||.||_*``, ``lmo(m) = argmin_{||d|| <= 1} <m, d>``, so that
``<m, lmo(m)> = -||m||_*`` and ``||lmo(m)|| = 1`` whenever ``m != 0``:

=========  =========================  ============  =========
norm       lmo(m)                     dual norm     method
=========  =========================  ============  =========
spectral   -U V^T  (m = U S V^T)      nuclear       Muon
sign       -sign(m)   (l_inf ball)    l1            signSGD / Signum
l2         -m / ||m||_2               l2            normalized SGD
=========  =========================  ============  =========

Shapes. The first ``batch_dims`` dimensions index independent problems (a ``(S, m, n)`` tensor
holds S matrices). Of the rest, a 0-d/1-d tensor is a column vector (so its spectral norm is
its l2 norm) and a >2-d tensor is flattened to ``(shape[0], -1)``, as Muon does for convolutions.

The spectral LMO is exact via an SVD, or approximate via a Newton-Schulz iteration. With the
quintic coefficients of Muon (Jordan et al. 2024), five steps in bfloat16 give ``U S' V^T`` with
``S'`` roughly in [0.7, 1.2] rather than exactly ``U V^T``; ``tests/optim/test_lmo.py`` states
the relative error measured against the SVD polar factor. The classical cubic coefficients
(1.5, -0.5, 0) converge to ``U V^T`` itself and are the accurate choice.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from delaylab.errors import ConfigError

NORMS = ("spectral", "sign", "l2")
_ALIASES = {"linf": "sign", "inf": "sign", "frobenius": "l2", "euclidean": "l2"}
DUAL_NAMES = {"spectral": "nuclear", "sign": "l1", "l2": "l2"}

# Muon's quintic coefficients (Jordan et al. 2024; the values torch.optim.Muon uses).
MUON_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
CUBIC_COEFFICIENTS = (1.5, -0.5, 0.0)


def canonical_norm(norm: str) -> str:
    """``"linf"`` -> ``"sign"`` etc.; raises ConfigError for an unknown norm."""
    name = _ALIASES.get(norm, norm)
    if name not in NORMS:
        raise ConfigError(f"unknown norm {norm!r}; expected one of {', '.join(NORMS)}")
    return name


def _as_matrices(x: Tensor, batch_dims: int) -> Tensor:
    """View ``x`` as a batch of matrices ``(*batch, rows, cols)`` (see the module docstring)."""
    if batch_dims < 0 or batch_dims > x.ndim:
        raise ConfigError(f"batch_dims={batch_dims} is out of range for a {x.ndim}-d tensor")
    batch, rest = x.shape[:batch_dims], x.shape[batch_dims:]
    if len(rest) == 0:
        return x.reshape(*batch, 1, 1)
    if len(rest) == 1:
        return x.reshape(*batch, rest[0], 1)
    return x.reshape(*batch, rest[0], math.prod(rest[1:]))


def _flat(x: Tensor, batch_dims: int) -> Tensor:
    return x.reshape(*x.shape[:batch_dims], -1)


def newton_schulz(
    m: Tensor,
    steps: int = 5,
    coefficients: tuple[float, float, float] = MUON_COEFFICIENTS,
    eps: float = 1e-7,
    dtype: torch.dtype | None = torch.bfloat16,
) -> Tensor:
    """Approximate polar factor ``U V^T`` of a (batch of) matrices ``m = U S V^T``.

    Iterates ``X <- a X + (b A + c A^2) X`` with ``A = X X^T`` from ``X = m / ||m||_F`` (which
    puts every singular value in (0, 1]), on the wide orientation so that ``A`` is the small
    Gram matrix. For an unbatched matrix the operations and their order are those of
    ``torch.optim.Muon``, so the result agrees with it bit for bit in the same ``dtype``.
    Returns a tensor of ``dtype`` (``None`` keeps ``m``'s dtype) and ``m``'s shape.
    """
    if m.ndim < 2:
        raise ConfigError("newton_schulz needs a matrix or a batch of matrices")
    if steps < 0:
        raise ConfigError(f"steps must be >= 0, got {steps}")
    a, b, c = coefficients
    x = m if dtype is None else m.to(dtype)
    tall = m.size(-2) > m.size(-1)
    if tall:
        x = x.mT
    if x.ndim == 2:
        x = x / x.norm().clamp(min=eps)
        for _ in range(steps):
            gram = x @ x.T
            poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
            x = torch.addmm(x, poly, x, beta=a)
    else:
        x = x / torch.linalg.matrix_norm(x, keepdim=True).clamp(min=eps)
        for _ in range(steps):
            gram = x @ x.mT
            poly = b * gram + c * (gram @ gram)
            x = a * x + poly @ x
    return x.mT if tall else x


def _polar(mats: Tensor, method: str, ns_steps: int, ns_coefficients, ns_dtype) -> Tensor:
    if method == "svd":
        u, _, vh = torch.linalg.svd(mats, full_matrices=False)
        return u @ vh
    if method == "newton-schulz":
        return newton_schulz(mats, ns_steps, ns_coefficients, dtype=ns_dtype)
    raise ConfigError(f"unknown method {method!r}; expected 'svd' or 'newton-schulz'")


def ascent_direction(
    m: Tensor,
    norm: str,
    batch_dims: int = 0,
    method: str = "svd",
    ns_steps: int = 5,
    ns_coefficients: tuple[float, float, float] = MUON_COEFFICIENTS,
    ns_dtype: torch.dtype | None = torch.bfloat16,
) -> Tensor:
    """``-lmo(m)``: the unit-norm direction maximising ``<m, d>``, in ``m``'s shape.

    Optimizers step with ``p.add_(ascent_direction(m), alpha=-lr)``, which is ``p + lr*lmo(m)``
    without an extra negation pass. The Newton-Schulz result keeps ``ns_dtype``.
    """
    norm = canonical_norm(norm)
    if norm == "sign":
        return torch.sign(m)
    if norm == "l2":
        nrm = _flat(m, batch_dims).norm(dim=-1)
        scale = torch.where(nrm > 0, 1.0 / nrm, torch.zeros_like(nrm))
        return m * scale.reshape(*scale.shape, *([1] * (m.ndim - batch_dims)))
    mats = _as_matrices(m, batch_dims)
    return _polar(mats, method, ns_steps, ns_coefficients, ns_dtype).reshape(m.shape)


def lmo(m: Tensor, norm: str, batch_dims: int = 0, method: str = "svd", **ns_options) -> Tensor:
    """``argmin_{||d|| <= 1} <m, d>`` over the unit ball of ``norm`` (see the module docstring)."""
    return -ascent_direction(m, norm, batch_dims, method, **ns_options)


def primal_norm(x: Tensor, norm: str, batch_dims: int = 0) -> Tensor:
    """``||x||`` in the LMO's own norm: spectral (largest singular value), l_inf, or l2."""
    norm = canonical_norm(norm)
    if norm == "spectral":
        return torch.linalg.matrix_norm(_as_matrices(x, batch_dims), ord=2)
    if norm == "sign":
        return _flat(x, batch_dims).abs().amax(dim=-1)
    return _flat(x, batch_dims).norm(dim=-1)


def dual_norm(g: Tensor, norm: str, batch_dims: int = 0) -> Tensor:
    """``||g||_*``, the dual of ``norm``: nuclear for spectral, l1 for sign (l_inf), l2 for l2."""
    norm = canonical_norm(norm)
    if norm == "spectral":
        return torch.linalg.svdvals(_as_matrices(g, batch_dims)).sum(dim=-1)
    if norm == "sign":
        return _flat(g, batch_dims).abs().sum(dim=-1)
    return _flat(g, batch_dims).norm(dim=-1)


def muon_lr_scale(shape: torch.Size | tuple[int, ...], batch_dims: int = 0) -> float:
    """Muon's per-shape step scaling ``sqrt(max(1, rows/cols))`` (torch.optim.Muon "original")."""
    rows, cols = _as_matrices(torch.empty(shape, device="meta"), batch_dims).shape[-2:]
    return math.sqrt(max(1.0, rows / cols))
