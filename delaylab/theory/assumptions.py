"""Estimators of the constants the bounds assume: L, sigma, Delta, rho, G0.

They take plain callables on *points* -- a numpy array, or a list of arrays (one per
parameter block, e.g. the tensors of a model) -- or a torch model through
:class:`TorchObjective`. Every :class:`Estimate` says which side of the truth it is on
(``kind``), which norm its value is in (``norm``) and what was sampled (``sampling``).
docs/assumptions.md is the user's guide; in short:

* ``L`` two ways, both **lower estimates** of the true L (a supremum over all points):
  the *secant* estimate, max ||grad f(x) - grad f(y)||_* / ||x - y|| over sampled pairs
  (:func:`estimate_smoothness`), and the *curvature* estimate, the largest local curvature
  ||H(x)||_{||.|| -> ||.||_*} at sampled points by a Hessian-vector power iteration
  (:func:`estimate_curvature`; in the Euclidean norm the top |eigenvalue| of the Hessian).
  Each is at most the true L; the larger of the two is the better lower estimate.
* ``sigma`` from repeated stochastic gradients at the same points (:func:`estimate_sigma`).
* ``Delta`` from a loss trace (:func:`estimate_delta`): a lower estimate, and an upper one
  given a lower bound on f.
* ``rho`` exactly, from the block shapes; ``G0`` exactly, for the gradient oracle given.

Norms. ``"euclidean"``: all blocks as one vector (||x||_2 of the concatenation, self-dual):
the norm of Theorem 4 (``sgdm_bound``) and of normalized SGD on the whole model. The
per-block norms, combined as the product norm ``max_l ||x_l||`` (dual ``sum_l ||g_l||_*``),
are those of the per-tensor LMO methods: ``"l2"`` (Frobenius per tensor: per-tensor
normalized SGD), ``"sign"`` (l_inf, dual l1: sign descent, Lion) and ``"spectral"``
(operator norm, dual nuclear: Muon) on 2-D blocks, tensors of more dims flattened to
(shape[0], -1), and l2 on 1-D blocks. ``l2`` is *not* ``euclidean`` once there are two
blocks or more: its L can be larger by up to the number of blocks. These are written here, in
numpy, because theory may not import :mod:`delaylab.optim` (whose ``lmo.dual_norm`` works on
torch tensors); torch inputs are converted to float64 numpy.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from delaylab.errors import ConfigError

NORMS = ("euclidean", "l2", "sign", "spectral")
ESTIMATORS = ("secant", "curvature")  # the two estimates of L


def _blocks(x) -> list[np.ndarray]:
    if isinstance(x, (list, tuple)):
        return [_to_numpy(b) for b in x]
    return [_to_numpy(x)]


def _to_numpy(a) -> np.ndarray:
    if hasattr(a, "detach"):  # a torch tensor: a copy, never a view of a parameter that moves on
        return np.array(a.detach().to("cpu").double().numpy(), dtype=float)
    return np.asarray(a, dtype=float)


def _like(blocks: list[np.ndarray], point):
    """``blocks`` in the form ``point`` has: a list, or the single array."""
    return blocks if isinstance(point, (list, tuple)) else blocks[0]


def check_norm(norm: str) -> None:
    if norm not in NORMS:
        raise ConfigError(f"unknown norm {norm!r}; choose from {', '.join(NORMS)}")


def _matrix(b: np.ndarray) -> np.ndarray | None:
    """The block as a matrix for the spectral norm, or None for a vector / scalar block."""
    if b.ndim < 2:
        return None
    return b.reshape(b.shape[0], -1)


def _euclid(blocks) -> float:
    return math.sqrt(sum(float((b * b).sum()) for b in blocks))


def primal_norm(x, norm: str) -> float:
    """||x|| in the method's norm: the max over blocks of each block's norm (euclidean: one vector)."""
    check_norm(norm)
    blocks = _blocks(x)
    if norm == "euclidean":
        return _euclid(blocks)
    out = 0.0
    for b in blocks:
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
    """||g||_*: the sum over blocks of each block's dual norm (euclidean: ||g||_2 of one vector)."""
    check_norm(norm)
    blocks = _blocks(g)
    if norm == "euclidean":
        return _euclid(blocks)
    out = 0.0
    for b in blocks:
        if norm == "l2":
            out += float(np.linalg.norm(b))
        elif norm == "sign":
            out += float(np.abs(b).sum())
        else:
            m = _matrix(b)
            out += float(np.linalg.norm(b)) if m is None else float(np.linalg.svd(m, compute_uv=False).sum())
    return out


