"""Every optimizer and wrapper of ours behaves as a ``torch.optim.Optimizer`` (as optax keeps one
suite for all its optimizers): LR schedulers, add_param_group, state_dict in mid-run, step
hooks, zero_grad both ways."""

import contextlib
import io

import numpy as np
import pytest
import torch
from torch.optim import lr_scheduler as lrs

from delaylab.optim import OPTIMIZERS, CombinedOptimizer, Delayed, LMOMomentum, build_optimizer
from delaylab.errors import ConfigError
from delaylab.optim.corrections import build
from delaylab.optim.queue import DelayDistribution


def _delayed(tau, correction):
    return lambda ps: Delayed(torch.optim.AdamW(ps, lr=1e-2), tau, correction)


SUBJECTS = {
    **{name: (lambda name: lambda ps: build_optimizer(name, ps))(name) for name in OPTIMIZERS},
    **{f"delayed{t}-{c}": _delayed(t, c) for t in (0, 1, 2) for c in ("none", "ef", "dc-asgd")},
    "delayed1-ef-muon": lambda ps: Delayed(build_optimizer("muon", ps), 1, "ef"),
    "delayed1-ef-rotated-adam": lambda ps: Delayed(build_optimizer("rotated-adam", ps), 1, "ef"),
    "delayed1-predict-momentum": lambda ps: Delayed(torch.optim.AdamW(ps, lr=1e-2), 1, "predict-momentum"),
    # a staleness threshold under a random delay: some calls discard their gradient
    "uniform-drop": lambda ps: Delayed(torch.optim.AdamW(ps, lr=1e-2), DelayDistribution.parse("uniform:0-3", 1),
                                       "drop:1"),
    "uniform-drop-muon": lambda ps: Delayed(build_optimizer("muon", ps), DelayDistribution.parse("uniform:0-3", 2),
                                            "drop:2"),
    "delayed2-sgd-dc": lambda ps: Delayed(torch.optim.SGD(ps, lr=0.05, momentum=0.9), 2, "dc-asgd"),
    "combined": lambda ps: CombinedOptimizer(
        [torch.optim.SGD(ps[:1], lr=0.05, momentum=0.9), torch.optim.AdamW(ps[1:], lr=1e-2)]
    ),
    "lmo-momentum": lambda ps: LMOMomentum(ps, lr=0.02, nesterov=True, weight_decay=0.01),
}
# The same optimizers without the wrapper, for the scheduler comparison.
BARE = {
    **{f"delayed{t}-{c}": lambda ps: torch.optim.AdamW(ps, lr=1e-2) for t in (0, 1, 2) for c in ("none", "ef", "dc-asgd")},
    "delayed1-ef-muon": lambda ps: build_optimizer("muon", ps),
    "delayed1-ef-rotated-adam": lambda ps: build_optimizer("rotated-adam", ps),
    "delayed2-sgd-dc": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
}


def _params(seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 3, generator=gen, dtype=dtype).requires_grad_(),
            torch.randn(3, generator=gen, dtype=dtype).requires_grad_()]


def _backward(params, c):
    """A smooth nonconvex loss; batch ``c`` changes with the call."""
    gen = torch.Generator().manual_seed(100 + c)
    w, b, *extra = params
    x = torch.randn(5, 4, generator=gen, dtype=w.dtype)
    loss = ((x @ w + b).tanh() ** 2).sum()
    for p in extra:
        loss = loss + (torch.sin(p) * torch.randn(p.shape, generator=gen, dtype=p.dtype)).sum() + 0.5 * (p**2).sum()
    loss.backward()


def _taking(opt):
    """Where the gradient is taken: a wrapper's gradient point (a delay distribution needs it)."""
    return opt.predicted_weights() if isinstance(opt, Delayed) else contextlib.nullcontext()


def _run(opt, params, calls, start=0, set_to_none=True):
    for c in range(start, start + calls):
        with _taking(opt):
            _backward(params, c)
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)


def _combined_inside(opt):
    while isinstance(opt, Delayed):
        opt = opt.inner
    return isinstance(opt, CombinedOptimizer)


# -- (a) LR schedulers ---------------------------------------------------------------------------
def _cycles_momentum(opt):
    return "momentum" in opt.defaults or "betas" in opt.defaults


