"""Check a bound's assumptions on your own model: the worked example of docs/assumptions.md.

A 4-tensor MLP of one's own, trained with SGD and momentum; the constants of Theorem 4 (delayed
SGD with momentum: Euclidean L and sigma, Delta) estimated on its trajectory, with each estimate's
side; the bound evaluated at each estimate of L against the measured mean squared gradient norm;
and what happens when the constants are in the wrong norm. Runs in a few seconds on a CPU:

    python docs/examples/check_assumptions.py

Replace ``make_model``, ``loss_fn`` and ``make_batches`` with your own.
"""

from __future__ import annotations

import numpy as np
import torch

from delaylab.theory import assumptions as A
from delaylab.theory import sgdm_bound, tune


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).double()


def loss_fn(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).mean()


def make_batches(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(8, 1, generator=torch.Generator().manual_seed(42), dtype=torch.float64)
    out = []
    for _ in range(n):
        x = torch.randn(32, 8, generator=g, dtype=torch.float64)
        out.append((x, torch.tanh(x @ w) + 0.1 * torch.randn(32, 1, generator=g, dtype=torch.float64)))
    return out


def main() -> dict:
    model = make_model()
    lr, beta, T = 0.02, 0.5, 60
    train = make_batches(T, seed=1)  # one fresh batch per update
    held = make_batches(8, seed=2)   # f: the mean loss on these; sigma: one of them against the rest
    obj = A.TorchObjective(model, loss_fn, held)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=beta)
    points, losses = [], []
    for batch in train:
        points.append(obj.point())
        losses.append(obj.loss(points[-1]))
        opt.zero_grad()
        loss_fn(model, batch).backward()
        opt.step()
    trained = [p.detach().clone() for p in model.parameters()]

    # Theorem 4 needs Euclidean constants: all parameters as one vector.
    est = A.estimate_constants(obj.grad, points, "euclidean", obj.shapes, stoch_grad=obj.stoch_grad, n_samples=8,
                               losses=losses, f_lower=0.0, hvp=obj.hvp, curvature_points=points[::20],
                               sigma_points=points[::20], iters=30)
    for name in ("L_secant", "L_curvature", "sigma", "Delta"):
        e = est["estimates"][name]
        print(f"{name:12s} {e.value:9.4g}  ({e.kind}; {e.sampling})")
    per_tensor = A.estimate_constants(obj.grad, points, "l2", obj.shapes, hvp=obj.hvp,
                                      curvature_points=points[::20], iters=30)
    print(f"per-tensor l2 L: secant {per_tensor['L']['secant']:.4g}, curvature {per_tensor['L']['curvature']:.4g} "
          f"(another norm, another constant)")

    # The bound of this very run (torch SGD with momentum beta is EMA momentum with eta = lr / (1 - beta)),
    # at each estimate of L, against the mean squared gradient norm measured along it.
    measured = float(np.mean([A.dual_norm(obj.grad(p), "euclidean") ** 2 for p in points]))
    at = A.evaluate_at_each_L(sgdm_bound(0), est, T=T, eta=lr / (1 - beta), beta=beta)
    for name, ev in at.items():
        shown = f"{ev.value:.4g}" if ev.valid else "none (the step is beyond the bound's cap at this L)"
        print(f"bound at the {name} L = {est['L'][name]:.4g}: {shown}")
    print(f"measured mean ||grad f||^2 = {measured:.4g}")

    # Constants in the wrong norm are refused, in one line.
    try:
        tune(sgdm_bound(0), T, dict(per_tensor["constants"], sigma=1.0, Delta=1.0))
    except ValueError as err:
        print(f"refused: {err}")
    tuned = tune(sgdm_bound(0), T, est["constants"])
    print(f"tuned for this model at T = {T}: eta {tuned.eta:.4g} (lr {tuned.eta * (1 - tuned.beta):.4g}), "
          f"bound {tuned.value:.4g}")

    # Estimation left the model as the user had it.
    assert all(torch.equal(p.detach(), w) for p, w in zip(model.parameters(), trained))
    print("weights after estimation: unchanged")
    return {"estimated": est, "per_tensor": per_tensor, "measured": measured, "bound_at": at, "tuned": tuned}


if __name__ == "__main__":
    main()
