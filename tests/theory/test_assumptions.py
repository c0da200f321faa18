"""Estimators of L, sigma, Delta, rho against problems whose constants are known exactly; the norm check;
TorchObjective leaves the user's model as it was."""

from __future__ import annotations

import math

import numpy as np
import pytest

from delaylab.theory import evaluate, get_bound, lmo_bound, sgdm_bound, tune
from delaylab.theory.assumptions import (TorchObjective, curvature_at, dual_norm, estimate_constants,
                                         estimate_curvature, estimate_delta, estimate_sigma, estimate_smoothness,
                                         evaluate_at_each_L, maximiser, primal_norm, rho)


def _maximiser(b, norm):
    """argmax_{||x|| <= 1} <b, x> per block, written from the definitions (euclidean: see the test)."""
    if norm in ("l2", "euclidean"):
        return b / np.linalg.norm(b)
    if norm == "sign":
        return np.sign(b)
    if b.ndim == 1:
        return b / np.linalg.norm(b)
    u, _, vt = np.linalg.svd(b, full_matrices=False)
    return u @ vt


@pytest.mark.parametrize("norm", ["euclidean", "l2", "sign", "spectral"])
def test_dual_norm_is_the_max_of_the_pairing_over_the_primal_unit_ball(norm):
    rng = np.random.default_rng(0)
    g = [rng.normal(size=(5, 3)), rng.normal(size=7), rng.normal(size=(2, 4))]
    x = [_maximiser(b, norm) for b in g]
    if norm == "euclidean":  # one vector: g / ||g||_2 over all blocks together
        total = math.sqrt(sum((b**2).sum() for b in g))
        x = [b / total for b in g]
    # the module's maximiser is the same point
    assert all(np.allclose(a, b, atol=1e-12) for a, b in zip(maximiser(g, norm), x))
    assert primal_norm(x, norm) == pytest.approx(1.0, rel=1e-12)
    assert sum(float((a * b).sum()) for a, b in zip(g, x)) == pytest.approx(dual_norm(g, norm), rel=1e-12)
    # and no random point of the ball does better
    for _ in range(50):
        y = [rng.normal(size=b.shape) for b in g]
        y = [b / primal_norm(y, norm) for b in y]
        assert sum(float((a * b).sum()) for a, b in zip(g, y)) <= dual_norm(g, norm) + 1e-12


def test_euclidean_is_one_vector_and_l2_is_the_product_of_blocks():
    g = [np.array([3.0, 4.0]), np.array([12.0])]
    assert primal_norm(g, "euclidean") == dual_norm(g, "euclidean") == 13.0
    assert primal_norm(g, "l2") == 12.0 and dual_norm(g, "l2") == 17.0
    assert rho([(2,), (1,)], "euclidean") == 1.0 and rho([(2,), (1,)], "l2") == pytest.approx(math.sqrt(2))
    with pytest.raises(ValueError, match="euclidean, l2, sign, spectral"):
        primal_norm(g, "l1")


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
    assert set(c["constants"]) == {"L", "G0", "rho", "sigma", "Delta", "norm"} and c["constants"]["sigma"] > 0
    assert c["constants"]["norm"] == "l2" and all(e.norm in ("l2", "euclidean", None) for e in c["estimates"].values())
    # the curvature estimate: the Hessian is 2 X^T X / n everywhere, its top eigenvalue is L exactly
    c = estimate_constants(obj.grad, traj, "euclidean", obj.shapes, hvp=obj.hvp, iters=200)
    assert c["L"]["curvature"] == pytest.approx(L_true, rel=1e-6) and c["L"]["secant"] <= L_true * (1 + 1e-9)
    assert c["constants"]["L"] == max(c["L"].values())


# --- the examples of the issue, by hand --------------------------------------------------

H_BLOCKS = (np.array([1.0, 2.0]), np.array([0.5, 3.0]))
QUAD_POINTS = [[np.zeros(2), np.zeros(2)], [np.array([1.0, 0.0]), np.array([0.0, 1.0])]]


def _quad_grad(x):
    return [h * b for h, b in zip(H_BLOCKS, x)]


def _quad_hvp(x, v):
    return [h * b for h, b in zip(H_BLOCKS, v)]


def test_two_tensor_quadratic_euclidean_secant_and_power_iteration_by_hand():
    c = estimate_constants(_quad_grad, QUAD_POINTS, "euclidean", [(2,), (2,)], hvp=_quad_hvp)
    # ||(1, 0, 0, 3)||_2 / ||(1, 0, 0, 1)||_2 = sqrt(10) / sqrt(2)
    assert c["L"]["secant"] == pytest.approx(math.sqrt(10) / math.sqrt(2), rel=1e-12)
    assert round(c["L"]["secant"], 4) == 2.2361
    assert c["L"]["curvature"] == pytest.approx(3.0, rel=1e-6)  # the top eigenvalue of diag(1, 2, 0.5, 3)
    assert c["estimates"]["L_secant"].norm == c["estimates"]["L_curvature"].norm == "euclidean"
    assert c["estimates"]["L_secant"].kind == c["estimates"]["L_curvature"].kind == "lower"
    # the per-tensor product norm l2 gives another (larger) constant: the blocks' tops add up
    c2 = estimate_constants(_quad_grad, QUAD_POINTS, "l2", [(2,), (2,)], hvp=_quad_hvp)
    assert c2["L"]["secant"] == pytest.approx(4.0) and c2["L"]["curvature"] == pytest.approx(5.0, rel=1e-6)


