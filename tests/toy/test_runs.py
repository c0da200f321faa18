"""delaylab.toy.runs against hand-written delayed recursions (no delaylab.optim inside).

The reference loops below write out the PipeDream-2BW semantics by hand: call c computes a
stochastic gradient at the current weights; update k uses the gradient of call k (taken at
x_{max(0, k - tau)}); EF with lag l steps x + (l+1) s_k - l s_{k-1}. The runner must measure
exactly the T iterates x_0 .. x_{T-1} of that sequence.
"""

import math

import pytest
import torch

from delaylab.toy.problems import LogDet, SeparableCauchy, make_problem
from delaylab.toy.runs import METHODS, run, sgdm_lr

F64 = torch.float64


def sign_step(m):
    return -torch.sign(m)


def l2_step(m):
    return -m / m.reshape(m.shape[0], -1).norm(dim=1).reshape(-1, *[1] * (m.ndim - 1))


def spectral_step(m):
    u, _, vh = torch.linalg.svd(m, full_matrices=False)
    return -(u @ vh)


def reference(problem, *, step_fn, lr, beta, steps, seeds, seed, taus, ef=False, sgdm=False):
    """Hand-written delayed momentum method; returns the iterates x_0 .. x_T, shape (T+1, S, ...)."""
    gen = torch.Generator().manual_seed(seed)
    blocks = len(taus)
    split = lambda t: list(torch.tensor_split(t, blocks, dim=1))  # noqa: E731
    x = split(problem.initial_point(seeds))
    history = [[b.clone()] for b in x]
    queues = [[] for _ in range(blocks)]
    moms = [None] * blocks
    prev_steps = [torch.zeros_like(b) for b in x]
    while min(len(h) for h in history) <= steps:
        g = split(problem.sample_grad(torch.cat(x, dim=1), gen))
        for i in range(blocks):
            if len(history[i]) > steps:  # this block has made its T updates
                continue
            queues[i].append(g[i])
            if len(queues[i]) <= taus[i]:
                continue
            gi = queues[i].pop(0)
            # EMA momentum from m_{-1} = 0, for both (SGD-M steps -eta m, the LMO methods eta LMO(m)).
            moms[i] = (1 - beta) * gi if moms[i] is None else beta * moms[i] + (1 - beta) * gi
            s = -lr * moms[i] if sgdm else lr * step_fn(moms[i])
            if ef:
                lag = taus[i]
                x[i] = x[i] + (lag + 1) * s - lag * prev_steps[i]
                prev_steps[i] = s
            else:
                x[i] = x[i] + s
            history[i].append(x[i].clone())
    return torch.stack([torch.cat([h[t] for h in history], dim=1) for t in range(steps + 1)])


CASES = [
    # problem, method, step_fn, taus, ef
    (SeparableCauchy(d=8), "lmo-sign", sign_step, [0], False),
    (SeparableCauchy(d=8), "lmo-sign", sign_step, [1], False),
    (SeparableCauchy(d=8), "lmo-sign", sign_step, [3], False),
    (SeparableCauchy(d=8), "lmo-sign", sign_step, [1], True),
    (SeparableCauchy(d=8), "lmo-l2", l2_step, [2], True),
    (SeparableCauchy(d=8), "lmo-sign", sign_step, [0, 2, 1], False),
    (LogDet(m=5, n=3), "lmo-spectral", spectral_step, [1], False),
    (LogDet(m=5, n=3), "lmo-spectral", spectral_step, [1], True),
    (make_problem("cauchy-regression", d=5, samples=30, batch=2), "lmo-l2", l2_step, [1], False),
    (SeparableCauchy(d=8), "sgdm", None, [1], False),
    (SeparableCauchy(d=8), "sgdm", None, [2, 0], False),
]


