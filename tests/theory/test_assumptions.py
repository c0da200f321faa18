"""Estimators of L, sigma, Delta, rho against problems whose constants are known exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest

from delaylab.theory.assumptions import (TorchObjective, dual_norm, estimate_constants, estimate_delta,
                                         estimate_sigma, estimate_smoothness, primal_norm, rho)


def _maximiser(b, norm):
    """argmax_{||x|| <= 1} <b, x> per block, written from the definitions."""
    if norm == "l2":
        return b / np.linalg.norm(b)
    if norm == "sign":
        return np.sign(b)
    if b.ndim == 1:
        return b / np.linalg.norm(b)
    u, _, vt = np.linalg.svd(b, full_matrices=False)
    return u @ vt


@pytest.mark.parametrize("norm", ["l2", "sign", "spectral"])
def test_dual_norm_is_the_max_of_the_pairing_over_the_primal_unit_ball(norm):
    rng = np.random.default_rng(0)
    g = [rng.normal(size=(5, 3)), rng.normal(size=7), rng.normal(size=(2, 4))]
    x = [_maximiser(b, norm) for b in g]
    assert primal_norm(x, norm) == pytest.approx(1.0, rel=1e-12)
    assert sum(float((a * b).sum()) for a, b in zip(g, x)) == pytest.approx(dual_norm(g, norm), rel=1e-12)
    # and no random point of the ball does better
    for _ in range(50):
        y = [rng.normal(size=b.shape) for b in g]
        y = [b / primal_norm(y, norm) for b in y]
        assert sum(float((a * b).sum()) for a, b in zip(g, y)) <= dual_norm(g, norm) + 1e-12


@pytest.mark.parametrize("norm", ["l2", "sign", "spectral"])
def test_rho_bounds_the_dual_norm_and_is_attained(norm):
    shapes = [(6, 4), (5,), (3, 8)]
    r = rho(shapes, norm)
    rng = np.random.default_rng(1)
    for _ in range(50):
        g = [rng.normal(size=s) for s in shapes]
        assert dual_norm(g, norm) <= r * math.sqrt(sum((b**2).sum() for b in g)) + 1e-12
    # the extremal gradient: each block a maximiser of ||.||_*/||.||_2, scaled by its own rho
    blocks = []
    for s in shapes:
        if norm == "l2":
            b, rl = np.ones(s) / math.sqrt(np.prod(s)), 1.0
        elif norm == "sign":
            b, rl = np.ones(s) / math.sqrt(np.prod(s)), math.sqrt(np.prod(s))
        elif len(s) == 1:
            b, rl = np.ones(s) / math.sqrt(s[0]), 1.0
        else:
            q = np.linalg.qr(rng.normal(size=(max(s), min(s))))[0]
            b = (q if s[0] >= s[1] else q.T) / math.sqrt(min(s))
            rl = math.sqrt(min(s))
        blocks.append(rl * b)
    assert dual_norm(blocks, norm) == pytest.approx(r * math.sqrt(sum((b**2).sum() for b in blocks)), rel=1e-9)
    assert rho((6, 4), "spectral") == pytest.approx(2.0)


def test_smoothness_is_a_lower_estimate_and_exact_on_extremal_pairs():
    lam = np.array([3.0, 1.0, 0.5, 0.25])
    grad = lambda x: lam * np.asarray(x)  # noqa: E731
    # l2: L = max lambda; attained along e_1
    est = estimate_smoothness(grad, [np.zeros(4), np.eye(4)[0]], "l2")
    assert est.kind == "lower" and est.value == pytest.approx(3.0)
    # l_inf (dual l1): L = sum lambda (a diagonal quadratic), attained by the all-ones step
    assert estimate_smoothness(grad, [np.zeros(4), np.ones(4)], "sign").value == pytest.approx(lam.sum())
    # random pairs and perturbations never exceed the true constant
    rng = np.random.default_rng(2)
    traj = [rng.normal(size=4) for _ in range(20)]
    for norm, true_l in (("l2", 3.0), ("sign", lam.sum())):
        e = estimate_smoothness(grad, traj, norm, n_random=50, n_perturb=50)
        assert e.value <= true_l * (1 + 1e-12) and e.value > 0.3 * true_l and e.n == 19 + 100


def test_sigma_recovers_a_known_noise_level():
    d, sigma = 40, 0.7
    grad = lambda x: 2 * x  # noqa: E731

    def stoch(x, i):
        return grad(x) + np.random.default_rng(1000 + i).normal(0, sigma / math.sqrt(d), size=d)

    pts = [np.zeros(d), np.ones(d)]
    for full in (None, grad):
        e = estimate_sigma(stoch, pts, n_samples=300, full_grad=full)
        assert e.value == pytest.approx(sigma, rel=0.05) and e.samples.shape == (2,)
    with pytest.raises(ValueError):
        estimate_sigma(stoch, pts, n_samples=1)


def test_delta_brackets_the_gap():
    trace = [5.0, 4.0, 3.5, 3.6, 3.2, 3.3]
    d = estimate_delta(trace, f_lower=0.0)
    assert d["lower"].value == pytest.approx(1.8) and d["upper"].value == pytest.approx(5.0)
    assert estimate_delta(trace, window=2)["lower"].value == pytest.approx(4.5 - 3.25)
    for bad in ([], [1.0, float("nan")], [[1.0]]):
        with pytest.raises(ValueError):
            estimate_delta(bad)
    with pytest.raises(ValueError):
        estimate_delta(trace, f_lower=4.0)


def test_torch_objective_gives_the_analytic_gradient_and_a_valid_lower_L():
    import torch

    torch.manual_seed(0)
    n, d = 64, 5
    X = torch.randn(n, d, dtype=torch.float64)
    y = torch.randn(n, dtype=torch.float64)
    model = torch.nn.Linear(d, 1, bias=False).double()
    batches = [(X[i::4], y[i::4]) for i in range(4)]

    def loss_fn(m, b):
        return ((m(b[0]).squeeze(-1) - b[1]) ** 2).mean()

    obj = TorchObjective(model, loss_fn, batches)
    w0 = obj.point()
    w = w0[0].ravel()
    Xn, yn = X.numpy(), y.numpy()
    # the mean over 4 equal batches is the full-data gradient 2 X^T (X w - y) / n
    want = 2 * Xn.T @ (Xn @ w - yn) / n
    assert np.allclose(obj.grad(w0)[0].ravel(), want, rtol=1e-10)
    traj = [[w0[0] + 0.1 * k * np.ones_like(w0[0])] for k in range(5)]
    L_true = 2 * np.linalg.eigvalsh(Xn.T @ Xn / n).max()
    e = estimate_smoothness(obj.grad, traj, "l2", n_perturb=20)
    assert e.value <= L_true * (1 + 1e-9)
    c = estimate_constants(obj.grad, traj, "l2", obj.shapes, stoch_grad=obj.stoch_grad, n_samples=4,
                           losses=[obj.loss(p) for p in traj], f_lower=0.0)
    assert set(c["constants"]) == {"L", "G0", "rho", "sigma", "Delta"} and c["constants"]["sigma"] > 0
    obj._load(traj[-1])
    obj.restore()
    assert np.array_equal(obj.point()[0], w0[0])