def maximiser(g, norm: str):
    """A point v with ||v|| <= 1 and <g, v> = ||g||_* (minus the LMO of g), in ``g``'s form.

    Per block of the product norms (each block's own maximiser: g/||g||_2, sign(g), U V^T);
    one vector for ``euclidean``. Zero blocks map to zero.
    """
    check_norm(norm)
    blocks = _blocks(g)
    if norm == "euclidean":
        n = _euclid(blocks)
        return _like([b / n if n > 0 else np.zeros_like(b) for b in blocks], g)
    out = []
    for b in blocks:
        m = _matrix(b) if norm == "spectral" else None
        if norm == "sign":
            out.append(np.sign(b))
        elif m is None:
            n = float(np.linalg.norm(b))
            out.append(b / n if n > 0 else np.zeros_like(b))
        else:
            u, s, vt = np.linalg.svd(m, full_matrices=False)
            r = int((s > s[0] * 1e-12).sum()) if s.size and s[0] > 0 else 0
            out.append((u[:, :r] @ vt[:r]).reshape(b.shape))
    return _like(out, g)


def rho(shapes, norm: str) -> float:
    """The norm-equivalence constant: ||g||_* <= rho ||g||_2 over blocks of these shapes."""
    check_norm(norm)
    if norm == "euclidean":
        return 1.0
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


def _inner(a, b) -> float:
    return sum(float((u * v).sum()) for u, v in zip(_blocks(a), _blocks(b)))


@dataclass(frozen=True)
class Estimate:
    """An estimated constant and how far to trust it.

    ``value``; ``kind``, the side of the truth it is on: ``"lower"`` (at most the true
    constant), ``"upper"`` (at least), ``"exact"``, or ``"estimate"`` (neither guaranteed;
    ``note`` says what is known); ``norm``, the norm the value is in (None: a norm-free
    constant such as Delta); ``sampling``, what was sampled; ``n`` and ``samples``, the raw
    numbers behind it (per pair, per point, ...).
    """

    value: float
    kind: str
    n: int = 0
    samples: np.ndarray = field(default_factory=lambda: np.zeros(0))
    note: str = ""
    norm: str | None = None
    sampling: str = ""

    def __float__(self) -> float:
        return float(self.value)


def secant(x, y, gx, gy, norm: str) -> float | None:
    """||gx - gy||_* / ||x - y|| (None where x = y): one sample of the secant estimate of L."""
    dx = primal_norm(_sub(x, y), norm)
    return dual_norm(_sub(gx, gy), norm) / dx if dx > 0 else None


def estimate_smoothness(grad: Callable, points: Sequence, norm: str = "l2", n_random: int = 0,
                        n_perturb: int = 0, radius: float = 1e-3, seed: int = 0) -> Estimate:
    """The secant estimate of L: max ||grad(x) - grad(y)||_* / ||x - y|| over sampled pairs.

    A **lower estimate**: each ratio is at most L by the definition of L. Pairs: consecutive
    points of ``points`` (a trajectory), ``n_random`` random pairs of its points, and
    ``n_perturb`` pairs (x, x + radius * u) with x on the trajectory and u a random Gaussian
    direction scaled to unit norm (probes curvature off the path). Cost: one gradient per
    point and per perturbation.
    """
    check_norm(norm)
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
    ratios = [r for i, j in pairs if (r := secant(pts[i], pts[j], grads[i], grads[j], norm)) is not None]
    for _ in range(n_perturb):
        i = int(rng.integers(len(pts)))
        u = [rng.normal(size=b.shape) for b in _blocks(pts[i])]
        scale = radius / primal_norm(u, norm)
        y = _like([b + scale * v for b, v in zip(_blocks(pts[i]), u)], pts[i])
        ratios.append(dual_norm(_sub(grad(y), grads[i]), norm) / radius)
    if not ratios:
        raise ConfigError("all sampled pairs coincide")
    r = np.array(ratios)
    return Estimate(float(r.max()), "lower", len(r), r,
                    "max over sampled pairs; the true L (a sup over all pairs) can only be larger", norm,
                    f"{len(pts) - 1} consecutive pairs of {len(pts)} points, {n_random} random pairs, "
                    f"{n_perturb} perturbations of radius {radius:g}")