SCHEDULERS = {
    "LambdaLR": lambda o: lrs.LambdaLR(o, lambda s: 0.9**s),
    "MultiplicativeLR": lambda o: lrs.MultiplicativeLR(o, lambda s: 0.95),
    "StepLR": lambda o: lrs.StepLR(o, step_size=2, gamma=0.5),
    "MultiStepLR": lambda o: lrs.MultiStepLR(o, milestones=[2, 4], gamma=0.3),
    "ConstantLR": lambda o: lrs.ConstantLR(o, factor=0.5, total_iters=3),
    "LinearLR": lambda o: lrs.LinearLR(o, start_factor=0.25, total_iters=4),
    "ExponentialLR": lambda o: lrs.ExponentialLR(o, gamma=0.8),
    "PolynomialLR": lambda o: lrs.PolynomialLR(o, total_iters=5, power=2.0),
    "CosineAnnealingLR": lambda o: lrs.CosineAnnealingLR(o, T_max=5),
    "CosineAnnealingWarmRestarts": lambda o: lrs.CosineAnnealingWarmRestarts(o, T_0=3),
    "CyclicLR": lambda o: lrs.CyclicLR(o, base_lr=1e-4, max_lr=1e-2, step_size_up=2, cycle_momentum=False),
    "OneCycleLR": lambda o: lrs.OneCycleLR(o, max_lr=1e-2, total_steps=10, cycle_momentum=_cycles_momentum(o)),
    "SequentialLR": lambda o: lrs.SequentialLR(
        o, [lrs.LinearLR(o, start_factor=0.5, total_iters=2), lrs.ExponentialLR(o, gamma=0.7)], milestones=[3]
    ),
    "ChainedScheduler": lambda o: lrs.ChainedScheduler(
        [lrs.ConstantLR(o, factor=0.5, total_iters=2), lrs.ExponentialLR(o, gamma=0.9)]
    ),
    "ReduceLROnPlateau": lambda o: lrs.ReduceLROnPlateau(o, patience=0, factor=0.5),
}
METRICS = [1.0, 1.0, 0.5, 0.5, 0.5, 0.2, 0.3, 0.3]
CYCLED = ("lr", "momentum", "betas")


def _schedule(opt, feed, name):
    """Drive ``opt`` with scheduler ``name`` for 8 calls; the cycled hyperparameters per call."""
    sched = SCHEDULERS[name](opt)
    seen = []
    for c, metric in enumerate(METRICS):
        with _taking(opt):
            feed(c)
        opt.step()
        opt.zero_grad()
        sched.step(metric) if name == "ReduceLROnPlateau" else sched.step()
        seen.append([{k: g[k] for k in CYCLED if k in g} for g in opt.param_groups])
    return seen


@pytest.mark.parametrize("sched", SCHEDULERS)
@pytest.mark.parametrize("subject", SUBJECTS)
def test_schedulers_give_the_lr_sequence_of_a_plain_optimizer(subject, sched):
    params = _params()
    opt = SUBJECTS[subject](params)
    assert isinstance(opt, torch.optim.Optimizer)
    initial = [g["lr"] for g in opt.param_groups]
    got = _schedule(opt, lambda c: _backward(params, c), sched)
    # The lr sequence is the scheduler's: the same as on a torch SGD with the same group lrs.
    ref_params = [torch.zeros(1, requires_grad=True) for _ in opt.param_groups]
    ref = torch.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(ref_params, initial)], momentum=0.9)
    ref.defaults = {k: v for k, v in ref.defaults.items() if k != "momentum" or _cycles_momentum(opt)}
    expected = _schedule(ref, lambda c: [setattr(p, "grad", torch.ones(1)) for p in ref_params], sched)
    assert [[g["lr"] for g in call] for call in got] == [[g["lr"] for g in call] for call in expected]
    if subject in BARE:  # a wrapper: every cycled hyperparameter as on the bare inner optimizer
        bare_params = _params()
        assert got == _schedule(BARE[subject](bare_params), lambda c: _backward(bare_params, c), sched)


def test_wrappers_expose_the_inner_defaults():
    inner = torch.optim.AdamW(_params(), lr=1e-2)
    assert Delayed(inner, 1).defaults is inner.defaults
    combined = SUBJECTS["combined"](_params())
    assert "momentum" not in combined.defaults and "lr" in combined.defaults  # not every child has it


# -- (b) add_param_group ------------------------------------------------------------------------
@pytest.mark.parametrize("subject", SUBJECTS)
def test_add_param_group_after_construction(subject):
    params = _params()
    opt = SUBJECTS[subject](params)
    _run(opt, params, 2)
    z = torch.randn(4, 3, generator=torch.Generator().manual_seed(5)).requires_grad_()
    z0 = z.detach().clone()
    group = {"params": [z], "optimizer": 0} if _combined_inside(opt) else {"params": [z]}
    if getattr(opt, "dist", None) is not None:  # every group follows one draw per call: refused mid-run
        with pytest.raises(ConfigError, match="before the first step"):
            opt.add_param_group(group)
        return
    opt.add_param_group(group)
    assert any(p is z for g in opt.param_groups for p in g["params"])
    _run(opt, params + [z], 4, start=2)
    assert not torch.equal(z.detach(), z0)
    state = opt.state_dict()  # and the larger optimizer saves
    assert state


def test_combined_add_param_group_needs_the_child():
    params = _params()
    opt = SUBJECTS["combined"](params)
    with pytest.raises(ValueError, match="'optimizer'"):
        opt.add_param_group({"params": [torch.zeros(2, requires_grad=True)]})


