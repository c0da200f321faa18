"""Estimators of the constants the bounds assume: L, sigma, Delta, rho, G0.

They take plain callables on *points* -- a numpy array, or a list of arrays (one per
parameter block, e.g. the tensors of a model) -- or a torch model through
:class:`TorchObjective`. What each estimate is:

* ``L`` from sampled pairs: max ||grad f(x) - grad f(y)||_* / ||x - y|| over the pairs. It is
  a **lower estimate** of the true L (a supremum over all pairs); pairs along a trajectory
  measure the curvature the run actually met, which is what the bound uses in practice.
* ``sigma`` from repeated stochastic gradients at the same point: the unbiased sample
  variance of the Euclidean norm (or the error against a known full gradient). The bound
  needs a supremum over points, so the max over sampled points is again a lower estimate.
* ``Delta`` from a loss trace: f(x0) - min(trace) is a lower estimate of f(x0) - inf f;
  with a known lower bound on f (0 for cross-entropy) f(x0) - f_lower is an upper one.
* ``rho`` exactly, from the block shapes: the product norm max_l ||x_l|| has dual
  sum_l ||g_l||_*, so ||g||_* <= sqrt(sum_l rho_l^2) ||g||_2.

Norms (the method's norm on each block, with the max over blocks): ``"l2"``; ``"sign"``
(l_inf, dual l1; sign descent); ``"spectral"`` (operator norm, dual nuclear; Muon) on 2-D
blocks, tensors of more dims flattened to (shape[0], -1), and l2 on 1-D blocks. These are
written here, in numpy, because theory may not import :mod:`delaylab.optim` (whose
``lmo.dual_norm`` works on torch tensors); torch inputs are converted to float64 numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
from delaylab.errors import ConfigError

NORMS = ("l2", "sign", "spectral")


def _blocks(x) -> list[np.ndarray]:
    if isinstance(x, (list, tuple)):
        return [_to_numpy(b) for b in x]
    return [_to_numpy(x)]


def _to_numpy(a) -> np.ndarray:
    if hasattr(a, "detach"):  # a torch tensor
        a = a.detach().to("cpu").double().numpy()
    return np.asarray(a, dtype=float)


def _check_norm(norm: str) -> None:
    if norm not in NORMS:
        raise ConfigError(f"unknown norm {norm!r}; choose from {', '.join(NORMS)}")


def _matrix(b: np.ndarray) -> np.ndarray | None:
    """The block as a matrix for the spectral norm, or None for a vector / scalar block."""
    if b.ndim < 2:
        return None
    return b.reshape(b.shape[0], -1)


def primal_norm(x, norm: str) -> float:
    """||x|| in the method's norm: the max over blocks of each block's norm."""
    _check_norm(norm)
    out = 0.0
    for b in _blocks(x):
        if norm == "l2":
            v = float(np.linalg.norm(b))
        elif norm == "sign":
            v = float(np.abs(b).max()) if b.size else 0.0
        else:
            m = _matrix(b)
            v = float(np.linalg.norm(b)) if m is None else float(np.linalg.norm(m, 2))
        out = max(out, v)
    return out


def dual_norm(g, norm: str) -> float:
    """||g||_* of the product norm: the sum over blocks of each block's dual norm."""
    _check_norm(norm)
    out = 0.0
    for b in _blocks(g):
        if norm == "l2":
            out += float(np.linalg.norm(b))
        elif norm == "sign":
            out += float(np.abs(b).sum())
        else:
            m = _matrix(b)
            out += float(np.linalg.norm(b)) if m is None else float(np.linalg.svd(m, compute_uv=False).sum())
    return out


