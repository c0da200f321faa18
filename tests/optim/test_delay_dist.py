"""Variable delays (``Delayed(inner, DelayDistribution(...))``) against recursions written out by
hand, in float64, on the quadratic of test_delayed.py.

The model: update k uses batch k's gradient taken at x_{max(s, k - tau_k)}, every gradient applied
once, in order. A constant cycle must be the queue-based ``Delayed(delay=tau)`` bit for bit; a
random delay must be the hand recursion with the same tau_k; EF's constant lag must keep the
virtual-iterate identity x_k = w_k - l u_{k-1}; a resume in mid-run must be bit for bit.
"""

import io

import numpy as np
import pytest
import torch

from delaylab.errors import ConfigError
from delaylab.optim import Delayed
from delaylab.optim.queue import DelayDistribution
from delaylab.optim.corrections import build

D = 4
A = np.array([[2.0, 0.5, 0.0, 0.3], [0.5, 1.5, 0.2, 0.0], [0.0, 0.2, 1.0, 0.4], [0.3, 0.0, 0.4, 0.8]])
B = np.random.default_rng(5).standard_normal((128, D))
X0 = np.array([1.0, -2.0, 0.5, 1.5])
LR, TOL = 0.1, 1e-12


def grad(x, c):
    return A @ x - B[c]


def drive(make, calls, queue=False):
    """SGD-like ``make([x])`` driven for ``calls`` calls; the iterate after each update."""
    x = torch.tensor(X0, requires_grad=True)
    opt = make([x])
    out = []
    for c in range(calls):
        before = x.detach().clone()
        with opt.predicted_weights():
            x.grad = torch.tensor(grad(x.detach().numpy(), c))
        assert torch.equal(x.detach(), before)  # the gradient point is undone bit for bit
        opt.step()
        opt.zero_grad()
        if opt.updated or not queue:
            out.append(x.detach().numpy().copy())
    return np.array(out), opt


def sgd(delay, correction="none", lr=LR, **kw):
    phases = {k: kw.pop(k) for k in ("sync_start", "sync_cooldown", "total_steps") if k in kw}
    return lambda params: Delayed(torch.optim.SGD(params, lr=lr), delay, build(correction, **kw), **phases)


@pytest.mark.parametrize("tau", [1, 2, 3])
@pytest.mark.parametrize("correction", ["none", "ef", "predict", "lookahead", "damp", "ef,predict,damp"])
def test_a_constant_cycle_is_the_queue_bit_for_bit(tau, correction):
    """``cycle:tau`` keeps weight versions, ``delay=tau`` queues gradients: the same iterates (the
    queue's fill calls make no update, so it takes tau more calls)."""
    got, _ = drive(sgd(DelayDistribution.parse(f"cycle:{tau}"), correction), 20)
    want, _ = drive(sgd(tau, correction), 20 + tau, queue=True)
    np.testing.assert_array_equal(got, want)


def test_sync_phases_of_a_distribution():
    """Before the cooldown, ``cycle:2`` with a sync start is the queue bit for bit (the delayed phase
    starts at x_s: x_{s-j} := x_s, no fill). In the cooldown nothing is queued, so nothing is
    dropped: sync update k uses batch k (the queue drops its tau gradients and uses batch k + tau)."""
    kw = dict(sync_start=4, sync_cooldown=3, total_steps=18)
    got, opt = drive(sgd(DelayDistribution.parse("cycle:2"), "ef,predict", **kw), 20)
    want, _ = drive(sgd(2, "ef,predict", **kw), 18 + 2, queue=True)
    np.testing.assert_array_equal(got[:15], want[:15])
    hist = list(got[14:15])
    for k in range(15, 18):  # the cooldown: undelayed, uncorrected
        hist.append(hist[-1] - LR * grad(hist[-1], k))
    np.testing.assert_allclose(got[15:18], hist[1:], rtol=0, atol=TOL)
    np.testing.assert_array_equal(got[18:], got[17:18].repeat(2, 0))  # finished: later calls are ignored
    assert opt.num_updates == 18


def taus(dist, n):
    return [dist(k) for k in range(n)]