D, LR, LAM = 3, 0.1, 0.5
A = np.array([[2.0, 0.5, 0.0], [0.5, 1.5, 0.2], [0.0, 0.2, 1.0]])
B = np.random.default_rng(1).standard_normal((32, D))
Y0 = np.array([1.0, -2.0, 0.5])


@pytest.mark.parametrize("correction", ["none", "ef", "dc-asgd"])
@pytest.mark.parametrize("tau", [0, 1, 2])
def test_added_group_follows_the_delay_recursion(tau, correction):
    """A group added after 3 calls: y_{k+1} = y_k - u_k with u_k from the gradient at
    y_{max(0, k - tau)}, its own fill, and the wrapper's correction; checked by hand."""
    x = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    opt = Delayed(torch.optim.SGD([x], lr=LR), tau, build(correction, dc_lambda=LAM))
    for _ in range(3):
        x.grad = torch.ones(2, dtype=torch.float64)
        opt.step()
    y = torch.tensor(Y0, requires_grad=True)
    opt.add_param_group({"params": [y]})
    calls, out = 12, []
    for c in range(calls):
        x.grad = torch.ones(2, dtype=torch.float64)
        y.grad = torch.tensor(A @ y.detach().numpy() - B[c])
        opt.step()
        out.append(y.detach().numpy().copy())
    hist, u_prev = [Y0], np.zeros(D)
    for k in range(calls - tau):
        stale = hist[max(0, k - tau)]
        g = A @ stale - B[k]
        if correction == "dc-asgd":
            g = g + LAM * g * g * (hist[k] - stale)
        u = LR * g
        if correction == "ef":
            hist.append(hist[k] - (tau + 1) * u + tau * u_prev)
        else:
            hist.append(hist[k] - u)
        u_prev = u
    np.testing.assert_allclose(np.array(out), np.array([Y0] * tau + hist[1:]), rtol=0, atol=1e-13)
    assert opt.group_updates[-1] == calls - tau


def test_added_group_takes_an_explicit_delay():
    x, y = (torch.zeros(2, requires_grad=True) for _ in range(2))
    opt = Delayed(torch.optim.SGD([{"params": [x]}, {"params": [torch.zeros(1, requires_grad=True)]}], lr=0.1), [0, 2])
    with pytest.raises(ValueError, match="pass delay="):
        opt.add_param_group({"params": [y]})
    opt.add_param_group({"params": [y]}, delay=1)
    assert opt.delays == [0, 2, 1] and opt.ef_lags == [0, 2, 1]
    g = y.grad = torch.ones(2)
    x.grad = torch.ones(2)
    opt.step()  # x updates, y's queue fills: y's gradient is queued (a copy), left in place, not applied
    assert opt.group_updates[2] == 0 and y.grad is g and not y.any() and torch.equal(x, torch.full((2,), -0.1))


# -- (c) state_dict in mid-queue ----------------------------------------------------------------
@pytest.mark.parametrize("subject", SUBJECTS)
def test_state_dict_round_trips_in_mid_run(subject):
    params = _params()
    opt = SUBJECTS[subject](params)
    _run(opt, params, 3)
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=False)
    if isinstance(opt, Delayed):  # really in the middle: a queue, an EF buffer
        held = {key for st in saved["delayed"]["buffers"].values() for key in st}
        assert ("queue" in held) == (opt.delays[0] > 0)
        assert ("ef_buffer" in held) == (opt.correction == "ef" and opt.delays[0] > 0)
    copy = [p.detach().clone().requires_grad_() for p in params]
    fresh = SUBJECTS[subject](copy)
    fresh.load_state_dict(saved)
    _run(opt, params, 4, start=3)
    _run(fresh, copy, 4, start=3)
    for a, b in zip(params, copy):
        assert torch.equal(a, b)


# -- (d) step hooks ------------------------------------------------------------------------------
@pytest.mark.parametrize("subject", SUBJECTS)
def test_step_hooks_fire_once_per_step(subject):
    params = _params()
    opt = SUBJECTS[subject](params)
    fired = []
    opt.register_step_pre_hook(lambda o, args, kwargs: fired.append("pre"))
    opt.register_step_post_hook(lambda o, args, kwargs: fired.append("post"))
    _run(opt, params, 4)
    assert fired == ["pre", "post"] * 4


# -- (e) zero_grad -------------------------------------------------------------------------------
@pytest.mark.parametrize("subject", SUBJECTS)
def test_zero_grad_both_ways(subject):
    runs = {}
    for set_to_none in (True, False):
        params = _params()
        opt = SUBJECTS[subject](params)
        _run(opt, params, 5, set_to_none=set_to_none)
        if set_to_none:
            assert all(p.grad is None for p in params)
        else:
            assert any(p.grad is not None for p in params) or isinstance(opt, Delayed)
            assert all(p.grad is None or not p.grad.any() for p in params)
        runs[set_to_none] = params
    for a, b in zip(runs[True], runs[False]):
        assert torch.equal(a, b)
