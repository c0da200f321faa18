"""The estimators of L (delaylab.theory.assumptions) against the toy problems' exact constants.

For each problem of :mod:`delaylab.toy.problems` (the rate suite and the quadratic) and each norm
whose L is known, both estimates of L are taken on the same points: the straight path from the
start x0 to the point where the Hessian attains L (the problem's witness; for matrix sensing in
the spectral and sign norms, whose L is only an upper bound, the l2 witness), 8 points with both
ends. The secant estimate reads the 7 consecutive pairs and one random perturbation of radius
1e-3 at each point; the curvature estimate runs the power iteration at each point. Both are
lower estimates, so each ratio estimate / truth is at most 1 where the truth is exact; how far
below 1 it is, is what the table shows. ``delaylab theory estimators`` prints it, and
docs/assumptions.md holds it (tests/theory/test_estimator_table.py recomputes it).

:func:`constant_rows` does the same for the other estimators, per problem: sigma from
``SIGMA_DRAWS`` stochastic gradients (the problem's own oracle) at the path's two ends against the
problem's sigma (exact for the Gaussian oracles, an upper bound for minibatch noise); Delta from the
losses along the path (lower) and with f >= 0 (upper) against f(x0) - inf f; G0 in each norm against
the problem's own (computed by delaylab.optim.lmo, in torch).
"""

from __future__ import annotations

import numpy as np
import torch

from delaylab.theory.assumptions import (estimate_curvature, estimate_delta, estimate_sigma, estimate_smoothness,
                                         gradient_norm)
from delaylab.toy.problems import PROBLEMS, Quadratic, make_problem

PATH_POINTS = 8
ITERS = 100  # power-iteration products per point at most (each stops once it gains less than 1e-7)
# The two-block quadratic f(x) = (1/2) sum_i h_i x_i^2 with blocks h = (1, 2 | 0.5, 3): the one
# problem here with two blocks, where the euclidean norm and the per-block l2 norm differ. H = diag(h)
# everywhere: L is 3 (euclidean: the top eigenvalue), 2 + 3 = 5 (l2 and spectral, whose 1-D blocks are
# l2: the product norm adds the blocks' tops) and 3 + 3.5 = 6.5 (sign: each block's l_inf -> l1 norm).
TWO_BLOCK = (np.array([1.0, 2.0]), np.array([0.5, 3.0]))
TWO_BLOCK_L = {"euclidean": 3.0, "l2": 5.0, "sign": 6.5, "spectral": 5.0}


def _problems():
    return [make_problem(name) for name in sorted(PROBLEMS)] + [Quadratic()]


def _oracles(prob):
    def grad(x):
        return prob.grad(torch.as_tensor(np.asarray(x)).unsqueeze(0))[0].numpy()

    def hvp(x, v):
        x = torch.as_tensor(np.asarray(x)).clone().requires_grad_(True)
        g = prob.grad(x.unsqueeze(0))[0]
        return torch.autograd.grad(g, x, grad_outputs=torch.as_tensor(np.asarray(v)))[0].numpy()

    return grad, hvp


def _path(prob, norm: str) -> list[np.ndarray]:
    witness = prob.smoothness_witness(norm) or prob.smoothness_witness("l2")
    x0, xw = prob.x0.numpy(), witness[0].numpy()
    return [x0 + s * (xw - x0) for s in np.linspace(0.0, 1.0, PATH_POINTS)]


def rows(seed: int = 0) -> list[dict]:
    """One row per (problem, norm): the true L, whether it is exact, and both estimates."""
    out = []
    for prob in _problems():
        grad, hvp = _oracles(prob)
        for norm in prob.norms:
            pts = _path(prob, norm)
            sec = estimate_smoothness(grad, pts, norm, n_perturb=PATH_POINTS, seed=seed)
            cur = estimate_curvature(hvp, pts, norm, iters=ITERS, seed=seed)
            truth = prob.smoothness(norm)
            out.append({"problem": prob.name, "shape": "x".join(map(str, prob.shape)), "norm": norm, "L": truth,
                        "exact": prob.smoothness_exact(norm), "secant": sec.value, "curvature": cur.value})
    return out + _two_block_rows(seed)