def test_a_bound_refuses_constants_in_another_norm_in_one_line():
    c = estimate_constants(_quad_grad, QUAD_POINTS, "l2", [(2,), (2,)], hvp=_quad_hvp)["constants"]
    consts = dict(c, sigma=1.0, Delta=1.0)
    for call in (lambda: tune(sgdm_bound(1), 1000, consts),
                 lambda: evaluate(sgdm_bound(1), **consts, T=100, eta=0.01, beta=0.9),
                 lambda: tune(lmo_bound(1, norm="spectral"), 1000, consts)):
        with pytest.raises(ValueError) as err:
            call()
        msg = str(err.value)
        assert "\n" not in msg and "l2" in msg and ("euclidean" in msg or "spectral" in msg)
    assert sgdm_bound(1).norm == "euclidean" and lmo_bound(1).norm is None
    # the matching norm, and numbers typed by hand (no norm), are taken
    e = estimate_constants(_quad_grad, QUAD_POINTS, "euclidean", [(2,), (2,)])["constants"]
    want = tune(sgdm_bound(1), 1000, dict(L=e["L"], sigma=1.0, Delta=1.0))
    assert tune(sgdm_bound(1), 1000, dict(e, sigma=1.0, Delta=1.0)).value == pytest.approx(want.value, rel=1e-12)
    assert tune(lmo_bound(1, norm="l2"), 1000, consts).value > 0 and tune(lmo_bound(1), 1000, consts).value > 0
    with pytest.raises(ValueError, match="euclidean"):
        get_bound("sgdm", 1, norm="spectral")
    with pytest.raises(ValueError, match="unknown norm"):
        lmo_bound(1, norm="nuclear")


def test_the_bound_at_each_estimate_of_L_grows_with_L():
    est = estimate_constants(_quad_grad, QUAD_POINTS, "euclidean", [(2,), (2,)], hvp=_quad_hvp)
    est["constants"].update(sigma=0.5, Delta=2.0)
    each = evaluate_at_each_L(sgdm_bound(0), est, T=1000, eta=0.01, beta=0.5)
    assert set(each) == {"secant", "curvature"} and each["secant"].value < each["curvature"].value
    for name, ev in each.items():
        L = est["L"][name]
        c = 1 - L * 0.01 - 2 * (L * 0.01 * 1.0) ** 2  # kappa = beta/(1-beta) = 1
        want = 2 * 2.0 / (c * 0.01 * 1000) + L * 0.01 * 0.25 / c + 2 * L**2 * 1e-4 * 1.0 * 0.25 / c
        assert ev.value == pytest.approx(want, rel=1e-12)


# --- the power iteration ------------------------------------------------------------------

def _brute_inf_to_one(H):
    """max_{||v||_inf <= 1} ||H v||_1 = max over sign vectors s, t of s^T H t (a convex function's max)."""
    n = H.shape[0]
    signs = np.array([[1 - 2 * ((k >> i) & 1) for i in range(n)] for k in range(2**n)], dtype=float)
    return float(np.abs(signs @ H).sum(axis=1).max())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_power_iteration_is_a_lower_estimate_in_every_norm_and_exact_in_the_euclidean(seed):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(8, 8))
    H = (A + A.T) / 2
    hvp = lambda x, v: H @ v  # noqa: E731
    top = float(np.abs(np.linalg.eigvalsh(H)).max())
    val, _ = curvature_at(hvp, np.zeros(8), "euclidean", iters=2000, tol=1e-13)
    assert val == pytest.approx(top, rel=1e-8)
    val, _ = curvature_at(hvp, np.zeros(8), "sign", iters=200)
    truth = _brute_inf_to_one(H)
    # a local maximum of a convex function over the cube: never above the max, and at least the
    # value at the top eigenvector's sign pattern's neighbourhood (here within a factor 1/2)
    assert 0.5 * truth <= val <= truth * (1 + 1e-12)
    # the values along the iteration never decrease (symmetric H)
    seq = []
    for k in range(1, 8):
        seq.append(curvature_at(hvp, np.zeros(8), "sign", iters=k, tol=0.0)[0])
    assert all(b >= a - 1e-12 for a, b in zip(seq, seq[1:]))


def test_curvature_estimate_on_a_matrix_block_in_the_spectral_norm():
    # f(W) = (c/2)||W||_F^2: H = c Id, ||H||_{op -> nuclear} = c min(m, n), attained by a partial isometry
    hvp = lambda x, v: [3.0 * b for b in v]  # noqa: E731
    e = estimate_curvature(hvp, [[np.zeros((5, 3)), np.zeros(4)]], "spectral")
    assert e.value == pytest.approx(3.0 * (3 + 1)) and e.norm == "spectral" and e.kind == "lower"