def rho(shapes, norm: str) -> float:
    """The norm-equivalence constant: ||g||_* <= rho ||g||_2 over blocks of these shapes."""
    _check_norm(norm)
    if shapes and isinstance(shapes[0], int):
        shapes = [tuple(shapes)]
    total = 0.0
    for shp in shapes:
        shp = tuple(shp)
        numel = int(np.prod(shp)) if shp else 1
        if norm == "l2":
            r2 = 1.0
        elif norm == "sign":
            r2 = float(numel)
        else:
            r2 = float(min(shp[0], numel // shp[0])) if len(shp) >= 2 else 1.0
        total += r2
    return math.sqrt(total)


def _sub(x, y) -> list[np.ndarray]:
    return [a - b for a, b in zip(_blocks(x), _blocks(y))]


@dataclass(frozen=True)
class Estimate:
    """An estimated constant: ``value``, what kind of estimate it is, and the raw samples."""

    value: float
    kind: str                 # "lower", "upper", "estimate" or "exact"
    n: int = 0
    samples: np.ndarray = field(default_factory=lambda: np.zeros(0))
    note: str = ""

    def __float__(self) -> float:
        return float(self.value)


def estimate_smoothness(grad: Callable, points: Sequence, norm: str = "l2", n_random: int = 0,
                        n_perturb: int = 0, radius: float = 1e-3, seed: int = 0) -> Estimate:
    """Lower estimate of L: the max of ||grad(x) - grad(y)||_* / ||x - y|| over sampled pairs.

    Pairs: consecutive points of ``points`` (a trajectory), ``n_random`` random pairs of its
    points, and ``n_perturb`` pairs (x, x + radius * u) with x on the trajectory and u a random
    Gaussian direction scaled to unit norm (probes curvature off the path).
    """
    _check_norm(norm)
    pts = list(points)
    if len(pts) < 2 and n_perturb == 0:
        raise ConfigError("need at least two points (or n_perturb > 0)")
    rng = np.random.default_rng(seed)
    grads = [_blocks(grad(p)) for p in pts]
    pairs = [(i, i + 1) for i in range(len(pts) - 1)]
    if len(pts) >= 2:
        for _ in range(n_random):
            i, j = rng.choice(len(pts), 2, replace=False)
            pairs.append((int(i), int(j)))
    ratios = []
    for i, j in pairs:
        dx = primal_norm(_sub(pts[i], pts[j]), norm)
        if dx > 0:
            ratios.append(dual_norm(_sub(grads[i], grads[j]), norm) / dx)
    for _ in range(n_perturb):
        i = int(rng.integers(len(pts)))
        u = [rng.normal(size=b.shape) for b in _blocks(pts[i])]
        scale = radius / primal_norm(u, norm)
        y = [b + scale * v for b, v in zip(_blocks(pts[i]), u)]
        if not isinstance(pts[i], (list, tuple)):
            y = y[0]  # hand grad the same kind of point it was given
        ratios.append(dual_norm(_sub(grad(y), grads[i]), norm) / radius)
    if not ratios:
        raise ConfigError("all sampled pairs coincide")
    r = np.array(ratios)
    return Estimate(float(r.max()), "lower", len(r), r,
                    "max over sampled pairs; the true L (a sup over all pairs) can only be larger")


def estimate_sigma(stoch_grad: Callable, points: Sequence, n_samples: int = 16,
                   full_grad: Callable | None = None) -> Estimate:
    """Estimate sigma, E||g - grad f||_2^2 <= sigma^2, from ``n_samples`` draws at each point.

    ``stoch_grad(point, i)`` returns the i-th stochastic gradient at ``point`` (independent
    draws for different i). With ``full_grad`` the error against it is used; otherwise the
    unbiased sample variance sum ||g_i - mean||^2 / (n - 1). ``value`` is the max over
    points (the bound needs a sup); ``samples`` holds each point's estimate.
    """
    if n_samples < 2:
        raise ConfigError(f"n_samples must be >= 2, got {n_samples}")
    per_point = []
    for p in points:
        gs = [_blocks(stoch_grad(p, i)) for i in range(n_samples)]
        if full_grad is not None:
            ref, dof = _blocks(full_grad(p)), n_samples
        else:
            ref = [np.mean([g[k] for g in gs], axis=0) for k in range(len(gs[0]))]
            dof = n_samples - 1
        ss = sum(sum(float(((gk - rk) ** 2).sum()) for gk, rk in zip(g, ref)) for g in gs)
        per_point.append(math.sqrt(ss / dof))
    if not per_point:
        raise ConfigError("need at least one point")
    s = np.array(per_point)
    return Estimate(float(s.max()), "estimate", len(s) * n_samples, s,
                    "max over sampled points of the per-point estimate; the sup may be larger")


def estimate_delta(losses: Sequence[float], f_lower: float | None = None, window: int = 1) -> dict:
    """Bracket Delta = f(x0) - inf f from a loss trace.

    ``window`` smooths a stochastic trace (moving average) before the first value and the
    minimum are read. Returns {"lower": Estimate, "upper": Estimate or None}.
    """
    v = np.asarray(losses, dtype=float)
    if v.ndim != 1 or v.size == 0 or not np.all(np.isfinite(v)):
        raise ConfigError("losses must be a non-empty 1-D sequence of finite numbers")
    if window < 1 or window > v.size:
        raise ConfigError(f"window must be in [1, {v.size}], got {window}")
    smooth = np.convolve(v, np.ones(window) / window, mode="valid")
    f0 = float(smooth[0])
    lower = Estimate(max(f0 - float(smooth.min()), 0.0), "lower", v.size, smooth,
                     "f(x0) - min of the (smoothed) trace; inf f can only be lower")
    upper = None
    if f_lower is not None:
        if f_lower > float(smooth.min()):
            raise ConfigError(f"f_lower={f_lower} is above a loss value on the trace")
        upper = Estimate(f0 - float(f_lower), "upper", v.size, note="f(x0) - a known lower bound of f")
    return {"lower": lower, "upper": upper}


def gradient_norm(grad: Callable, point, norm: str) -> Estimate:
    """G0 = ||grad f(x0)||_* (exact for the given gradient oracle)."""
    return Estimate(dual_norm(grad(point), norm), "exact", 1)


class TorchObjective:
    """A torch model and a loss as callables on points (lists of float64 numpy arrays).

    ``loss_fn(model, batch)`` returns a scalar tensor; ``batches`` is a list of batches. The
    full gradient is the mean over ``batches``; the i-th stochastic gradient uses batch i.
    Calls load the point into the model's parameters; :meth:`restore` puts back the
    parameters it had at construction.
    """

    def __init__(self, model, loss_fn: Callable, batches: Sequence, params=None):
        import torch

        self._torch = torch
        self.model = model
        self.loss_fn = loss_fn
        self.batches = list(batches)
        if not self.batches:
            raise ConfigError("need at least one batch")
        self.params = [p for p in (params if params is not None else model.parameters()) if p.requires_grad]
        self._saved = [p.detach().clone() for p in self.params]

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [tuple(p.shape) for p in self.params]

    def point(self) -> list[np.ndarray]:
        """The model's current parameters as a point."""
        return [_to_numpy(p) for p in self.params]

    def _load(self, point) -> None:
        with self._torch.no_grad():
            for p, b in zip(self.params, _blocks(point)):
                p.copy_(self._torch.as_tensor(b, dtype=p.dtype))

    def restore(self) -> None:
        with self._torch.no_grad():
            for p, s in zip(self.params, self._saved):
                p.copy_(s)

    def _grad_on(self, point, batches) -> list[np.ndarray]:
        self._load(point)
        for p in self.params:
            p.grad = None
        for b in batches:
            (self.loss_fn(self.model, b) / len(batches)).backward()
        return [_to_numpy(p.grad) if p.grad is not None else np.zeros(p.shape) for p in self.params]

    def loss(self, point) -> float:
        self._load(point)
        with self._torch.no_grad():
            return float(sum(float(self.loss_fn(self.model, b)) for b in self.batches) / len(self.batches))

    def grad(self, point) -> list[np.ndarray]:
        """Gradient of the mean loss over all batches (the "full" gradient)."""
        return self._grad_on(point, self.batches)

    def stoch_grad(self, point, i: int) -> list[np.ndarray]:
        """Gradient on batch ``i`` alone."""
        return self._grad_on(point, [self.batches[i % len(self.batches)]])


def estimate_constants(grad: Callable, points: Sequence, norm: str, shapes, stoch_grad: Callable | None = None,
                       losses: Sequence[float] | None = None, n_samples: int = 8, f_lower: float | None = None,
                       **smooth_kw) -> dict:
    """All constants at once, in the theory's vocabulary, with the estimates behind them.

    Returns {"constants": {"L", "rho", "G0", ["sigma"], ["Delta"]}, "estimates": {...}}.
    ``Delta`` uses the upper estimate when ``f_lower`` is given (the safe side for a bound),
    otherwise the lower one from the trace.
    """
    est = {"L": estimate_smoothness(grad, points, norm, **smooth_kw),
           "G0": gradient_norm(grad, points[0], norm),
           "rho": Estimate(rho(shapes, norm), "exact")}
    if stoch_grad is not None:
        est["sigma"] = estimate_sigma(stoch_grad, [points[0], points[-1]], n_samples)
    if losses is not None:
        d = estimate_delta(losses, f_lower=f_lower)
        est["Delta"] = d["upper"] if d["upper"] is not None else d["lower"]
    return {"constants": {k: float(v.value) for k, v in est.items()}, "estimates": est}
