"""Synthetic smooth nonconvex problems with known constants, batched over seeds.

Every problem is a function ``f`` of one variable of shape ``shape`` (a vector ``(d,)`` or a
matrix ``(m, n)``). All methods take and return float64 tensors with a leading seed
dimension: ``x`` of shape ``(S, *shape)`` holds S independent runs, ``value(x)`` is ``(S,)``
and ``grad(x)`` is ``(S, *shape)``, so S runs advance as one tensor op.

Constants, for the LMO norms of :mod:`delaylab.optim.lmo` (``"l2"``: Euclidean/Frobenius,
``"sign"``: l_inf over entries, ``"spectral"``: operator norm of a matrix; their duals are
l2, l1 over entries, and nuclear):

* ``smoothness(norm)``: L with ``||grad f(x) - grad f(y)||_* <= L ||x - y||`` for all x, y.
  ``smoothness_exact(norm)`` says whether L is attained; ``smoothness_witness(norm)`` gives a
  point x and a unit direction v with ``||H(x) v||_* = L`` (the sup is then reached as y -> x).
* ``delta()``: ``f(x0) - inf f``. Every problem here has ``inf f = 0``, reached, so this is exact.
* ``sigma``: the stochastic oracle's Euclidean noise level, ``E||g - grad f(x)||_2^2 <= sigma^2``.
  For the Gaussian oracles it is an equality; ``cauchy-regression`` (and ``matrix-sensing``
  with ``batch=B``) has real minibatch noise, set by the batch size, with sigma an upper
  bound valid at every x.
* ``rho(norm)``: the smallest rho with ``||v||_* <= rho ||v||_2`` on this shape.

The derivation of each constant is in the class docstring and in docs/toy.md; the tests in
tests/toy/test_problems.py check every one against an independent computation (autograd
Hessians in float64, brute force over sign vectors, random pairs).

Why "always L through the Hessian": for twice-differentiable f,
``grad f(y) - grad f(x) = int_0^1 H(x + s(y - x)) (y - x) ds``, so
``L = sup_x sup_{||v|| <= 1} ||H(x) v||_*`` is both an upper bound and (approaching x along
v) the best one.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from delaylab.errors import ConfigError
from delaylab.theory.assumptions import rho as norm_ratio

DTYPE = torch.float64


# phi(z) = log(1 + z^2), the "Cauchy" loss used by three of the problems. Its derivatives:
# phi' = 2z/(1+z^2) in [-1, 1] (extremes at z = -1, 1), phi'' = 2(1-z^2)/(1+z^2)^2 in
# [-1/4, 2] (max at z = 0, min at z^2 = 3): bounded curvature, nonconvex for |z| > 1.
PHI_CURVATURE = 2.0  # max |phi''|, attained at z = 0
PHI_SLOPE = 1.0  # max |phi'|, attained at |z| = 1


def _phi(z: torch.Tensor) -> torch.Tensor:
    return torch.log1p(z * z)


def _dphi(z: torch.Tensor) -> torch.Tensor:
    return 2.0 * z / (1.0 + z * z)


class Problem:
    """A smooth nonconvex problem with known constants (see the module docstring).

    Subclasses set ``name``, ``shape``, ``norms`` (the LMO norms whose L is known),
    ``x0`` (the start, shape ``shape``), ``sigma`` and implement ``value``, ``grad``,
    ``smoothness``, ``smoothness_witness`` and, for real minibatch noise, ``sample_grad``.
    """

    name: str = ""
    summary: str = ""
    shape: tuple[int, ...] = ()
    norms: tuple[str, ...] = ()
    x0: torch.Tensor
    sigma: float = 0.0
    f_star: float = 0.0

    # -- the function ------------------------------------------------------------------
    def value(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def grad(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def value_and_grad(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(value(x), grad(x))``; problems override it where the two share work."""
        return self.value(x), self.grad(x)

    def sample_grad(
        self, x: torch.Tensor, generator: torch.Generator, grad: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Unbiased gradient with isotropic Gaussian noise, ``E||xi||_2^2 = sigma^2`` exactly.

        ``grad``, if given, is ``grad(x)`` already computed; it is not modified.
        """
        g = self.grad(x) if grad is None else grad
        if self.sigma == 0:
            return g.clone()
        scale = self.sigma / math.sqrt(math.prod(self.shape))
        return g + scale * torch.randn(g.shape, generator=generator, dtype=g.dtype)

    def initial_point(self, seeds: int) -> torch.Tensor:
        """``seeds`` copies of x0, shape ``(seeds, *shape)``: the runs differ in their noise."""
        if seeds < 1:
            raise ConfigError(f"seeds must be >= 1, got {seeds}")
        return self.x0.expand(seeds, *self.shape).clone()

    # -- constants -----------------------------------------------------------------------
    def check_norm(self, norm: str) -> None:
        if norm not in self.norms:
            raise ConfigError(
                f"problem {self.name!r} has no known constant for norm {norm!r}; "
                f"it supports {', '.join(self.norms)}"
            )

    def smoothness(self, norm: str) -> float:
        raise NotImplementedError

    def smoothness_exact(self, norm: str) -> bool:
        return True

    def smoothness_witness(self, norm: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(x, v) with ``||v|| = 1`` and ``||H(x) v||_* = L`` (None where L is only a bound)."""
        raise NotImplementedError

    def rho(self, norm: str) -> float:
        """``||v||_* <= rho ||v||_2``: 1 (l2), sqrt(D) (sign), sqrt(min(m, n)) (spectral); tight."""
        self.check_norm(norm)
        return norm_ratio(self.shape, norm)

    def delta(self) -> float:
        return float(self.value(self.x0.unsqueeze(0))[0]) - self.f_star

    def constants(self, norm: str) -> dict[str, float]:
        """The constants the bounds of :mod:`delaylab.theory` use, in its vocabulary.

        ``L`` (in ``norm``), ``sigma`` (Euclidean), ``rho``, ``Delta`` and ``G0`` (the dual
        norm of the gradient at x0).
        """
        from delaylab.optim.lmo import dual_norm

        self.check_norm(norm)
        g0 = self.grad(self.x0.unsqueeze(0))
        return {
            "L": self.smoothness(norm),
            "sigma": float(self.sigma),
            "rho": self.rho(norm),
            "Delta": self.delta(),
            "G0": float(dual_norm(g0, norm, batch_dims=1)[0]),
        }

    def describe(self) -> dict:
        return {
            "name": self.name,
            "summary": self.summary,
            "shape": list(self.shape),
            "norms": list(self.norms),
            "L": {n: self.smoothness(n) for n in self.norms},
            "L_exact": {n: self.smoothness_exact(n) for n in self.norms},
            "sigma": self.sigma,
            "Delta": self.delta(),
        }


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _ones_unit(shape: tuple[int, ...]) -> torch.Tensor:
    """The all-ones tensor: a unit vector of the l_inf (max-entry) norm."""
    return torch.ones(shape, dtype=DTYPE)


def _first_unit(shape: tuple[int, ...]) -> torch.Tensor:
    """A basis tensor: a unit vector of the l2 norm."""
    v = torch.zeros(shape, dtype=DTYPE)
    v.view(-1)[0] = 1.0
    return v


class SeparableCauchy(Problem):
    r"""``f(x) = sum_i log(1 + x_i^2)`` on R^d.

    The Hessian is diagonal with entries ``phi''(x_i)`` in [-1/4, 2].
    * l2: ``||H v||_2 <= 2 ||v||_2``, so L = 2; attained at x = 0 (H = 2I), v = e_1.
    * sign (l_inf -> l1): ``||H v||_1 <= 2 ||v||_1 <= 2 d ||v||_inf``, so L = 2d; attained at
      x = 0, v = (1, ..., 1).
    * ``inf f = 0`` at x = 0, the only stationary point. Delta = d log(1 + x0^2) for the
      constant start x0 = c 1. Gradients vanish at infinity (|phi'| <= 1), so normalized
      methods that take steps of fixed length have an edge over SGD far out.
    """

    name = "cauchy"
    summary = "separable sum_i log(1+x_i^2) on R^d; exact L (l2: 2, sign: 2d)"
    norms = ("sign", "l2")

    def __init__(self, d: int = 32, sigma: float = 1.0, start: float = 3.0):
        self.shape = (d,)
        self.sigma = float(sigma)
        self.x0 = torch.full(self.shape, float(start), dtype=DTYPE)

    def value(self, x):
        return _phi(x).sum(dim=-1)

    def grad(self, x):
        return _dphi(x)

    def smoothness(self, norm):
        self.check_norm(norm)
        return PHI_CURVATURE * (self.shape[0] if norm == "sign" else 1)

    def smoothness_witness(self, norm):
        self.check_norm(norm)
        v = _ones_unit(self.shape) if norm == "sign" else _first_unit(self.shape)
        return torch.zeros(self.shape, dtype=DTYPE), v


class SmoothRastrigin(Problem):
    r"""``f(x) = sum_i [x_i^2/2 + (b/w^2)(1 - cos(w x_i))]`` on R^d.

    ``phi'' = 1 + b cos(w s)`` lies in [1 - b, 1 + b]; with b > 1 each coordinate has
    stationary points besides 0 (``s + (b/w) sin(w s) = 0``), so the gradient-norm criterion
    (any stationary point) is what the bounds speak about.
    * l2: L = 1 + b, attained at x = 0, v = e_1.
    * sign: L = d (1 + b), attained at x = 0, v = (1, ..., 1) (same argument as ``cauchy``).
    * ``inf f = 0`` at x = 0 (both terms are >= 0). Delta = f(x0), x0 uniform in
      [-start, start]^d drawn once from ``instance_seed``.
    """

    name = "rastrigin"
    summary = "separable smooth Rastrigin on R^d, many stationary points; exact L (l2: 1+b, sign: d(1+b))"
    norms = ("sign", "l2")

    def __init__(
        self,
        d: int = 32,
        b: float = 4.0,
        omega: float = 3.0,
        sigma: float = 1.0,
        start: float = 4.0,
        instance_seed: int = 0,
    ):
        self.shape = (d,)
        self.b, self.omega = float(b), float(omega)
        self.sigma = float(sigma)
        u = torch.rand(self.shape, generator=_generator(instance_seed), dtype=DTYPE)
        self.x0 = start * (2.0 * u - 1.0)

    def value(self, x):
        w = self.omega
        return (0.5 * x * x + (self.b / w**2) * (1.0 - torch.cos(w * x))).sum(dim=-1)

    def grad(self, x):
        return x + (self.b / self.omega) * torch.sin(self.omega * x)

    def smoothness(self, norm):
        self.check_norm(norm)
        return (1.0 + self.b) * (self.shape[0] if norm == "sign" else 1)

    def smoothness_witness(self, norm):
        self.check_norm(norm)
        v = _ones_unit(self.shape) if norm == "sign" else _first_unit(self.shape)
        return torch.zeros(self.shape, dtype=DTYPE), v


class LogDet(Problem):
    r"""``F(W) = log det(I + W^T W) = sum_i log(1 + s_i(W)^2)`` on m x n matrices (P3).

    A spectral function: it depends on W only through its singular values, its gradient
    ``2 W (I + W^T W)^{-1} = U diag(phi'(s)) V^T`` shares W's singular vectors, and it is the
    matrix problem on which Muon's LMO (the spectral one) is the natural method.

    Hessian: for an absolutely symmetric spectral function ``sum_i phi(s_i)`` the Hessian,
    in the basis built from W's singular vectors, has eigenvalues ``phi''(s_i)``, the divided
    differences ``(phi'(s_i) -+ phi'(s_j))/(s_i -+ s_j)`` and ``phi'(s_i)/s_i`` (Lewis &
    Sendov 2001, "Twice differentiable spectral functions"). Here ``phi'' in [-1/4, 2]``;
    the difference quotient is a mean of phi''; ``phi'(s)/s = 2/(1+s^2) in (0, 2]``; and
    ``0 <= (phi'(a) + phi'(b))/(a + b) <= 2`` since ``0 <= phi'(s) <= 2s`` for s >= 0.
    So ``||H||_{F->F} <= 2``, with ``H = 2 Id`` at W = 0. With r = min(m, n) and D = mn:
    * l2 (Frobenius): L = 2, attained at W = 0.
    * spectral (op -> nuclear): ``||H V||_nuc <= sqrt(r) ||H V||_F <= 2 sqrt(r) ||V||_F
      <= 2 r ||V||_op``, so L = 2r; attained at W = 0 with V a partial isometry (``[I; 0]``).
    * sign (max-entry -> l1): ``||H V||_1 <= sqrt(D) ||H V||_F <= 2 sqrt(D) ||V||_F <= 2 D ||V||_max``,
      so L = 2mn; attained at W = 0, V = all ones.
    * ``inf F = 0`` at W = 0. Delta = F(W0), W0 = start * G / sqrt(m) with G a fixed standard
      Gaussian matrix (singular values spread over roughly start * (1 +- sqrt(n/m))).
    """

    name = "logdet"
    summary = "spectral log det(I + W^T W) on m x n matrices; exact L (l2: 2, spectral: 2 min(m,n), sign: 2mn)"
    norms = ("spectral", "sign", "l2")

    def __init__(
        self, m: int = 12, n: int = 6, sigma: float = 1.0, start: float = 3.0, instance_seed: int = 0
    ):
        self.shape = (m, n)
        self.sigma = float(sigma)
        g = torch.randn(self.shape, generator=_generator(instance_seed), dtype=DTYPE)
        self.x0 = start * g / math.sqrt(m)
        self._eye = torch.eye(min(m, n), dtype=DTYPE)

    def _cholesky(self, w):
        # I + W^T W (or I + W W^T) on the smaller side keeps the factorisation at r x r;
        # it is >= I, so Cholesky is always well conditioned.
        tall = self.shape[0] >= self.shape[1]
        gram = self._eye + (w.mT @ w if tall else w @ w.mT)
        return torch.linalg.cholesky(gram), tall

    def value_and_grad(self, w):
        chol, tall = self._cholesky(w)
        value = 2.0 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(dim=-1)
        # 2 W (I + W^T W)^{-1} = 2 ((I + W^T W)^{-1} W^T)^T, and likewise for wide W.
        grad = 2.0 * (torch.cholesky_solve(w.mT, chol).mT if tall else torch.cholesky_solve(w, chol))
        return value, grad

    def value(self, w):
        return self.value_and_grad(w)[0]

    def grad(self, w):
        return self.value_and_grad(w)[1]

    def smoothness(self, norm):
        self.check_norm(norm)
        m, n = self.shape
        return {"l2": 2.0, "spectral": 2.0 * min(m, n), "sign": 2.0 * m * n}[norm]

    def smoothness_witness(self, norm):
        self.check_norm(norm)
        if norm == "l2":
            v = _first_unit(self.shape)
        elif norm == "sign":
            v = _ones_unit(self.shape)
        else:
            v = torch.eye(*self.shape, dtype=DTYPE)  # partial isometry: all singular values 1
        return torch.zeros(self.shape, dtype=DTYPE), v


class _FiniteSumCauchy(Problem):
    r"""``f(x) = (1/N) sum_j log(1 + (<a_j, x> - y_j)^2)`` with planted ``y_j = <a_j, x*>``.

    Shared by the vector and the matrix regression (``a_j`` has the variable's shape; the
    planted x* is scaled to ``||x*||_2 = distance`` and the start is x0 = 0, so the residuals
    at x0 are N(0, distance^2) for Gaussian data). The Hessian is
    ``(1/N) sum_j phi''(r_j) a_j a_j^T`` with ``phi'' in [-1/4, 2]``, and every residual r_j
    is 0 at x*, where it equals ``(2/N) A^T A`` (A: the N x D data matrix). ``inf f = 0`` at x*.

    Two oracles. ``batch=B``: real minibatch noise, the mean of B per-sample gradients
    ``phi'(r_j) a_j`` drawn with replacement, so ``E||g - grad f||^2 = Var_j / B <=
    E_j ||phi'(r_j) a_j||^2 / B <= (1/(N B)) sum_j ||a_j||^2`` because ``|phi'| <= 1``: that is
    ``sigma^2``, an upper bound at every x (the noise vanishes at x*, where every per-sample
    gradient is 0). ``batch=None``: the full gradient plus isotropic Gaussian noise of level
    ``sigma`` (exact), as for the other problems.

    Why the scale matters: phi saturates, so a far start (large ``distance``) puts the run on a
    long plateau of small, slowly changing gradients, where a T-grid of a few hundred to a few
    thousand steps is pre-asymptotic and the measured rate is flatter than T^(-1/4).
    """

    norms = ("sign", "l2")

    def _setup(self, data, x_star, distance: float, batch: int | None, sigma: float):
        if batch is not None and batch < 1:
            raise ConfigError(f"batch must be >= 1 (or None for Gaussian noise), got {batch}")
        if not distance > 0:
            raise ConfigError(f"distance must be > 0, got {distance}")
        self.data = data  # (N, *shape)
        self.flat = data.reshape(data.shape[0], -1)  # (N, D)
        self.x_star = x_star * (distance / float(x_star.norm()))
        self.targets = self.flat @ self.x_star.reshape(-1)
        self.x0 = torch.zeros(self.shape, dtype=DTYPE)
        self.batch = None if batch is None else int(batch)
        self.samples = int(data.shape[0])
        if batch is None:
            self.sigma = float(sigma)
        else:
            self.sigma = math.sqrt(float((self.flat**2).sum()) / (self.samples * self.batch))
        self.gram_max = float(torch.linalg.eigvalsh(self.flat.T @ self.flat / self.samples)[-1])

    def _residuals(self, x):
        return x.reshape(x.shape[0], -1) @ self.flat.T - self.targets  # (S, N)

    def value(self, x):
        return _phi(self._residuals(x)).mean(dim=-1)

    def grad(self, x):
        weights = _dphi(self._residuals(x)) / self.samples  # (S, N)
        return (weights @ self.flat).reshape(x.shape)

    def value_and_grad(self, x):
        r = self._residuals(x)
        return _phi(r).mean(dim=-1), ((_dphi(r) / self.samples) @ self.flat).reshape(x.shape)

    def sample_grad(self, x, generator, grad=None):
        """Minibatch mean of per-sample gradients (``batch=B``), or grad + Gaussian noise."""
        if self.batch is None:
            return super().sample_grad(x, generator, grad)
        s = x.shape[0]
        idx = torch.randint(self.samples, (s, self.batch), generator=generator)
        rows = self.flat[idx]  # (S, B, D)
        r = torch.einsum("sbd,sd->sb", rows, x.reshape(s, -1)) - self.targets[idx]
        g = torch.einsum("sb,sbd->sd", _dphi(r), rows) / self.batch
        return g.reshape(x.shape)

    def _l2_smoothness(self):
        return PHI_CURVATURE * self.gram_max

    def _l2_witness(self):
        _, vecs = torch.linalg.eigh(self.flat.T @ self.flat)
        return self.x_star.clone(), vecs[:, -1].reshape(self.shape).clone()


class CauchyRegression(_FiniteSumCauchy):
    r"""Robust (Cauchy-loss) linear regression, a finite sum with real minibatch noise (P5).

    ``a_j ~ N(0, I_d)``, planted x* Gaussian scaled to ``||x*|| = distance``, start x0 = 0.
    * l2: ``|v^T H v| <= 2 v^T (A^T A / N) v``, so L = 2 lambda_max(A^T A)/N, attained at x*
      along the top eigenvector.
    * sign: for ``||v||_inf <= 1``, ``||H v||_1 = max_s s^T H v <= (2/N) ||A s|| ||A v||``
      (s in {-1,1}^d; Cauchy-Schwarz on the weighted sum), and ``||A v||^2`` is convex in v so
      its max over the cube is at a vertex: L = (2/N) max_s ||A s||^2, computed here by
      brute force over the 2^(d-1) sign patterns up to a global sign; attained at x* along
      the maximising s. Hence d is capped at 20.
    """

    name = "cauchy-regression"
    summary = "finite-sum robust regression (1/N) sum_j log(1+(a_j^T x - y_j)^2), minibatch noise; exact L"

    def __init__(
        self,
        d: int = 12,
        samples: int = 256,
        batch: int | None = 8,
        sigma: float = 1.0,
        distance: float = 1.5,
        instance_seed: int = 0,
    ):
        if not 1 <= d <= 20:
            raise ConfigError(f"cauchy-regression needs 1 <= d <= 20 (brute-force l_inf constant), got {d}")
        self.shape = (d,)
        gen = _generator(instance_seed)
        data = torch.randn(samples, d, generator=gen, dtype=DTYPE)
        x_star = torch.randn(d, generator=gen, dtype=DTYPE)
        self._setup(data, x_star, distance, batch, sigma)
        self._best_signs = self._max_sign_pattern()

    def _max_sign_pattern(self) -> torch.Tensor:
        d = self.shape[0]
        codes = torch.arange(2 ** (d - 1))
        bits = (codes.unsqueeze(1) >> torch.arange(d - 1)) & 1
        signs = torch.cat([torch.ones(len(codes), 1), 1.0 - 2.0 * bits], dim=1).to(DTYPE)
        energy = ((signs @ self.flat.T) ** 2).sum(dim=1)
        return signs[int(energy.argmax())]

    def smoothness(self, norm):
        self.check_norm(norm)
        if norm == "l2":
            return self._l2_smoothness()
        s = self._best_signs
        return PHI_CURVATURE * float(((self.flat @ s) ** 2).sum()) / self.samples

    def smoothness_witness(self, norm):
        self.check_norm(norm)
        if norm == "l2":
            return self._l2_witness()
        return self.x_star.clone(), self._best_signs.clone()


class MatrixSensing(_FiniteSumCauchy):
    r"""Robust low-rank matrix sensing ``f(X) = (1/N) sum_j log(1 + (<A_j, X> - y_j)^2)``.

    X in R^{m x n}, ``A_j`` standard Gaussian, planted ``X* = U V^T`` of rank ``rank``
    (Gaussian factors) scaled to ``||X*||_F = distance``, start X0 = 0. The default oracle is
    the full gradient plus Gaussian noise of level ``sigma``; ``batch=B`` gives minibatch noise
    instead (class ``_FiniteSumCauchy``). With K := A^T A / N (D x D, D = mn), r = min(m, n):
    * l2: L = 2 lambda_max(K), exact, attained at X* (as in ``cauchy-regression``).
    * spectral (op -> nuclear): ``||H V||_nuc <= sqrt(r) ||H V||_F <= sqrt(r) L_2 ||V||_F
      <= r L_2 ||V||_op``, so L <= 2 r lambda_max(K). An upper bound: at X* with V
      orthogonal, ``||H V||_nuc >= <V, H V> = (2/N) sum_j <A_j, V>^2``, which is about
      2r for Gaussian data, while lambda_max(K) is about (1 + sqrt(D/N))^2 (Marchenko-Pastur):
      the bound is loose by about that factor.
    * sign (max-entry -> l1): by the same chain with sqrt(D), L <= 2 D lambda_max(K); the
      lower estimate at X*, V = a sign pattern, is about 2D. Upper bound as well.
    """

    name = "matrix-sensing"
    summary = "robust low-rank matrix sensing (Cauchy loss); L exact in l2, bounded in spectral/sign"
    norms = ("spectral", "sign", "l2")

    def __init__(
        self,
        m: int = 8,
        n: int = 6,
        rank: int = 2,
        samples: int = 512,
        batch: int | None = None,
        sigma: float = 0.5,
        distance: float = 1.5,
        instance_seed: int = 0,
    ):
        if not 1 <= rank <= min(m, n):
            raise ConfigError(f"rank must be in [1, min(m, n)] = [1, {min(m, n)}], got {rank}")
        self.shape = (m, n)
        gen = _generator(instance_seed)
        data = torch.randn(samples, m, n, generator=gen, dtype=DTYPE)
        u = torch.randn(m, rank, generator=gen, dtype=DTYPE)
        v = torch.randn(n, rank, generator=gen, dtype=DTYPE)
        self._setup(data, u @ v.T, distance, batch, sigma)

    def smoothness(self, norm):
        self.check_norm(norm)
        scale = {"l2": 1, "spectral": min(self.shape), "sign": math.prod(self.shape)}[norm]
        return scale * self._l2_smoothness()

    def smoothness_exact(self, norm):
        return norm == "l2"

    def smoothness_witness(self, norm):
        self.check_norm(norm)
        return self._l2_witness() if norm == "l2" else None


class Quadratic(Problem):
    r"""``f(X) = (lambda/2) ||X||_F^2`` on m x n matrices: the curvature is known exactly.

    The probe of linear stability (:mod:`delaylab.theory.stability`): near a minimum every
    linear-in-gradient method is a linear recursion in ``eta * lambda``, so the largest stable
    lr of such a method is ``max_stable(...) / lambda``. A matrix, so that optimizers for 2-D
    parameters (Muon) run on it. H = lambda Id everywhere, hence L = lambda (l2),
    lambda min(m, n) (spectral: ``||V||_nuc <= r ||V||_op``, equality for a partial isometry)
    and lambda mn (sign: ``||V||_1 <= mn ||V||_max``, equality for all ones). ``inf f = 0`` at 0.
    Start: a fixed Gaussian matrix scaled to ``||X0||_F = 1``. Noise-free by default. It is
    not in :data:`PROBLEMS` (the rate suite): it has no nonconvex structure to speak of.
    """

    name = "quadratic"
    summary = "(lambda/2)||X||_F^2 on m x n matrices; the linear-stability probe"
    norms = ("spectral", "sign", "l2")

    def __init__(self, m: int = 6, n: int = 4, curvature: float = 1.0, sigma: float = 0.0,
                 instance_seed: int = 0):
        if not curvature > 0:
            raise ConfigError(f"curvature must be > 0, got {curvature}")
        self.shape = (m, n)
        self.curvature, self.sigma = float(curvature), float(sigma)
        g = torch.randn(self.shape, generator=_generator(instance_seed), dtype=DTYPE)
        self.x0 = g / g.norm()

    def value(self, x):
        return 0.5 * self.curvature * x.flatten(1).pow(2).sum(dim=1)

    def grad(self, x):
        return self.curvature * x

    def smoothness(self, norm):
        self.check_norm(norm)
        m, n = self.shape
        return self.curvature * {"l2": 1, "spectral": min(m, n), "sign": m * n}[norm]

    def smoothness_witness(self, norm):
        self.check_norm(norm)
        v = {"l2": _first_unit, "sign": _ones_unit}.get(norm, lambda s: torch.eye(*s, dtype=DTYPE))(self.shape)
        return torch.zeros(self.shape, dtype=DTYPE), v


PROBLEMS: dict[str, Callable[..., Problem]] = {
    cls.name: cls for cls in (LogDet, MatrixSensing, SeparableCauchy, SmoothRastrigin, CauchyRegression)
}
"""Problem name -> constructor (keyword arguments: sizes, ``sigma`` or ``batch``, seeds)."""

DEFAULT_PROBLEM = "logdet"


def make_problem(name: str, **kwargs) -> Problem:
    """Build a problem by name; unknown names and bad sizes raise ValueError."""
    try:
        cls = PROBLEMS[name]
    except KeyError:
        raise ConfigError(f"unknown problem {name!r}; expected one of {', '.join(PROBLEMS)}") from None
    return cls(**kwargs)
