"""LMO maps and dual norms, against float64 SVD / numpy and the defining identities."""

import numpy as np
import pytest
import torch

from delaylab.optim.lmo import (
    CUBIC_COEFFICIENTS,
    NORMS,
    canonical_norm,
    dual_norm,
    lmo,
    muon_lr_scale,
    newton_schulz,
    primal_norm,
)

SHAPES = [(7,), (5, 3), (3, 8), (4, 2, 3)]


def _numpy_dual(x: np.ndarray, norm: str) -> float:
    if norm == "spectral":
        mat = x.reshape(x.shape[0], -1) if x.ndim > 1 else x.reshape(-1, 1)
        return float(np.linalg.svd(mat, compute_uv=False).sum())
    if norm == "sign":
        return float(np.abs(x).sum())
    return float(np.sqrt((x**2).sum()))


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("shape", SHAPES)
def test_lmo_attains_the_dual_norm_and_has_unit_norm(norm, shape):
    gen = torch.Generator().manual_seed(hash((norm, shape)) % 2**31)
    for _ in range(5):
        m = torch.randn(shape, dtype=torch.float64, generator=gen)
        d = lmo(m, norm)
        assert d.shape == m.shape
        dual = dual_norm(m, norm)
        assert float(dual) == pytest.approx(_numpy_dual(m.numpy(), norm), rel=1e-12)
        assert float((m * d).sum()) == pytest.approx(-float(dual), rel=1e-12)
        assert float(primal_norm(d, norm)) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("norm", NORMS)
def test_lmo_is_the_minimiser_over_the_ball(norm):
    """No feasible point does better than lmo(m): <m, d> >= -||m||_* for random ||d|| <= 1."""
    gen = torch.Generator().manual_seed(1)
    m = torch.randn(6, 4, dtype=torch.float64, generator=gen)
    best = float((m * lmo(m, norm)).sum())
    for _ in range(200):
        d = torch.randn(6, 4, dtype=torch.float64, generator=gen)
        d = d / primal_norm(d, norm)
        assert float((m * d).sum()) >= best - 1e-12


@pytest.mark.parametrize("norm", NORMS)
def test_batch_dims_treat_leading_dims_as_independent_problems(norm):
    gen = torch.Generator().manual_seed(2)
    m = torch.randn(4, 5, 3, dtype=torch.float64, generator=gen)
    batched = lmo(m, norm, batch_dims=1)
    for s in range(4):
        torch.testing.assert_close(batched[s], lmo(m[s], norm), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        dual_norm(m, norm, batch_dims=1), torch.stack([dual_norm(m[s], norm) for s in range(4)])
    )


def test_spectral_norm_of_a_vector_is_its_l2_norm():
    v = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert float(primal_norm(v, "spectral")) == pytest.approx(5.0)
    torch.testing.assert_close(lmo(v, "spectral"), lmo(v, "l2"))


@pytest.mark.parametrize("method", ["svd", "newton-schulz"])
def test_zero_input_gives_a_feasible_direction_and_leaves_the_other_slices_exact(method):
    """A zero slice (every direction is optimal) gives a finite, feasible output, no 0/0, and the
    nonzero slice beside it in the batch is still the exact LMO: unit norm, <m, d> = -||m||_*."""
    gen = torch.Generator().manual_seed(4)
    m = torch.stack([torch.zeros(3, 2, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64, generator=gen)])
    for norm in NORMS:
        if method == "newton-schulz" and norm != "spectral":
            continue
        opts = {"ns_dtype": torch.float64, "ns_steps": 30, "ns_coefficients": CUBIC_COEFFICIENTS} \
            if method == "newton-schulz" else {}
        d = lmo(m, norm, batch_dims=1, method=method, **opts)
        assert torch.isfinite(d).all(), (norm, d)
        assert float(primal_norm(d[0], norm)) <= 1.0 + 1e-12
        assert float(primal_norm(d[1], norm)) == pytest.approx(1.0, abs=1e-6)
        assert float((m[1] * d[1]).sum()) == pytest.approx(-float(dual_norm(m[1], norm)), rel=1e-6)


def _polar(m):
    u, _, vh = torch.linalg.svd(m, full_matrices=False)
    return u @ vh


@pytest.mark.parametrize("shape", [(64, 32), (32, 64), (8, 200), (50, 3)])
def test_muon_newton_schulz_error_against_the_svd_polar_factor(shape):
    """Stated accuracy of Muon's 5-step quintic: singular values in [0.6, 1.2], so the
    relative Frobenius error to U V^T is at most 0.35 (we measured <= 0.31 on these shapes)."""
    gen = torch.Generator().manual_seed(3)
    for _ in range(10):
        m = torch.randn(shape, dtype=torch.float64, generator=gen)
        for dtype in (torch.bfloat16, torch.float32):
            q = newton_schulz(m, dtype=dtype).double()
            assert float((q - _polar(m)).norm() / _polar(m).norm()) <= 0.35
            sv = torch.linalg.svdvals(q)
            assert 0.6 <= float(sv.min()) and float(sv.max()) <= 1.2


def test_cubic_newton_schulz_converges_to_the_polar_factor():
    gen = torch.Generator().manual_seed(4)
    m = torch.randn(40, 20, dtype=torch.float64, generator=gen)
    q = newton_schulz(m, steps=25, coefficients=CUBIC_COEFFICIENTS, dtype=None)
    assert float((q - _polar(m)).norm() / _polar(m).norm()) < 1e-10


def test_batched_newton_schulz_matches_per_matrix():
    gen = torch.Generator().manual_seed(5)
    m = torch.randn(3, 6, 4, dtype=torch.float64, generator=gen)
    batched = newton_schulz(m, dtype=None)
    for s in range(3):
        torch.testing.assert_close(batched[s], newton_schulz(m[s], dtype=None), rtol=1e-10, atol=1e-12)


def test_newton_schulz_matches_torch_muon_kernel_bitwise():
    from torch.optim._muon import _zeropower_via_newtonschulz

    gen = torch.Generator().manual_seed(6)
    for shape in [(16, 8), (8, 16)]:
        m = torch.randn(shape, generator=gen)
        ref = _zeropower_via_newtonschulz(m, (3.4445, -4.7750, 2.0315), 5, 1e-7)
        assert torch.equal(newton_schulz(m), ref)


def test_norm_names_and_helpers():
    assert canonical_norm("linf") == "sign"
    with pytest.raises(ValueError, match="unknown norm"):
        canonical_norm("l7")
    assert muon_lr_scale((12, 3)) == pytest.approx(2.0)
    assert muon_lr_scale((3, 12)) == 1.0
    with pytest.raises(ValueError):
        newton_schulz(torch.ones(3))
