"""Stochastic Lanczos quadrature (SLQ): the spectral density of a symmetric operator from matvecs.

Ubaru, Chen, Saad 2017, "Fast Estimation of tr(f(A)) via Stochastic Lanczos Quadrature";
Ghorbani, Krishnan, Xiao 2019, "An Investigation into Neural Net Optimization via Hessian
Eigenvalue Density" (the same method on neural-net Hessians). For each of ``probes`` random
unit vectors v, ``steps`` Lanczos steps (full reorthogonalization, float64) give a tridiagonal
T whose eigenvalues theta_k and squared first components tau_k are a Gauss quadrature for the
measure v^T delta(lambda - A) v; averaged over probes and scaled by n, the nodes theta_k with
multiplicities n tau_k / probes estimate the density (sum of multiplicities = n, sum of
multiplicity x node = an unbiased estimate of tr A). The top Ritz value converges to the top
eigenvalue first. Imports nothing but numpy.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from delaylab.errors import ConfigError


def lanczos(matvec: Callable[[np.ndarray], np.ndarray], v0: np.ndarray, steps: int):
    """(alpha, beta) of the Lanczos tridiagonal from start vector v0 (normalized here)."""
    n = v0.size
    steps = min(steps, n)
    Q = np.zeros((steps, n))
    alpha, beta = np.zeros(steps), np.zeros(max(steps - 1, 0))
    q = v0 / np.linalg.norm(v0)
    for j in range(steps):
        Q[j] = q
        w = np.asarray(matvec(q), dtype=float)
        alpha[j] = q @ w
        w = w - Q[: j + 1].T @ (Q[: j + 1] @ w)  # full reorthogonalization, twice (Kahan: twice is enough)
        w = w - Q[: j + 1].T @ (Q[: j + 1] @ w)
        if j == steps - 1:
            break
        b = np.linalg.norm(w)
        if b < 1e-12 * max(1.0, abs(alpha[j])):  # an invariant subspace: the quadrature is exact
            return alpha[: j + 1], beta[:j]
        beta[j] = b
        q = w / b
    return alpha, beta


def slq(matvec: Callable[[np.ndarray], np.ndarray], n: int, probes: int = 4, steps: int = 30, seed: int = 0):
    """(nodes, weights): the density estimate, weights summing to n (see module doc)."""
    if probes < 1 or steps < 1 or n < 1:
        raise ConfigError(f"slq needs probes, steps and n >= 1, got {probes}, {steps}, {n}")
    rng = np.random.default_rng(seed)
    nodes, weights = [], []
    for _ in range(probes):
        v = rng.choice([-1.0, 1.0], size=n)  # Rademacher: E[v v^T] = I
        a, b = lanczos(matvec, v, steps)
        theta, S = np.linalg.eigh(np.diag(a) + np.diag(b, 1) + np.diag(b, -1))
        nodes.append(theta)
        weights.append(n * S[0] ** 2 / probes)
    return np.concatenate(nodes), np.concatenate(weights)
