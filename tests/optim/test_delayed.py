"""Delayed against recursions written out by hand, in float64.

Test problem: f_c(x) = x^T A x / 2 - b_c^T x with a coupled (non-diagonal) A and a batch term
b_c that changes with the call index c, so that both the staleness of the weights and the
identity of the batch show up in the iterates.
"""

import copy
import io

import numpy as np
import pytest
import torch

from delaylab.optim import Delayed, build_optimizer
from delaylab.optim.corrections import build
from delaylab.optim.error_feedback import ErrorFeedback

D = 4
A = np.array(
    [[2.0, 0.5, 0.0, 0.3], [0.5, 1.5, 0.2, 0.0], [0.0, 0.2, 1.0, 0.4], [0.3, 0.0, 0.4, 0.8]]
)
B = np.random.default_rng(0).standard_normal((64, D))
X0 = np.array([1.0, -2.0, 0.5, 1.5])
LR = 0.1


def grad(x, c):
    return A @ x - B[c]


def run_wrapper(calls, make, split=None):
    """Drive a Delayed optimizer for `calls` calls on f_c; return the iterate after each call."""
    if split is None:
        x = torch.tensor(X0, requires_grad=True)
        params = [x]
        opt = make([x])
        read = lambda: x.detach().numpy().copy()  # noqa: E731
        def set_grad(c):
            x.grad = torch.tensor(grad(x.detach().numpy(), c))
    else:
        parts = [torch.tensor(X0[s], requires_grad=True) for s in split]
        params = parts
        opt = make([{"params": [p]} for p in parts])
        read = lambda: np.concatenate([p.detach().numpy() for p in parts])  # noqa: E731
        def set_grad(c):
            g = grad(read(), c)
            for p, s in zip(parts, split):
                p.grad = torch.tensor(g[s])
    out = []
    for c in range(calls):
        set_grad(c)
        opt.step()
        opt.zero_grad()
        out.append(read())
    return np.array(out), opt, params


def sgd(delay=1, correction="none", **kw):
    phases = {k: kw.pop(k) for k in ("sync_start", "sync_cooldown", "total_steps") if k in kw}
    return lambda params: Delayed(torch.optim.SGD(params, lr=LR), delay, build(correction, **kw), **phases)


def test_delayed_sgd_is_the_2bw_recursion():
    for tau in (1, 2, 3):
        xs, opt, _ = run_wrapper(20, sgd(tau))
        # hand recursion: x_{k+1} = x_k - lr (A x_{max(0,k-tau)} - b_k), update k at call k+tau
        hist = [X0]
        for k in range(20 - tau):
            hist.append(hist[k] - LR * grad(hist[max(0, k - tau)], k))
        expected = [X0] * tau + hist[1:]
        np.testing.assert_allclose(xs, np.array(expected), rtol=0, atol=1e-13)
        assert opt.num_updates == 20 - tau


def test_fill_calls_report_no_update():
    x = torch.tensor(X0, requires_grad=True)
    opt = Delayed(torch.optim.SGD([x], lr=LR), delay=2)
    flags = []
    for c in range(4):
        before = x.detach().clone()
        g = x.grad = torch.tensor(grad(x.detach().numpy(), c))
        opt.step()
        flags.append(opt.updated)
        if not opt.updated:  # the gradient is queued (a copy) and left in p.grad, not applied
            assert x.grad is g and torch.equal(x, before)
    assert flags == [False, False, True, True]


@pytest.mark.parametrize("tau", [1, 2])
def test_error_feedback_sgd(tau):
    xs, _, _ = run_wrapper(20, sgd(tau, "ef"))
    # x_{k+1} = x_k - (tau+1) u_k + tau u_{k-1},  u_k = lr * g(x_{max(0,k-tau)}; b_k),  u_{-1} = 0
    hist, u_prev = [X0], np.zeros(D)
    for k in range(20 - tau):
        u = LR * grad(hist[max(0, k - tau)], k)
        hist.append(hist[k] - (tau + 1) * u + tau * u_prev)
        u_prev = u
    np.testing.assert_allclose(xs[tau - 1:], np.array(hist), rtol=0, atol=1e-13)