@pytest.mark.parametrize("spec", ["uniform:0-4", "cycle:0,3,1"])
def test_a_variable_delay_is_the_async_sgd_recursion(spec):
    """x_{k+1} = x_k - lr g(x_{max(0, k - tau_k)}; b_k): out-of-order (tau 3 after tau 0) included."""
    dist = DelayDistribution.parse(spec, seed=3)
    T = 60
    got, opt = drive(sgd(dist), T)
    t = taus(dist, T)
    hist = [X0]
    for k in range(T):
        hist.append(hist[k] - LR * grad(hist[max(0, k - t[k])], k))
    diff = np.abs(got - np.array(hist[1:])).max()
    print(f"{spec}: max |diff| {diff:.3g} over {T} updates, delays {t[:12]}...")
    assert diff <= TOL
    assert opt.num_updates == T and len(opt.state[opt.param_groups[0]["params"][0]]["versions"]) == dist.max
    if spec.startswith("uniform"):
        assert set(t) == {0, 1, 2, 3, 4} and any(t[k + 1] > t[k] + 1 for k in range(T - 1))  # out of order


def test_ef_prediction_and_damping_under_a_random_delay_are_their_hand_recursions():
    """EF with the mean lag l: x_{k+1} = x_k - (l+1) u_k + l u_{k-1}; prediction takes the gradient
    at x_v - a (x_{v-1} - x_v), v = max(0, k - tau_k), a = k - v; damping divides lr by 1 + c tau_k."""
    dist = DelayDistribution.parse("uniform:1-4", seed=7)  # mean 2.5: a real lag
    T, c = 50, 0.5
    got, opt = drive(sgd(dist, "ef,predict,damp", damping=c), T)
    assert opt.ef_lags == [2.5]
    t = taus(dist, T)
    hist, u_prev, lag = [X0], np.zeros(D), 2.5
    for k in range(T):
        v = max(0, k - t[k])
        point = hist[v] - (k - v) * (hist[v - 1] - hist[v]) if v >= 1 else hist[v]
        u = LR / (1 + c * t[k]) * grad(point, k)
        hist.append(hist[k] - (lag + 1) * u + lag * u_prev)
        u_prev = u
    diff = np.abs(got - np.array(hist[1:])).max()
    print(f"ef,predict,damp under uniform:1-4: max |diff| {diff:.3g}")
    assert diff <= TOL


def test_the_mean_lag_keeps_the_virtual_iterates_of_ef():
    """With a constant lag l, x_k = w_k - l u_{k-1}, w_k = x_0 - sum_{j<k} u_j (the undelayed
    sequence of the same updates), whatever the delays: the identity EF's lag rule rests on."""
    dist = DelayDistribution.parse("uniform:0-4", seed=1)
    T = 40
    got, opt = drive(sgd(dist, "ef"), T)
    t = taus(dist, T)
    xs = [X0] + list(got)
    us = [LR * grad(xs[max(0, k - t[k])], k) for k in range(T)]  # the inner's updates, from the iterates
    w = X0 - np.cumsum(us, axis=0)  # w_{k+1}
    virtual = [xs[k + 1] + opt.ef_lags[0] * us[k] for k in range(T)]
    assert np.abs(np.array(virtual) - w).max() <= 1e-12
    # a per-update lag l_k = tau_k would break it: the error sum_j (l_{j+1} - l_j) u_j does not telescope
    x, u_prev, bad = X0, np.zeros(D), []
    for k in range(T):
        u = LR * grad(x, k)  # any update sequence shows it
        x = x - (t[k] + 1) * u + t[k] * u_prev
        u_prev = u
        bad.append(x + t[k] * u)
    assert np.abs(np.array(bad) - (X0 - np.cumsum([LR * grad(X0, k) for k in range(T)], axis=0))).max() > 1e-3


@pytest.mark.parametrize("correction", ["ef", "ef,predict", "lookahead,damp"])
def test_resume_in_mid_run_is_bit_exact(correction):
    def make(x):
        return Delayed(torch.optim.AdamW([x], lr=0.05), DelayDistribution.parse("uniform:0-3", seed=11), correction)

    def run(opt, x, start, calls):
        for c in range(start, start + calls):
            with opt.predicted_weights():
                x.grad = torch.tensor(grad(x.detach().numpy(), c))
            opt.step()

    x = torch.tensor(X0, requires_grad=True)
    opt = make(x)
    run(opt, x, 0, 7)
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=False)
    assert saved["delayed"]["delay_rng"] == {"seed": 11, "draws": 7}
    assert saved["delayed"]["delay_dist"] == {"spec": "uniform:0-3", "seed": 11}
    y = x.detach().clone().requires_grad_()
    fresh = make(y)
    fresh.load_state_dict(saved)
    run(opt, x, 7, 9)
    run(fresh, y, 7, 9)
    assert torch.equal(x, y)
    other = Delayed(torch.optim.AdamW([y], lr=0.05), DelayDistribution.parse("uniform:0-3", seed=12), correction)
    with pytest.raises(ConfigError, match="saved with"):
        other.load_state_dict(saved)


