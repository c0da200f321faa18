"""RotatedAdam (basis rotation, arXiv 2602.03515, Algorithm 1) against the recursion written out in
numpy, float64, on a small nonlinear matrix problem; and under Delayed."""

import numpy as np
import pytest
import torch

from delaylab.errors import ConfigError
from delaylab.optim import CombinedOptimizer, Delayed, RotatedAdam, build_optimizer

M, N, T = 4, 4, 23  # square: G G^T and G^T G have full rank (a null space would make the basis arbitrary there)
# eps 1e-3: at step 1 the bases are G's singular vectors, so Q_L^T G Q_R is diagonal and its off-diagonal
# entries are rounding (1e-16) over sqrt(V) + eps; a tiny eps would amplify them past any tolerance
LR, B1, B2, EPS, WD, K = 0.05, 0.9, 0.95, 1e-3, 0.1, 4
A = np.random.default_rng(0).standard_normal((M, M))
C = np.random.default_rng(1).standard_normal((N, N))
W0 = np.random.default_rng(2).standard_normal((M, N))


def grad(w, c):
    """Gradient of sum(tanh(A w C + noise_c)^2) / 2: curvature coupled across rows and columns."""
    z = A @ w @ C + np.random.default_rng(100 + c).standard_normal((M, N))
    return A.T @ (np.tanh(z) * (1 - np.tanh(z) ** 2)) @ C.T


def eig_desc(m):
    _, q = np.linalg.eigh(m)
    return q[:, ::-1]


def power(m, q, v, axis):
    mq = m @ q
    order = np.argsort(-np.sum(q * mq, axis=0), kind="stable")
    new, _ = np.linalg.qr(mq[:, order])
    return new, np.take(v, order, axis=axis)


def by_hand(steps=T, at=lambda hist, t: hist[-1]):
    """The paper's Algorithm 1 (bilateral, second-order source) as a numpy loop; ``at`` picks the
    weights the gradient of step t is taken at (the latest, or a stale one)."""
    w, hist = W0.copy(), [W0.copy()]
    L, R = np.zeros((M, M)), np.zeros((N, N))
    m, v, ql, qr = np.zeros((M, N)), np.zeros((M, N)), None, None
    for t in range(1, steps + 1):
        g = grad(at(hist, t), t - 1)
        L = B2 * L + (1 - B2) * g @ g.T
        R = B2 * R + (1 - B2) * g.T @ g
        if ql is None:
            ql, qr = eig_desc(L), eig_desc(R)
        elif t % K == 0:
            ql, v = power(L, ql, v, 0)
            qr, v = power(R, qr, v, 1)
        m = B1 * m + (1 - B1) * g
        v = B2 * v + (1 - B2) * (ql.T @ g @ qr) ** 2
        u = ql @ ((ql.T @ m @ qr) / (np.sqrt(v) + EPS)) @ qr.T
        w = (1 - LR * WD) * w - LR * np.sqrt(1 - B2**t) / (1 - B1**t) * u
        hist.append(w.copy())
    return np.array(hist[1:])


def test_rotated_adam_is_algorithm_1_by_hand():
    w = torch.tensor(W0, requires_grad=True)
    opt = RotatedAdam([w], lr=LR, betas=(B1, B2), eps=EPS, weight_decay=WD, precondition_frequency=K)
    out = []
    for c in range(T):
        w.grad = torch.tensor(grad(w.detach().numpy(), c))
        opt.step()
        out.append(w.detach().numpy().copy())
    expected = by_hand()
    # the bases' column signs may differ between LAPACK calls: the update does not depend on them
    np.testing.assert_allclose(np.array(out), expected, rtol=0, atol=1e-12)
    # and the refreshes did something: with the bases frozen at step 1 the path differs
    assert np.abs(expected[-1] - W0).max() > 0.1


def test_rotation_changes_adam():
    """At the identity basis it would be Adam: on this coupled problem the paths differ."""
    w = torch.tensor(W0, requires_grad=True)
    adam = torch.optim.Adam([w], lr=LR, betas=(B1, B2), eps=EPS)
    for c in range(T):
        w.grad = torch.tensor(grad(w.detach().numpy(), c))
        adam.step()
    assert np.abs(w.detach().numpy() - by_hand()[-1]).max() > 1e-3


@pytest.mark.parametrize("tau", [1, 3])
def test_under_delayed_it_takes_the_stale_gradient(tau):
    """Delayed(RotatedAdam, tau): update k uses the gradient at the weights of update k - tau
    (x_{-j} = x_0), the rest of Algorithm 1 unchanged."""
    w = torch.tensor(W0, requires_grad=True)
    opt = Delayed(RotatedAdam([w], lr=LR, betas=(B1, B2), eps=EPS, weight_decay=WD, precondition_frequency=K), tau)
    out = []
    for c in range(T + tau):
        w.grad = torch.tensor(grad(w.detach().numpy(), c))
        opt.step()
        if opt.updated:
            out.append(w.detach().numpy().copy())
    expected = by_hand(at=lambda hist, t: hist[max(0, t - 1 - tau)])
    np.testing.assert_allclose(np.array(out), expected, rtol=0, atol=1e-12)


def test_registry_splits_like_muon():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = build_optimizer("rotated-adam", model, lr=2e-3, momentum=0.8)
    assert isinstance(opt, CombinedOptimizer)
    rot, adam = opt.optimizers
    assert isinstance(rot, RotatedAdam) and isinstance(adam, torch.optim.AdamW)
    assert [p.shape for g in rot.param_groups for p in g["params"]] == [torch.Size([4, 4])]
    assert rot.param_groups[0]["betas"] == (0.8, 0.95) and adam.param_groups[0]["lr"] == 2e-3
    assert rot.param_groups[0]["weight_decay"] == 0.1


def test_bad_input_is_a_config_error():
    with pytest.raises(ConfigError, match="matrices"):
        RotatedAdam([torch.zeros(3, requires_grad=True)])
    with pytest.raises(ConfigError, match="precondition_frequency"):
        RotatedAdam([torch.zeros(2, 2, requires_grad=True)], precondition_frequency=0)