def test_dc_asgd_sgd():
    lam = 0.5
    xs, _, _ = run_wrapper(20, sgd(1, "dc-asgd", dc_lambda=lam))
    hist = [X0]
    for k in range(19):
        stale = hist[max(0, k - 1)]
        g = grad(stale, k)
        hist.append(hist[k] - LR * (g + lam * g * g * (hist[k] - stale)))
    np.testing.assert_allclose(xs[0:], np.array([X0] + hist[1:]), rtol=0, atol=1e-13)


def test_sync_start_then_delay():
    K, tau, calls = 5, 2, 20
    xs, opt, _ = run_wrapper(calls, sgd(tau, sync_start=K))
    hist = [X0]
    for k in range(K):  # undelayed: update k at call k
        hist.append(hist[k] - LR * grad(hist[k], k))
    # then the pipeline restarts: fill of tau calls, x_{K-j} := x_K
    for k in range(K, calls - tau):
        hist.append(hist[k] - LR * grad(hist[max(K, k - tau)], k))
    expected = hist[1:K + 1] + [hist[K]] * tau + hist[K + 1:]
    np.testing.assert_allclose(xs, np.array(expected), rtol=0, atol=1e-13)
    assert opt.num_updates == calls - tau


def test_sync_cooldown_drops_the_queue_and_goes_undelayed():
    T, K, tau = 15, 4, 1
    xs, opt, _ = run_wrapper(T + tau, sgd(tau, sync_cooldown=K, total_steps=T))
    hist = [X0]
    for k in range(T - K):
        hist.append(hist[k] - LR * grad(hist[max(0, k - tau)], k))
    # at the switch the queued batches are dropped: sync update k uses batch k + tau
    for k in range(T - K, T):
        hist.append(hist[k] - LR * grad(hist[k], k + tau))
    np.testing.assert_allclose(xs, np.array([X0] * tau + hist[1:]), rtol=0, atol=1e-13)
    assert opt.num_updates == T


def test_per_group_delays():
    split = [slice(0, 2), slice(2, 4)]
    taus, T = (0, 2), 12
    xs, opt, _ = run_wrapper(T + 2, sgd(list(taus), total_steps=T), split=split)
    # group h's update k uses batch k at the point where group j had made max(0, k - tau_j)
    # updates: y_{k+1} = y_k - lr * [A (y_{k - 0}, z_{k - 2}) - b_k]_y, and the same for z.
    y, z = [X0[:2]], [X0[2:]]
    for k in range(T):
        for g, hist, tau in ((slice(0, 2), y, taus[0]), (slice(2, 4), z, taus[1])):
            point = np.concatenate([y[max(0, k - taus[0])], z[max(0, k - taus[1])]])
            hist.append(hist[k] - LR * grad(point, k)[g])
    # after call c: group y has made min(c+1, T) updates, group z has made max(0, c - 1)
    for c in range(T + 2):
        expected = np.concatenate([y[min(c + 1, T)], z[max(0, c - 1)]])
        np.testing.assert_allclose(xs[c], expected, rtol=0, atol=1e-13)
    assert opt.group_updates == [T, T]


def test_ef_with_lag_on_stale_gradients_equals_delayed_ef():
    """A pipeline stage sees stale gradients already and uses delay=0, ef_lag=1: same iterates."""
    xs, _, _ = run_wrapper(16, sgd(1, "ef"))
    x = torch.tensor(X0, requires_grad=True)
    opt = Delayed(torch.optim.SGD([x], lr=LR), delay=0, corrections=[ErrorFeedback(lag=1)])
    versions = [X0.copy()]
    out = []
    for k in range(15):  # 2BW: batch k runs on V_{k-1}, V_{-1} = V_0
        x.grad = torch.tensor(grad(versions[max(0, k - 1)], k))
        opt.step()
        versions.append(x.detach().numpy().copy())
        out.append(versions[-1])
    np.testing.assert_array_equal(np.array(out), xs[1:])


def test_delay_zero_is_the_inner_optimizer_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(8, 6, generator=gen)
    for name in ("adamw", "muon", "sgd"):
        a, b = w0.clone().requires_grad_(), w0.clone().requires_grad_()
        wrapped = Delayed(build_optimizer(name, [a]), delay=0)
        plain = build_optimizer(name, [b])
        for _ in range(8):
            g = torch.randn(8, 6, generator=gen)
            a.grad, b.grad = g.clone(), g.clone()
            wrapped.step()
            plain.step()
        assert torch.equal(a, b), name


