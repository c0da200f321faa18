"""Every stated constant of delaylab.toy.problems against an independent computation.

Dual norms are recomputed here from their definitions (l1, l2, nuclear via singular
values), Hessians come from autograd in float64, operator norms l_inf -> l1 from brute force
over sign vectors (the max of a convex function over the cube is at a vertex).
"""

import itertools
import math

import pytest
import torch

from delaylab.toy.problems import (
    PROBLEMS,
    CauchyRegression,
    LogDet,
    MatrixSensing,
    SeparableCauchy,
    SmoothRastrigin,
    make_problem,
)

F64 = torch.float64


def small_instances():
    """Instances small enough for brute force (D <= 12 entries), plus the defaults."""
    return [
        SeparableCauchy(d=6),
        SmoothRastrigin(d=6, b=3.0, omega=2.0),
        LogDet(m=4, n=3),
        LogDet(m=3, n=4, instance_seed=1),
        CauchyRegression(d=6, samples=40, batch=3),
        MatrixSensing(m=4, n=3, rank=1, samples=60, batch=4),
    ]


ALL = small_instances() + [make_problem(name) for name in PROBLEMS]
IDS = [f"{p.name}{list(p.shape)}" for p in ALL]


def dual(g: torch.Tensor, norm: str) -> torch.Tensor:
    """Dual norm of each row of a batch (S, *shape), from the definitions."""
    flat = g.reshape(g.shape[0], -1)
    if norm == "l2":
        return flat.norm(dim=1)
    if norm == "sign":
        return flat.abs().sum(dim=1)
    return torch.linalg.svdvals(g).sum(dim=-1)


def primal(x: torch.Tensor, norm: str) -> torch.Tensor:
    flat = x.reshape(x.shape[0], -1)
    if norm == "l2":
        return flat.norm(dim=1)
    if norm == "sign":
        return flat.abs().amax(dim=1)
    return torch.linalg.matrix_norm(x, ord=2)


def hessian(problem, x: torch.Tensor) -> torch.Tensor:
    """The D x D Hessian of f at one point x (shape ``problem.shape``), by autograd."""
    d = x.numel()
    h = torch.autograd.functional.hessian(lambda z: problem.value(z.reshape(1, *problem.shape))[0], x.reshape(-1))
    return h.reshape(d, d)


def random_points(problem, count, seed=0, scale=3.0):
    gen = torch.Generator().manual_seed(seed)
    pts = scale * torch.randn(count, *problem.shape, generator=gen, dtype=F64)
    # Points near the attainment region (x* or 0) and far out, where curvature is negative.
    anchor = getattr(problem, "x_star", torch.zeros(problem.shape, dtype=F64))
    near = anchor + 0.3 * torch.randn(count, *problem.shape, generator=gen, dtype=F64)
    return torch.cat([pts, near, 10 * pts])