@pytest.mark.parametrize("problem,method,step_fn,taus,ef", CASES, ids=[f"{c[0].name}-{c[1]}-{c[3]}-{'ef' if c[4] else 'plain'}" for c in CASES])
def test_runner_measures_the_hand_written_delayed_sequence(problem, method, step_fn, taus, ef):
    steps, seeds, lr, beta = 25, 3, 0.05, 0.8
    xs = reference(
        problem, step_fn=step_fn, lr=lr, beta=beta, steps=steps, seeds=seeds, seed=5, taus=taus, ef=ef,
        sgdm=method == "sgdm",
    )
    norm = METHODS[method].measure_norm
    delay = taus[0] if len(taus) == 1 else taus
    torch_lr = sgdm_lr(lr, beta) if method == "sgdm" else lr
    traj = run(problem, method, lr=torch_lr, beta=beta, steps=steps, seeds=seeds, seed=5, delay=delay,
               correction="ef" if ef else "none", directions=True)
    flat = xs[:steps].reshape(steps * seeds, *problem.shape)
    g = problem.grad(flat).reshape(steps, seeds, -1)
    if norm == "spectral":
        want = torch.linalg.svdvals(problem.grad(flat)).sum(-1).reshape(steps, seeds)
    elif norm == "sign":
        want = g.abs().sum(-1)
    else:
        want = g.norm(dim=-1)
    torch.testing.assert_close(traj.grad_norm[norm], want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(traj.value, problem.value(flat).reshape(steps, seeds), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(traj.final_value, problem.value(xs[steps]), rtol=1e-10, atol=1e-12)
    if traj.direction_change is not None:
        # D_t read back from the iterates is a unit vector of the LMO norm (or a difference of two).
        assert float(traj.direction_change[0].sub(1.0).abs().max()) < 1e-9  # ||D_0 - 0|| = 1
        assert float(traj.direction_change.max()) <= 2.0 + 1e-9


def test_delay_zero_is_sync_and_delay_changes_the_run():
    p = SeparableCauchy(d=8, start=0.5)  # near 0, where noise flips signs
    kw = dict(lr=0.05, beta=0.5, steps=30, seeds=2, seed=1)
    sync = run(p, "lmo-sign", **kw)
    again = run(p, "lmo-sign", **kw, delay=0, correction="ef")  # EF with lag 0 is a no-op
    delayed = run(p, "lmo-sign", **kw, delay=1)
    assert torch.equal(sync.value, again.value)
    assert not torch.allclose(sync.value, delayed.value)
    # The first two iterates agree: update 0 uses the gradient at x_0 in both.
    torch.testing.assert_close(sync.value[:2], delayed.value[:2])


def test_gradient_points_and_drift_helpers():
    p = SeparableCauchy(d=8, start=0.5)
    traj = run(p, "lmo-sign", lr=0.05, beta=0.5, steps=12, seeds=2, delay=2, correction="ef")
    pts = traj.at_gradient_points("sign", 2)
    torch.testing.assert_close(pts[:3], traj.grad_norm["sign"][[0, 0, 0]])
    torch.testing.assert_close(pts[3:], traj.grad_norm["sign"][1:-2])
    # sign directions are +-1 vectors: every change is 0 or 2 in l_inf, the first one is 1.
    ch = traj.direction_change
    assert torch.all((ch[1:] < 1e-9) | (ch[1:].sub(2).abs() < 1e-9))
    torch.testing.assert_close(traj.delta_bar(), ch.mean(0))


def test_lmo_steps_have_norm_exactly_lr():
    """x_{t+1} - x_t = lr LMO(m_t): the step norm is lr, which is what the bounds rest on."""
    p = LogDet(m=6, n=4)
    traj = run(p, "lmo-spectral", lr=0.03, beta=0.9, steps=40, seeds=2, delay=1, directions=True)
    # direction_change records ||D_t - D_{t-1}|| with D_{-1} = 0, so its first entry is ||D_0||.
    assert float(traj.direction_change[0].sub(1).abs().max()) < 1e-12


def test_seeds_are_independent_runs_of_the_same_problem():
    p = SeparableCauchy(d=4)
    traj = run(p, "lmo-l2", lr=0.05, beta=0.9, steps=20, seeds=4)
    assert torch.all(traj.value[0] == traj.value[0, 0])  # same start
    assert len(set(traj.final_value.tolist())) == 4  # different noise


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(method="nope"), "unknown method"),
        (dict(method="lmo-spectral"), "no known constant"),
        (dict(steps=0), "steps"),
        (dict(seeds=0), "seeds"),
        (dict(lr=-1.0), "lr"),
        (dict(beta=1.0), "beta"),
        (dict(delay=[0] * 9), "delay blocks"),
    ],
)
def test_bad_input_raises_value_error(kw, match):
    args = dict(method="lmo-sign", lr=0.1, beta=0.5, steps=5, seeds=2)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        run(SeparableCauchy(d=8), **args)


def test_all_methods_run_in_all_modes():
    p = LogDet(m=4, n=3)
    for method in METHODS:
        for delay, corr in ((0, "none"), (2, "none"), (1, "ef"), (1, "dc-asgd"), ([1, 0], "none")):
            traj = run(p, method, lr=0.01, beta=0.9, steps=8, seeds=2, delay=delay, correction=corr)
            assert traj.value.shape == (8, 2)
            assert math.isfinite(float(traj.grad_norm[METHODS[method].measure_norm].sum()))
            assert float(traj.final_value.mean()) < float(traj.value[0].mean())