def _record_run(name, steps=12, delay=1, seed=0):
    """Delayed(inner, ef) on a random nonconvex objective; record every iterate and applied grad."""
    gen = torch.Generator().manual_seed(seed)
    target = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    w = torch.randn(6, 5, generator=gen, dtype=torch.float64).requires_grad_()
    opt = Delayed(build_optimizer(name, [w], lr=0.01), delay=delay, corrections="ef")
    iterates, applied = [w.detach().clone()], []
    for _ in range(steps + delay):
        loss = (torch.sin(w) * target).sum() + 0.5 * (w**2).sum()
        loss.backward()
        opt.step()
        if opt.updated:
            applied.append(w.grad.detach().clone())  # the stale gradient that was applied
            iterates.append(w.detach().clone())
        opt.zero_grad()
    return iterates, applied


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_error_feedback_on_adaptive_inners(name):
    """EF = x_k - 2 u_k + u_{k-1} where u_k is what an identical inner optimizer does from x_k
    with the same stale gradient."""
    iterates, applied = _record_run(name)
    z = iterates[0].clone().requires_grad_()
    ref = build_optimizer(name, [z], lr=0.01)
    u_prev = torch.zeros_like(z)
    for k, g in enumerate(applied):
        with torch.no_grad():
            z.copy_(iterates[k])
        z.grad = g.clone()
        ref.step()
        u = iterates[k] - z.detach()
        torch.testing.assert_close(iterates[k + 1], iterates[k] - 2 * u + u_prev, rtol=1e-12, atol=1e-12)
        u_prev = u