def test_the_uniform_draws_are_uniform_and_a_pure_function_of_seed_and_update():
    dist = DelayDistribution.parse("uniform:4", seed=0)
    n = 5000
    draws = np.array(taus(dist, n))
    counts = np.bincount(draws, minlength=5)
    chi2 = ((counts - n / 5) ** 2 / (n / 5)).sum()
    assert set(draws) == {0, 1, 2, 3, 4} and chi2 < 18.5  # chi-square(4) 0.999 quantile
    assert abs(draws.mean() - dist.mean) < 0.1 and dist.mean == 2.0
    assert taus(DelayDistribution.parse("uniform:0-4", seed=0), 50) == list(draws[:50])
    assert taus(DelayDistribution.parse("uniform:0-4", seed=1), 50) != list(draws[:50])
    assert taus(DelayDistribution.parse("cycle:1,3"), 5) == [1, 3, 1, 3, 1]


def test_misuse_is_a_one_line_config_error():
    x = torch.tensor(X0, requires_grad=True)
    opt = Delayed(torch.optim.SGD([x], lr=LR), DelayDistribution.parse("uniform:2"))
    x.grad = torch.zeros(D, dtype=torch.float64)
    with pytest.raises(ConfigError, match="predicted_weights"):
        opt.step()  # a gradient not taken at the stale weights
    with pytest.raises(ConfigError, match="not defined for a delay distribution"):
        Delayed(torch.optim.SGD([x], lr=LR), DelayDistribution.parse("uniform:2"), "dc-asgd")
    y = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ConfigError, match="before the first step"):
        with opt.predicted_weights():
            x.grad = torch.zeros(D, dtype=torch.float64)
        opt.step()
        opt.add_param_group({"params": [y]})
    for spec, msg in [("normal:2", "unknown delay distribution"), ("uniform:3-1", "LO <= HI"),
                      ("cycle:1,-1", "integer >= 0"), ("uniform:", "expected cycle")]:
        with pytest.raises(ConfigError, match=msg):
            DelayDistribution.parse(spec)


def test_a_closure_is_evaluated_at_the_stale_weights():
    dist = DelayDistribution.parse("cycle:2")
    x = torch.tensor(X0, requires_grad=True)
    opt = Delayed(torch.optim.SGD([x], lr=LR), dist)
    hist = [X0]
    for k in range(6):
        def closure(k=k):
            opt.zero_grad()
            loss = 0.5 * x @ torch.tensor(A) @ x - torch.tensor(B[k]) @ x
            loss.backward()
            return loss
        opt.step(closure)
        hist.append(hist[k] - LR * grad(hist[max(0, k - 2)], k))
    assert np.abs(x.detach().numpy() - hist[-1]).max() <= TOL


def test_every_param_group_follows_the_one_distribution():
    """Two groups (one given at construction, one added before the first step) against one group:
    the same iterates, bit for bit, with EF and prediction."""
    dist = DelayDistribution.parse("uniform:0-3", seed=4)
    whole, _ = drive(sgd(dist, "ef,predict"), 30)
    x, y = torch.tensor(X0[:2], requires_grad=True), torch.tensor(X0[2:], requires_grad=True)
    opt = Delayed(torch.optim.SGD([x], lr=LR), dist, "ef,predict")
    opt.add_param_group({"params": [y]})
    out = []
    for c in range(30):
        with opt.predicted_weights():
            g = grad(np.concatenate([x.detach().numpy(), y.detach().numpy()]), c)
            x.grad, y.grad = torch.tensor(g[:2]), torch.tensor(g[2:])
        opt.step()
        out.append(np.concatenate([x.detach().numpy(), y.detach().numpy()]))
    np.testing.assert_array_equal(np.array(out), whole)
    assert opt.group_updates == [30, 30] and opt.ef_lags == [1.5, 1.5]