def _two_block_rows(seed: int) -> list[dict]:
    """The two-block quadratic on the points 0 and (1, 0 | 0, 1), the example of docs/assumptions.md."""
    def grad(x):
        return [h * b for h, b in zip(TWO_BLOCK, x)]

    def hvp(x, v):
        return [h * b for h, b in zip(TWO_BLOCK, v)]

    pts = [[np.zeros(2), np.zeros(2)], [np.array([1.0, 0.0]), np.array([0.0, 1.0])]]
    out = []
    for norm, truth in TWO_BLOCK_L.items():
        sec = estimate_smoothness(grad, pts, norm, n_perturb=PATH_POINTS, seed=seed)
        cur = estimate_curvature(hvp, pts, norm, iters=ITERS, seed=seed)
        out.append({"problem": "two-block quadratic", "shape": "2+2", "norm": norm, "L": truth, "exact": True,
                    "secant": sec.value, "curvature": cur.value})
    return out


SIGMA_DRAWS = 64


def constant_rows(seed: int = 0) -> list[dict]:
    """One row per problem: sigma, Delta and G0 estimated on the path of :func:`rows`, and their truth."""
    out = []
    for prob in _problems():
        grad, _ = _oracles(prob)
        pts = _path(prob, prob.norms[-1])

        def stoch(x, i):
            gen = torch.Generator().manual_seed(seed * 100003 + i)
            return prob.sample_grad(torch.as_tensor(np.asarray(x)).unsqueeze(0), gen)[0].numpy()

        sig = estimate_sigma(stoch, [pts[0], pts[-1]], SIGMA_DRAWS)
        losses = [float(prob.value(torch.as_tensor(p).unsqueeze(0))[0]) for p in pts]
        delta = estimate_delta(losses, f_lower=0.0)
        exact = {n: prob.constants(n)["G0"] for n in prob.norms}
        g0 = {n: gradient_norm(grad, pts[0], n).value for n in prob.norms}
        out.append({"problem": prob.name, "sigma": prob.sigma, "sigma_exact": getattr(prob, "batch", None) is None,
                    "sigma_estimate": sig.value, "Delta": prob.delta(), "Delta_lower": delta["lower"].value,
                    "Delta_upper": delta["upper"].value, "G0": exact, "G0_estimate": g0})
    return out


def constants_markdown(table: list[dict]) -> str:
    lines = ["| problem | true sigma | sigma estimate | estimate / sigma | true Delta | Delta lower | Delta upper | "
             "largest G0 error |", "|---|---|---|---|---|---|---|---|"]
    for r in table:
        g0 = max(abs(r["G0_estimate"][n] - v) / v for n, v in r["G0"].items())
        lines.append(f"| {r['problem']} | {r['sigma']:.4g}{'' if r['sigma_exact'] else ' (upper bound)'} | "
                     f"{r['sigma_estimate']:.4g} | "
                     f"{'noise-free' if r['sigma'] == 0 else format(r['sigma_estimate'] / r['sigma'], '.3f')} | "
                     f"{r['Delta']:.4g} | "
                     f"{r['Delta_lower']:.4g} | {r['Delta_upper']:.4g} | {g0:.1e} |")
    return "\n".join(lines) + "\n"


def markdown(table: list[dict]) -> str:
    lines = ["| problem | shape | norm | true L | secant | secant / L | curvature | curvature / L |",
             "|---|---|---|---|---|---|---|---|"]
    for r in table:
        truth = f"{r['L']:.4g}" + ("" if r["exact"] else " (upper bound)")
        lines.append(f"| {r['problem']} | {r['shape']} | {r['norm']} | {truth} | "
                     f"{r['secant']:.4g} | {r['secant'] / r['L']:.3f} | {r['curvature']:.4g} | "
                     f"{r['curvature'] / r['L']:.3f} |")
    return "\n".join(lines) + "\n"