def _train(opt_factory, calls, resume_at=None):
    gen = torch.Generator().manual_seed(7)
    data = [torch.randn(16, 5, generator=gen) for _ in range(calls)]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = opt_factory(model)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
    out = []
    for c in range(calls):
        if c == resume_at:
            buf = io.BytesIO()
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}, buf)
            buf.seek(0)
            saved = torch.load(buf, weights_only=False)
            torch.manual_seed(123)  # a fresh model and optimizer in a "new process"
            model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
            model.load_state_dict(saved["model"])
            opt = opt_factory(model)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
            opt.load_state_dict(saved["opt"])
            sched.load_state_dict(saved["sched"])
        loss = (model(data[c]) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if opt.updated:
            sched.step()
        out.append([p.detach().clone() for p in model.parameters()])
    return out, opt


@pytest.mark.parametrize(
    "factory",
    [
        lambda m: Delayed(build_optimizer("adamw", m), delay=1, corrections="ef"),
        lambda m: Delayed(build_optimizer("muon", m), delay=2, corrections="none"),
        lambda m: Delayed(build_optimizer("sgd", m), delay=1, corrections="dc-asgd"),
        lambda m: Delayed(build_optimizer("adamw", m), delay=1, corrections="ef", sync_start=3),
    ],
    ids=["adamw-ef", "muon-delay2", "sgd-dc", "adamw-syncstart"],
)
def test_resume_from_state_dict_is_bit_exact(factory):
    straight, _ = _train(factory, 20)
    resumed, opt = _train(factory, 20, resume_at=7)
    for a, b in zip(straight[-10:], resumed[-10:]):
        for pa, pb in zip(a, b):
            assert torch.equal(pa, pb)
    # the scheduler kept driving the inner's learning rate after load_state_dict
    assert opt.param_groups is opt.inner.param_groups


def test_scheduler_drives_the_inner_learning_rate():
    x = torch.zeros(3, requires_grad=True)
    inner = torch.optim.SGD([x], lr=1.0)
    opt = Delayed(inner, delay=1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5**s)
    for _ in range(3):
        x.grad = torch.ones(3)
        opt.step()
        sched.step()
    assert inner.param_groups[0]["lr"] == pytest.approx(0.125)


def test_ef_holds_one_parameter_sized_buffer():
    w = torch.randn(10, 10, requires_grad=True)
    opt = Delayed(torch.optim.AdamW([w]), delay=1, corrections="ef")
    for _ in range(5):
        w.grad = torch.randn(10, 10)
        opt.step()
    st = opt.state[w]
    assert set(st) == {"queue", "ef_buffer"}
    assert len(st["queue"]) == 1 and st["ef_buffer"].shape == w.shape


def test_deepcopy_keeps_the_wrapper():
    w = torch.zeros(2, requires_grad=True)
    opt = Delayed(torch.optim.SGD([w], lr=0.1), delay=1, corrections="ef")
    clone = copy.deepcopy(opt)
    assert clone.delays == [1] and clone.correction == "ef"


def test_load_rejects_a_different_configuration():
    w = torch.zeros(2, requires_grad=True)
    sd = Delayed(torch.optim.SGD([w], lr=0.1), delay=1).state_dict()
    with pytest.raises(ValueError, match="saved with"):
        Delayed(torch.optim.SGD([w], lr=0.1), delay=2).load_state_dict(sd)


def test_bad_arguments_raise_value_error():
    w = torch.zeros(2, requires_grad=True)
    inner = torch.optim.SGD([w], lr=0.1)
    for kwargs, msg in [
        (dict(delay=-1), "delay"),
        (dict(delay=[1, 2]), "param groups"),
        (dict(corrections="magic"), "unknown correction"),
        (dict(sync_cooldown=3), "total_steps"),
        (dict(sync_start=-2), "sync_start"),
    ]:
        with pytest.raises(ValueError, match=msg):
            Delayed(inner, **kwargs)
    with pytest.raises(ValueError, match="dc_lambda"):  # a corrector checks its own configuration
        Delayed(inner, 1, build("dc-asgd", dc_lambda=-1.0))
    with pytest.raises(ValueError, match="learning rate"):  # the inner's own check
        Delayed(torch.optim.SGD([w], lr=-0.1), delay=1)
    with pytest.raises(TypeError):
        Delayed("adamw")


class _AdamWSubclass(torch.optim.AdamW):
    """A subclass: not on the per-parameter allowlist, so EF takes the whole-model path."""


def _ef_model_run(make_inner, whole_model: bool, calls=9):
    """EF on a small MLP (parameters of several shapes); returns the final parameters and
    whether the per-parameter path ran. An inner with two param groups gets delay 1 (EF) on
    the first and 0 (no EF) on the second; factory-built inners make their own groups."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)
    )
    params = list(model.parameters())
    inner = make_inner(model, [{"params": params[:4]}, {"params": params[4:]}])
    opt = Delayed(inner, delay=[1, 0] if len(inner.param_groups) == 2 else 1, corrections="ef")
    paths = []
    per_param = opt._ef_step_per_param
    def spy(ef_lags):
        paths.append("per-param")
        per_param(ef_lags)
    opt._ef_step_per_param = spy
    if whole_model:
        opt._steps_per_param = lambda ef_lags: False
    gen = torch.Generator().manual_seed(1)
    for _ in range(calls):
        x = torch.randn(5, 6, generator=gen)
        (model(x).sin() ** 2).sum().backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()], paths


@pytest.mark.parametrize(
    "make_inner",
    [
        lambda m, groups: torch.optim.SGD(groups, lr=0.05, momentum=0.9, weight_decay=0.01),
        lambda m, groups: torch.optim.AdamW(groups, lr=0.01, weight_decay=0.1),
        lambda m, groups: torch.optim.Adam(groups, lr=0.01, amsgrad=True),
        lambda m, groups: build_optimizer("lmo", [p for p in m.parameters() if p.ndim == 2], lr=0.02),
        lambda m, groups: build_optimizer("muon", m, lr=0.02),  # torch Muon + AdamW, combined
    ],
    ids=["sgd", "adamw", "adam-amsgrad", "lmo", "muon-combined"],
)
def test_per_parameter_ef_step_equals_the_whole_model_step(make_inner):
    """On the CPU, EF steps these inners one parameter at a time (to keep the snapshot small
    and in cache); the result must be the whole-model step's, bit for bit."""
    fast, paths = _ef_model_run(make_inner, whole_model=False)
    ref, ref_paths = _ef_model_run(make_inner, whole_model=True)
    assert paths and not ref_paths
    for a, b in zip(fast, ref):
        assert torch.equal(a, b)


def test_unknown_or_hooked_optimizers_keep_the_whole_model_step():
    """Optimizers that may share statistics across parameters, or that have step hooks
    (which would fire once per parameter), are stepped as a whole."""
    _, paths = _ef_model_run(lambda m, groups: _AdamWSubclass(groups, lr=0.01), whole_model=False)
    assert not paths

    def hooked(m, groups):
        opt = torch.optim.AdamW(groups, lr=0.01)
        opt.register_step_post_hook(lambda *a: calls.append(1))
        return opt

    calls = []
    _, paths = _ef_model_run(hooked, whole_model=False, calls=4)
    assert not paths and len(calls) == 4  # one inner step per call (group 2 has delay 0)