@pytest.mark.parametrize("problem", ALL, ids=IDS)
def test_gradient_matches_autograd(problem):
    x = random_points(problem, 4).requires_grad_(True)
    (auto,) = torch.autograd.grad(problem.value(x).sum(), x)
    torch.testing.assert_close(problem.grad(x.detach()), auto, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("problem", ALL, ids=IDS)
def test_delta_is_value_above_a_reached_infimum(problem):
    x = random_points(problem, 64, seed=1)
    assert bool((problem.value(x) >= problem.f_star - 1e-12).all())
    minimiser = getattr(problem, "x_star", torch.zeros(problem.shape, dtype=F64))
    assert float(problem.value(minimiser.unsqueeze(0))[0]) == pytest.approx(problem.f_star, abs=1e-12)
    assert problem.delta() == pytest.approx(float(problem.value(problem.x0.unsqueeze(0))[0]) - problem.f_star)
    assert problem.delta() > 0


def _params():
    return [(p, norm) for p in ALL for norm in p.norms]


@pytest.mark.parametrize("problem,norm", _params(), ids=[f"{i}-{n}" for i, p in zip(IDS, ALL) for n in p.norms])
def test_smoothness_never_exceeded_on_random_pairs(problem, norm):
    """||grad f(x) - grad f(y)||_* / ||x - y|| over random pairs, far and near, stays <= L."""
    lip = problem.smoothness(norm)
    x = random_points(problem, 200, seed=2)
    gen = torch.Generator().manual_seed(3)
    for step in (1e-3, 0.3, 3.0):
        y = x + step * torch.randn(x.shape, generator=gen, dtype=F64)
        ratio = dual(problem.grad(x) - problem.grad(y), norm) / primal(x - y, norm)
        assert float(ratio.max()) <= lip * (1 + 1e-9)


@pytest.mark.parametrize("problem,norm", _params(), ids=[f"{i}-{n}" for i, p in zip(IDS, ALL) for n in p.norms])
def test_smoothness_attained_at_witness(problem, norm):
    witness = problem.smoothness_witness(norm)
    if witness is None:
        assert not problem.smoothness_exact(norm)
        pytest.skip("L is an upper bound here; see test_bounded_constants_are_not_vacuous")
    x, v = witness
    assert float(primal(v.unsqueeze(0), norm)[0]) == pytest.approx(1.0)
    lip = problem.smoothness(norm)
    h = hessian(problem, x)
    assert float(dual((h @ v.reshape(-1)).reshape(1, *problem.shape), norm)[0]) == pytest.approx(lip, rel=1e-9)
    # The difference quotient along the witness direction approaches L as the step shrinks.
    step = 1e-5
    diff = problem.grad((x + step * v).unsqueeze(0)) - problem.grad(x.unsqueeze(0))
    assert float(dual(diff, norm)[0]) / step == pytest.approx(lip, rel=1e-4)


def _small_params():
    return [(p, n) for p in small_instances() for n in p.norms]


@pytest.mark.parametrize(
    "problem,norm", _small_params(), ids=[f"{p.name}{list(p.shape)}-{n}" for p, n in _small_params()]
)
def test_hessian_operator_norm_bounded_by_L(problem, norm):
    """sup_{||v|| <= 1} ||H(x) v||_* <= L at random points, computed exactly or from below.

    l2: the largest |eigenvalue|. sign: brute force over all sign vectors (exact).
    spectral: a convex function's max over the operator-norm ball is at a partial isometry;
    random ones plus those from the SVD of H's top eigenvectors give a lower estimate.
    """
    lip = problem.smoothness(norm)
    d = math.prod(problem.shape)
    gen = torch.Generator().manual_seed(4)
    if norm == "sign":
        signs = torch.tensor(list(itertools.product((-1.0, 1.0), repeat=d)), dtype=F64)
    for x in random_points(problem, 4, seed=5):
        h = hessian(problem, x)
        if norm == "l2":
            value = float(torch.linalg.eigvalsh(h).abs().max())
        elif norm == "sign":
            value = float((signs @ h.T).abs().sum(dim=1).max())
        else:
            q, _ = torch.linalg.qr(torch.randn(256, max(problem.shape), min(problem.shape), generator=gen, dtype=F64))
            v = q if problem.shape[0] >= problem.shape[1] else q.mT
            hv = (v.reshape(256, d) @ h.T).reshape(256, *problem.shape)
            value = float(dual(hv, "spectral").max())
        assert value <= lip * (1 + 1e-9)


def test_bounded_constants_are_not_vacuous():
    """Where L is only an upper bound, a lower estimate at x* comes within the stated factor."""
    p = MatrixSensing()
    h = hessian(p, p.x_star)
    gen = torch.Generator().manual_seed(6)
    q, _ = torch.linalg.qr(torch.randn(512, 8, 6, generator=gen, dtype=F64))
    spectral = float(dual((q.reshape(512, -1) @ h.T).reshape(512, 8, 6), "spectral").max())
    s = torch.randint(0, 2, (512, 48), generator=gen).to(F64) * 2 - 1
    sign = float((s @ h.T).abs().sum(dim=1).max())
    # Loose by about (1 + sqrt(D/N))^2 = 1.7 for D = 48, N = 512 (class docstring).
    slack = (1 + math.sqrt(48 / 512)) ** 2
    for lower, norm in ((spectral, "spectral"), (sign, "sign")):
        assert lower <= p.smoothness(norm)
        assert lower >= p.smoothness(norm) / slack


@pytest.mark.parametrize("problem", ALL, ids=IDS)
def test_rho_is_the_tight_dual_to_euclidean_ratio(problem):
    gen = torch.Generator().manual_seed(7)
    v = torch.randn(500, *problem.shape, generator=gen, dtype=F64)
    for norm in problem.norms:
        ratio = dual(v, norm) / v.reshape(500, -1).norm(dim=1)
        assert float(ratio.max()) <= problem.rho(norm) * (1 + 1e-12)
        tight = problem.smoothness_witness("l2")[1] if norm == "l2" else torch.ones(problem.shape, dtype=F64)
        if norm == "spectral":
            tight = torch.eye(*problem.shape, dtype=F64)
        got = float(dual(tight.unsqueeze(0), norm)[0] / tight.norm())
        assert got == pytest.approx(problem.rho(norm))


@pytest.mark.parametrize("problem", [p for p in ALL if getattr(p, "batch", None) is None], ids=lambda p: p.name)
def test_gaussian_oracle_is_unbiased_with_exact_sigma(problem):
    s = 4000
    x = problem.initial_point(s)
    noise = problem.sample_grad(x, torch.Generator().manual_seed(8)) - problem.grad(x)
    sq = noise.reshape(s, -1).pow(2).sum(dim=1)
    se = float(sq.std()) / math.sqrt(s)
    assert abs(float(sq.mean()) - problem.sigma**2) < 4 * se
    mean_err = noise.mean(dim=0).norm()
    assert float(mean_err) < 4 * problem.sigma / math.sqrt(s)


@pytest.mark.parametrize(
    "problem", [p for p in ALL if getattr(p, "batch", None) is not None], ids=lambda p: f"{p.name}{list(p.shape)}"
)
def test_minibatch_oracle_variance_is_below_sigma(problem):
    """Exact minibatch variance (1/B)(mean_j ||g_j||^2 - ||grad||^2) <= sigma^2, and Monte Carlo agrees."""
    s = 4000
    for x in random_points(problem, 2, seed=9, scale=1.0):
        flat = problem.flat
        r = flat @ x.reshape(-1) - problem.targets
        per_sample = (2 * r / (1 + r * r)).unsqueeze(1) * flat
        full = per_sample.mean(dim=0)
        exact = float((per_sample.pow(2).sum(dim=1).mean() - full.pow(2).sum()) / problem.batch)
        assert exact <= problem.sigma**2
        xs = x.expand(s, *problem.shape)
        noise = problem.sample_grad(xs, torch.Generator().manual_seed(10)).reshape(s, -1) - full
        sq = noise.pow(2).sum(dim=1)
        assert abs(float(sq.mean()) - exact) < 4 * float(sq.std()) / math.sqrt(s)
        assert float(noise.mean(dim=0).norm()) < 4 * math.sqrt(exact / s) * 2


def test_runs_advance_as_one_batch():
    """A batch of S points gives the same values as S separate calls."""
    for p in ALL:
        x = random_points(p, 3, seed=11)
        one_by_one = torch.cat([p.grad(x[i : i + 1]) for i in range(len(x))])
        torch.testing.assert_close(p.grad(x), one_by_one, rtol=1e-12, atol=1e-14)


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match="unknown problem"):
        make_problem("nope")
    with pytest.raises(ValueError, match="no known constant"):
        make_problem("cauchy").smoothness("spectral")
    with pytest.raises(ValueError, match="seeds"):
        make_problem("cauchy").initial_point(0)
    with pytest.raises(ValueError, match="d <= 20"):
        CauchyRegression(d=30)
    with pytest.raises(ValueError, match="batch"):
        CauchyRegression(batch=0)
    with pytest.raises(ValueError, match="distance"):
        MatrixSensing(distance=0.0)