# --- sigma: its sampling and side in the result -----------------------------------------

def test_sigma_reports_its_sampling_and_its_unbiased_squares():
    d, sigma = 10, 0.5
    rng_pts = [np.zeros(d), np.ones(d)]

    def stoch(x, i):
        return 2 * x + np.random.default_rng([int(x[0]), i]).normal(0, sigma / math.sqrt(d), size=d)

    e = estimate_sigma(stoch, rng_pts, n_samples=4000)
    assert e.norm == "euclidean" and "4000 stochastic gradients at each of 2 points" in e.sampling
    assert "unbiased" in e.note and e.kind == "estimate"
    # samples are the per-point unbiased estimates of sigma^2 (relative standard error ~ 1/sqrt(2 n d))
    assert np.allclose(e.samples, sigma**2, rtol=0.05) and e.value == pytest.approx(math.sqrt(e.samples.max()))


# --- TorchObjective leaves the model as it was --------------------------------------------

def _mlp(bn: bool = False, dropout: float = 0.0):
    import torch

    torch.manual_seed(0)
    layers = [torch.nn.Linear(4, 8)]
    if bn:
        layers.append(torch.nn.BatchNorm1d(8))
    layers += [torch.nn.Tanh(), torch.nn.Dropout(dropout), torch.nn.Linear(8, 1)]
    return torch.nn.Sequential(*layers).double()


def _data(k=4):
    import torch

    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 4, generator=g, dtype=torch.float64), torch.randn(16, 1, generator=g,
                                                                               dtype=torch.float64))
            for _ in range(k)]


def _mse(m, b):
    return ((m(b[0]) - b[1]) ** 2).mean()


def test_estimation_leaves_the_users_weights_and_restore_returns_them():
    import torch

    model = _mlp()
    obj = TorchObjective(model, _mse, _data())
    init = obj.point()
    # the user trains after building the objective: these are the weights to keep
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for b in _data():
        opt.zero_grad()
        _mse(model, b).backward()
        opt.step()
    trained = [p.detach().clone() for p in model.parameters()]
    grads = [p.grad.clone() for p in model.parameters()]
    assert not np.allclose(trained[0].numpy(), init[0])
    traj = [init, [b * 1.1 for b in init], [b * 0.9 for b in init]]
    estimate_constants(obj.grad, traj, "euclidean", obj.shapes, stoch_grad=obj.stoch_grad, n_samples=4,
                       losses=[obj.loss(p) for p in traj], hvp=obj.hvp, iters=10)
    for p, w, g in zip(model.parameters(), trained, grads):
        assert torch.equal(p.detach(), w) and torch.equal(p.grad, g)  # weights and .grad untouched, bitwise
    obj.load(traj[1])  # writing a point into the model on purpose ...
    assert np.allclose(model[0].weight.detach().numpy(), traj[1][0])
    obj.restore()  # ... and back to the user's weights, not the ones at construction
    assert all(torch.equal(p.detach(), w) for p, w in zip(model.parameters(), trained))
    obj.restore()  # a second restore is a no-op
    assert all(torch.equal(p.detach(), w) for p, w in zip(model.parameters(), trained))


def test_train_mode_batchnorm_and_dropout_are_evaluated_in_eval_mode_or_refused():
    import torch

    model = _mlp(bn=True, dropout=0.5)
    model.train()
    running = model[1].running_mean.clone()
    with pytest.warns(UserWarning, match="BatchNorm1d, Dropout in train mode"):
        obj = TorchObjective(model, _mse, _data())
    assert "eval mode" in obj.notes[0]
    x = obj.point()
    g1, g2 = obj.grad(x), obj.grad(x)
    assert all(np.array_equal(a, b) for a, b in zip(g1, g2))  # a function of the point
    model.eval()
    want = [p.grad for p in (lambda ls: (ls.backward(), model.parameters())[1])(
        sum(_mse(model, b) for b in _data()) / 4)]
    assert all(np.allclose(a, b.numpy(), rtol=1e-12) for a, b in zip(g1, want))
    model.train()
    assert model.training and model[1].training  # the modes are put back
    assert torch.equal(model[1].running_mean, running)  # eval mode: the running statistics are not updated
    with pytest.raises(ValueError) as err:
        TorchObjective(model, _mse, _data(), train_mode="refuse")
    assert "\n" not in str(err.value) and "BatchNorm1d" in str(err.value)
    model.eval()
    TorchObjective(model, _mse, _data(), train_mode="refuse")  # in eval mode there is nothing to refuse


def test_stochastic_gradients_never_reuse_a_batch():
    obj = TorchObjective(_mlp(), _mse, _data(3))
    with pytest.raises(ValueError, match="has 3"):
        estimate_sigma(obj.stoch_grad, [obj.point()], n_samples=4)