def curvature_at(hvp: Callable, point, norm: str, iters: int = 50, tol: float = 1e-7, seed: int = 0) -> tuple[float, int]:
    """(||H v||_*, iterations) for the v that the power iteration in ``norm`` ends on.

    ``hvp(point, v)`` returns H(point) v. From a random unit v, repeat w = H v,
    v <- maximiser(w) (the unit vector attaining <w, v> = ||w||_*). For symmetric H the values
    ||H v_k||_* never decrease (||H v_{k+1}||_* >= <H v_{k+1}, v_k> = <v_{k+1}, H v_k> =
    ||H v_k||_*) and each is at most ||H||_{||.|| -> ||.||_*}. In the euclidean norm this is
    the power method, and the value converges to the top |eigenvalue| of H; in the per-block
    norms it stops at a local maximum (the global one is NP-hard for l_inf -> l1).
    Stops once the relative increase is below ``tol``.
    """
    rng = np.random.default_rng(seed)
    v = maximiser(_like([rng.normal(size=b.shape) for b in _blocks(point)], point), norm)
    best, k = 0.0, 0
    for k in range(1, iters + 1):
        w = hvp(point, v)
        val = dual_norm(w, norm)
        grew = val - best
        best = max(best, val)
        if val == 0 or (k > 1 and grew <= tol * best):
            break
        v = maximiser(w, norm)
    return best, k


def estimate_curvature(hvp: Callable, points: Sequence, norm: str = "euclidean", iters: int = 50,
                       tol: float = 1e-7, seed: int = 0) -> Estimate:
    """The curvature estimate of L: max over ``points`` of the local ||H(x)|| by power iteration.

    ``hvp(x, v)`` returns the Hessian-vector product H(x) v (double backward for a model;
    :meth:`TorchObjective.hvp`). A **lower estimate** of L = sup_x ||H(x)||_{||.|| -> ||.||_*}
    twice over: at each point the iteration approaches ||H(x)|| from below (see
    :func:`curvature_at`), and the sup over all x can only be larger than the max over the
    points sampled. Euclidean: the largest |eigenvalue| of the Hessian met along the points.
    Per-block norms: a local maximum of ||H v||_* over the unit ball, itself at most
    ``rho**2`` times the Euclidean value at the same point. Cost: up to ``iters``
    Hessian-vector products per point (about 2-3 gradients each).
    """
    check_norm(norm)
    pts = list(points)
    if not pts:
        raise ConfigError("need at least one point")
    if iters < 1:
        raise ConfigError(f"iters must be >= 1, got {iters}")
    vals, its = zip(*(curvature_at(hvp, p, norm, iters, tol, seed + i) for i, p in enumerate(pts)))
    s = np.array(vals)
    how = ("the top |eigenvalue| of the Hessian at each point, by the power method" if norm == "euclidean" else
           f"a local maximum of ||H v||_* over the {norm} unit ball at each point (power iteration in that norm)")
    return Estimate(float(s.max()), "lower", len(s), s,
                    f"max over points of {how}; each approaches the local value from below, and the true L "
                    "(a sup over all points) can only be larger", norm,
                    f"{len(pts)} points, at most {iters} Hessian-vector products each (used {max(its)})")


