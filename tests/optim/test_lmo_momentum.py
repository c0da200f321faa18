"""LMOMomentum against a hand-written float64 recursion and against torch.optim.Muon."""

import numpy as np
import pytest
import torch

from delaylab.optim import LMOMomentum, primal_norm


def _grads(n, shape, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for _ in range(n)]


def _np_direction(c, norm):
    if norm == "sign":
        return -np.sign(c)
    if norm == "l2":
        return -c / np.linalg.norm(c)
    u, _, vh = np.linalg.svd(c, full_matrices=False)
    return -u @ vh


@pytest.mark.parametrize("norm", ["spectral", "sign", "l2"])
@pytest.mark.parametrize("nesterov", [False, True])
def test_matches_hand_recursion(norm, nesterov):
    lr, beta, wd = 0.05, 0.9, 0.1
    grads = _grads(12, (4, 3), seed=0)
    x0 = np.random.default_rng(1).standard_normal((4, 3))
    p = torch.tensor(x0, requires_grad=True)
    opt = LMOMomentum([p], lr=lr, beta=beta, norm=norm, nesterov=nesterov, weight_decay=wd)
    x, m = x0.copy(), np.zeros_like(x0)
    for g in grads:
        p.grad = torch.tensor(g)
        opt.step()
        m = beta * m + (1 - beta) * g
        c = beta * m + (1 - beta) * g if nesterov else m
        x = (1 - lr * wd) * x + lr * _np_direction(c, norm)
        np.testing.assert_allclose(p.detach().numpy(), x, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("norm", ["spectral", "sign", "l2"])
def test_every_step_has_norm_lr(norm):
    gen = torch.Generator().manual_seed(2)
    p = torch.randn(6, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    opt = LMOMomentum([p], lr=0.03, beta=0.5, norm=norm)
    for _ in range(5):
        before = p.detach().clone()
        p.grad = torch.randn(6, 5, dtype=torch.float64, generator=gen)
        opt.step()
        assert float(primal_norm(p.detach() - before, norm)) == pytest.approx(0.03, rel=1e-12)


def test_batched_seeds_match_separate_runs():
    gen = torch.Generator().manual_seed(3)
    x0 = torch.randn(3, 5, 4, dtype=torch.float64, generator=gen)
    grads = [torch.randn(3, 5, 4, dtype=torch.float64, generator=gen) for _ in range(6)]
    batched = x0.clone().requires_grad_()
    opt = LMOMomentum([batched], lr=0.1, beta=0.8, batch_dims=1)
    singles = [x0[s].clone().requires_grad_() for s in range(3)]
    opts = [LMOMomentum([q], lr=0.1, beta=0.8) for q in singles]
    for g in grads:
        batched.grad = g
        opt.step()
        for s in range(3):
            singles[s].grad = g[s].clone()
            opts[s].step()
    for s in range(3):
        torch.testing.assert_close(batched[s].detach(), singles[s].detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(16, 8), (8, 16)])
def test_agrees_with_torch_muon_bit_for_bit(shape):
    gen = torch.Generator().manual_seed(4)
    x0 = torch.randn(shape, generator=gen)
    a, b = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    ours = LMOMomentum([a], lr=0.02, beta=0.95, norm="spectral", nesterov=True, weight_decay=0.1,
                       method="newton-schulz", scale="muon")
    ref = torch.optim.Muon([b], lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.1)
    for _ in range(10):
        g = torch.randn(shape, generator=gen)
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    assert torch.equal(a, b)


def test_bad_arguments():
    p = torch.zeros(2, 2, requires_grad=True)
    for kwargs, msg in [
        (dict(lr=0.0), "lr"),
        (dict(lr=-1.0), "lr"),
        (dict(lr=0.1, beta=1.0), "beta"),
        (dict(lr=0.1, beta=-0.1), "beta"),
        (dict(lr=0.1, norm="l3"), "norm"),
        (dict(lr=0.1, method="qr"), "method"),
    ]:
        with pytest.raises(ValueError, match=msg):
            LMOMomentum([p], **kwargs)


def test_exact_spectral_steps_batch_the_svds_of_equal_shapes(monkeypatch):
    """On CUDA the SVDs of same-shape matrices go in one batched call (fewer cuSOLVER calls, each of
    which may wait for the device). The batching is forced here on the CPU: the same step as one
    SVD per matrix, to float64 rounding, with matrices of two shapes, a vector and a batched seed."""
    from delaylab.optim import lmo_momentum

    gen = torch.Generator().manual_seed(0)
    shapes = [(6, 4), (6, 4), (3, 5), (6, 4), (7,), (3, 5)]
    start = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    grads = [[torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes] for _ in range(3)]
    calls = []
    svd = torch.linalg.svd
    monkeypatch.setattr(torch.linalg, "svd", lambda a, **kw: calls.append(tuple(a.shape)) or svd(a, **kw))

    def run(batch: bool):
        monkeypatch.setattr(lmo_momentum, "_batch_svd", lambda t: batch)
        ps = [x.clone().requires_grad_() for x in start]
        opt = LMOMomentum(ps, lr=0.1, beta=0.9, nesterov=True, weight_decay=0.01, scale="muon")
        for gs in grads:
            for p, g in zip(ps, gs):
                p.grad = g.clone()
            opt.step()
        return ps

    calls.clear()
    one_by_one = run(False)
    assert len(calls) == 3 * 6
    calls.clear()
    batched = run(True)
    assert set(calls) == {(3, 6, 4), (2, 3, 5), (1, 7, 1)} and len(calls) == 3 * 3
    for a, b in zip(one_by_one, batched):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)
    assert max((a - s).abs().max() for a, s in zip(batched, start)) > 0.1  # the steps moved the weights