def estimate_sigma(stoch_grad: Callable, points: Sequence, n_samples: int = 16,
                   full_grad: Callable | None = None) -> Estimate:
    """Estimate sigma, E||g - grad f||_2^2 <= sigma^2 (Euclidean always), from draws at ``points``.

    Sampling: ``stoch_grad(point, i)`` for i = 0 .. n_samples - 1 at each point (independent
    draws for different i; :meth:`TorchObjective.stoch_grad` uses batch i, so it needs at least
    ``n_samples`` batches). At each point, the squared value is **unbiased** for that point's
    E||g - grad f||_2^2: the sample variance sum ||g_i - mean||^2 / (n - 1), or, with
    ``full_grad``, the mean of ||g_i - full_grad||^2. Its square root is biased low (Jensen),
    and the bound needs the sup over all points, of which the max over the points sampled is a
    lower estimate; so ``value`` = sqrt(max over points) is an ``"estimate"``, low rather than
    high, with a relative standard error of about 1/sqrt(2 (n - 1)) per point for Gaussian
    noise. ``samples`` holds each point's unbiased estimate of sigma^2.
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
        per_point.append(ss / dof)
    if not per_point:
        raise ConfigError("need at least one point")
    s2 = np.array(per_point)
    ref_text = "the error against the full gradient" if full_grad is not None else "the sample variance (n - 1)"
    return Estimate(math.sqrt(float(s2.max())), "estimate", len(s2) * n_samples, s2,
                    f"sigma^2 unbiased at each point ({ref_text}); its square root is biased low, and the sup over "
                    "all points can only be larger than the max over those sampled", "euclidean",
                    f"{n_samples} stochastic gradients at each of {len(s2)} points")


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
    how = f"a trace of {v.size} losses" + (f", moving average of {window}" if window > 1 else "")
    lower = Estimate(max(f0 - float(smooth.min()), 0.0), "lower", v.size, smooth,
                     "f(x0) - min of the (smoothed) trace; inf f can only be lower", None, how)
    upper = None
    if f_lower is not None:
        if f_lower > float(smooth.min()):
            raise ConfigError(f"f_lower={f_lower} is above a loss value on the trace")
        upper = Estimate(f0 - float(f_lower), "upper", v.size, note=f"f(x0) - {f_lower:g}, a known lower bound of f",
                         sampling=how)
    return {"lower": lower, "upper": upper}


def gradient_norm(grad: Callable, point, norm: str) -> Estimate:
    """G0 = ||grad f(x0)||_* (exact for the given gradient oracle)."""
    return Estimate(dual_norm(grad(point), norm), "exact", 1, norm=norm, sampling="the gradient at the first point")


# Layers whose train mode makes the gradient at a point depend on more than the point and the batch.
def _train_mode_layers(model) -> list[str]:
    import torch

    found = []
    for m in model.modules():
        if not m.training:
            continue
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            found.append(type(m).__name__)
        elif isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0:
            found.append(type(m).__name__)
    return sorted(set(found))


class TorchObjective:
    """A torch model and a loss as callables on points (lists of float64 numpy arrays).

    ``loss_fn(model, batch)`` returns a scalar tensor; ``batches`` is a list of batches. The
    full gradient is the mean over ``batches``; the i-th stochastic gradient uses batch i.

    The model is left as it is: every evaluation runs the model with the point's tensors in
    place of its parameters (``torch.func.functional_call``), so the model's own weights,
    ``.grad`` fields and buffers are never written, and estimation leaves the weights the user
    had. Only :meth:`load` writes a point into the model; :meth:`restore` then puts back the
    weights it had just before the first :meth:`load` since the last restore.

    Evaluations run in eval mode: BatchNorm in train mode normalises by the batch's own
    statistics (and updates its running ones) and Dropout draws a fresh mask, so the "full"
    gradient would not be a function of the point. With such layers in train mode,
    ``train_mode="eval"`` (the default) switches to eval for each evaluation (and back), says
    so once (a warning, and :attr:`notes`); ``train_mode="refuse"`` raises a one-line error.
    """

    def __init__(self, model, loss_fn: Callable, batches: Sequence, params=None, train_mode: str = "eval"):
        import torch

        self._torch = torch
        self.model = model
        self.loss_fn = loss_fn
        self.batches = list(batches)
        if not self.batches:
            raise ConfigError("need at least one batch")
        if train_mode not in ("eval", "refuse"):
            raise ConfigError(f"train_mode must be 'eval' or 'refuse', got {train_mode!r}")
        chosen = None if params is None else {id(p) for p in params}
        self.names, self.params = [], []
        for name, p in model.named_parameters():
            if p.requires_grad and (chosen is None or id(p) in chosen):
                self.names.append(name)
                self.params.append(p)
        if not self.params:
            raise ConfigError("the model has no trainable parameters to estimate over")
        self.notes: list[str] = []
        layers = _train_mode_layers(model)
        if layers:
            if train_mode == "refuse":
                raise ConfigError(f"the model has {', '.join(layers)} in train mode: the gradient at a point is not "
                                  "a function of the point; call model.eval() or pass train_mode='eval'")
            note = (f"the model has {', '.join(layers)} in train mode; gradients are taken in eval mode (running "
                    "statistics, no dropout), so that the full gradient is a function of the point")
            self.notes.append(note)
            warnings.warn(f"TorchObjective: {note}", stacklevel=2)
        self._saved = None
        self._graph = None  # (point, tensors, gradient with its graph) of the last hvp

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [tuple(p.shape) for p in self.params]

    def point(self) -> list[np.ndarray]:
        """The model's current parameters as a point."""
        return [_to_numpy(p) for p in self.params]

    def load(self, point) -> None:
        """Write ``point`` into the model's parameters (kept for :meth:`restore`)."""
        if self._saved is None:
            self._saved = [p.detach().clone() for p in self.params]
        with self._torch.no_grad():
            for p, b in zip(self.params, _blocks(point)):
                p.copy_(self._torch.as_tensor(b, dtype=p.dtype))

    def restore(self) -> None:
        """Put back the weights the model had before the first :meth:`load` (no-op without one)."""
        if self._saved is None:
            return
        with self._torch.no_grad():
            for p, s in zip(self.params, self._saved):
                p.copy_(s)
        self._saved = None

    def _tensors(self, point, requires_grad: bool):
        torch = self._torch
        return [torch.as_tensor(b, dtype=p.dtype, device=p.device).requires_grad_(requires_grad)
                for p, b in zip(self.params, _blocks(point))]

    def _loss_on(self, tensors, batches):
        """Mean loss over ``batches`` with ``tensors`` in place of the parameters, in eval mode."""
        from torch.func import functional_call

        modes = [(m, m.training) for m in self.model.modules()]
        self.model.eval()
        try:
            loss_fn, model = self.loss_fn, self.model
            wrapper = _loss_module_class()(model, loss_fn)
            values = dict(zip(("model." + n for n in self.names), tensors))
            return sum(functional_call(wrapper, values, (b,)) for b in batches) / len(batches)
        finally:
            for m, t in modes:
                m.training = t

    def _grad_on(self, point, batches) -> list[np.ndarray]:
        ts = self._tensors(point, True)
        gs = self._torch.autograd.grad(self._loss_on(ts, batches), ts, allow_unused=True)
        return [_to_numpy(g) if g is not None else np.zeros(t.shape) for g, t in zip(gs, ts)]

    def loss(self, point) -> float:
        with self._torch.no_grad():
            return float(self._loss_on(self._tensors(point, False), self.batches))

    def grad(self, point) -> list[np.ndarray]:
        """Gradient of the mean loss over all batches (the "full" gradient)."""
        return self._grad_on(point, self.batches)

    def stoch_grad(self, point, i: int) -> list[np.ndarray]:
        """Gradient on batch ``i`` alone (``i`` < the number of batches: draws are never reused)."""
        if not 0 <= i < len(self.batches):
            raise ConfigError(f"stochastic gradient {i} needs batch {i}; the objective has {len(self.batches)} "
                              "(pass at least n_samples batches)")
        return self._grad_on(point, [self.batches[i]])

    def hvp(self, point, v) -> list[np.ndarray]:
        """H(point) v for the mean loss over all batches, by double backward (float64 if the model is).

        The gradient's graph is kept for the last point, so the power iteration's products at one
        point cost one backward pass each. Attention (``scaled_dot_product_attention``) runs its
        math kernel here, the one with a double backward.
        """
        torch = self._torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        # torch's fused attention kernels have no double backward; the math one has
        with sdpa_kernel(SDPBackend.MATH):
            if self._graph is None or not all(np.array_equal(a, b) for a, b in zip(self._graph[0], _blocks(point))):
                self._graph = None
                ts = self._tensors(point, True)
                gs = torch.autograd.grad(self._loss_on(ts, self.batches), ts, create_graph=True, allow_unused=True)
                self._graph = ([b.copy() for b in _blocks(point)], ts, gs)
            _, ts, gs = self._graph
            live = [(t, g, torch.as_tensor(b, dtype=t.dtype, device=t.device)) for t, g, b in zip(ts, gs, _blocks(v))
                    if g is not None and g.requires_grad]
            hv = torch.autograd.grad([g for _, g, _ in live], [t for t, _, _ in live],
                                     grad_outputs=[b for _, _, b in live], retain_graph=True, allow_unused=True)
        by_id = {id(t): h for (t, _, _), h in zip(live, hv)}
        return [_to_numpy(by_id[id(t)]) if by_id.get(id(t)) is not None else np.zeros(t.shape) for t in ts]


@functools.lru_cache(maxsize=1)
def _loss_module_class():
    import torch

    class LossModule(torch.nn.Module):
        """``loss_fn(model, batch)`` as a module, so that functional_call can swap the model's parameters."""

        def __init__(self, model, loss_fn):
            super().__init__()
            self.model = model
            self.loss_fn = loss_fn

        def forward(self, batch):
            return self.loss_fn(self.model, batch)

    return LossModule


def estimate_constants(grad: Callable, points: Sequence, norm: str, shapes, stoch_grad: Callable | None = None,
                       losses: Sequence[float] | None = None, n_samples: int = 8, f_lower: float | None = None,
                       hvp: Callable | None = None, curvature_points: Sequence | None = None,
                       sigma_points: Sequence | None = None, iters: int = 50, **smooth_kw) -> dict:
    """All constants at once, in the theory's vocabulary and in one norm, with the estimates behind them.

    Returns ``{"constants": {"L", "rho", "G0", ["sigma"], ["Delta"], "norm"}, "L": {"secant",
    ["curvature"]}, "estimates": {...}}``. ``constants["norm"]`` is ``norm``: :func:`evaluate`
    and :func:`tune` refuse constants whose norm is not the bound's. ``constants["L"]`` is the
    larger of the two lower estimates of L (the curvature one needs ``hvp``, at
    ``curvature_points``, default ``points``); ``"L"`` keeps each, so that a bound can be
    evaluated at each (:func:`evaluate_at_each_L`). ``sigma`` is estimated at ``sigma_points``
    (default the first and last point). ``Delta`` uses the upper estimate when ``f_lower`` is
    given (the safe side for a bound), otherwise the lower one from the trace.
    """
    check_norm(norm)
    points = list(points)
    est = {"L_secant": estimate_smoothness(grad, points, norm, **smooth_kw),
           "G0": gradient_norm(grad, points[0], norm),
           "rho": Estimate(rho(shapes, norm), "exact", norm=norm, sampling="the block shapes")}
    if hvp is not None:
        est["L_curvature"] = estimate_curvature(hvp, points if curvature_points is None else curvature_points,
                                                norm, iters=iters)
    if stoch_grad is not None:
        est["sigma"] = estimate_sigma(stoch_grad, [points[0], points[-1]] if sigma_points is None else sigma_points,
                                      n_samples)
    if losses is not None:
        d = estimate_delta(losses, f_lower=f_lower)
        est["Delta"] = d["upper"] if d["upper"] is not None else d["lower"]
    each = {k: float(est[f"L_{k}"].value) for k in ESTIMATORS if f"L_{k}" in est}
    constants = {"L": max(each.values())}
    constants.update({k: float(v.value) for k, v in est.items() if not k.startswith("L_")})
    constants["norm"] = norm
    return {"constants": constants, "L": each, "estimates": est}


def evaluate_at_each_L(bound, estimated: dict, **values) -> dict:
    """``{estimator: Evaluation}``: ``bound`` at each estimate of L of :func:`estimate_constants`.

    ``values`` gives what the estimate does not (T, eta, beta, tau, ...). The bound grows with
    L, and both estimates are lower ones: where the bound holds at the larger, it holds at any L
    at least that large.
    """
    from delaylab.theory.bound import evaluate

    out = {}
    for name, L in estimated["L"].items():
        out[name] = evaluate(bound, **dict(estimated["constants"], **values, L=L))
    return out
