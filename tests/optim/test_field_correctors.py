"""The staleness threshold (drop:K, Ringmaster) and prediction along the raw momentum (marin's
variant) against recursions written out by hand, in float64, on a quadratic."""

import io

import numpy as np
import pytest
import torch

from delaylab.errors import ConfigError
from delaylab.llm.config import Config
from delaylab.llm.run.setup import resolve
from delaylab.llm.sweep import mode_setting
from delaylab.optim import Delayed
from delaylab.optim.corrections import build, canonical, parse
from delaylab.optim.queue import DelayDistribution

D = 3
A = np.array([[2.0, 0.5, 0.0], [0.5, 1.5, 0.2], [0.0, 0.2, 1.0]])
B = np.random.default_rng(5).standard_normal((80, D))
X0 = np.array([1.0, -2.0, 0.5])
LR, BETA = 0.1, 0.8


def grad(x, c):
    return A @ x - B[c]


def run_drop(k, calls, spec="uniform:0-4", seed=3, split_at=None):
    """SGD under Delayed(distribution, drop:k); the iterate after each call, and the optimizer.
    ``split_at``: save the state_dict after that call and continue in a fresh optimizer."""
    x = torch.tensor(X0, requires_grad=True)
    make = lambda: Delayed(torch.optim.SGD([x], lr=LR), DelayDistribution.parse(spec, seed), f"drop:{k}")  # noqa: E731
    opt, out = make(), []
    for c in range(calls):
        if c == split_at:
            buf = io.BytesIO()
            torch.save(opt.state_dict(), buf)
            buf.seek(0)
            opt = make()
            opt.load_state_dict(torch.load(buf, weights_only=False))
        with opt.predicted_weights():
            x.grad = torch.tensor(grad(x.detach().numpy(), c))
        opt.step()
        out.append(x.detach().numpy().copy())
    return np.array(out), opt


def drop_by_hand(k, calls, spec="uniform:0-4", seed=3):
    """Call c draws tau_c; its gradient (batch c, at x_{max(0, n - tau_c)}, n the updates so far) is
    applied iff tau_c <= k, else discarded and nothing changes."""
    dist = DelayDistribution.parse(spec, seed)
    hist, out = [X0], []
    for c in range(calls):
        tau, n = dist(c), len(hist) - 1
        if tau <= k:
            hist.append(hist[n] - LR * grad(hist[max(0, n - tau)], c))
        out.append(hist[-1])
    return np.array(out), len(hist) - 1


@pytest.mark.parametrize("k", [0, 1, 3])
def test_drop_is_ringmasters_threshold_by_hand(k):
    calls = 30
    got, opt = run_drop(k, calls)
    expected, updates = drop_by_hand(k, calls)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-13)
    assert opt.num_updates == updates
    assert 0 < updates < calls  # some gradients kept, some discarded
    resumed, _ = run_drop(k, calls, split_at=11)
    assert np.array_equal(resumed, got)  # the draws' count travels in the state_dict


def test_drop_at_the_largest_delay_discards_nothing():
    """K >= the largest delay: the plain delay distribution, bit for bit."""
    got, opt = run_drop(4, 25)
    x = torch.tensor(X0, requires_grad=True)
    plain = Delayed(torch.optim.SGD([x], lr=LR), DelayDistribution.parse("uniform:0-4", 3))
    ref = []
    for c in range(25):
        with plain.predicted_weights():
            x.grad = torch.tensor(grad(x.detach().numpy(), c))
        plain.step()
        ref.append(x.detach().numpy().copy())
    assert np.array_equal(got, np.array(ref)) and opt.num_updates == 25


def test_drop_needs_a_distribution_and_its_k():
    x = torch.zeros(2, requires_grad=True)
    with pytest.raises(ConfigError, match="delay distribution"):
        Delayed(torch.optim.SGD([x], lr=0.1), 2, "drop:1")
    with pytest.raises(ConfigError, match="drop:K"):
        parse("drop")
    with pytest.raises(ConfigError, match="takes no argument"):
        parse("ef:2")
    assert canonical("drop:3,ef") == "ef,drop:3" and build("drop:3")[0].k == 3
    assert mode_setting("drop-3") == (True, "drop:3")
    with pytest.raises(ConfigError, match="--delay-dist"):
        resolve(Config.from_dict({"delay": 2, "correction": "drop:1"}), "simulator")
    cfg = resolve(Config.from_dict({"delay_dist": "uniform:0-4", "correction": "drop:2"}), "simulator")
    assert cfg.delay.correction == "drop:2" and cfg.correctors()[0].k == 2


@pytest.mark.parametrize("tau", [1, 2])
def test_predict_momentum_extrapolates_the_raw_momentum_by_hand(tau):
    """SGD with momentum BETA (torch's buffer b = BETA b + g) under Delayed(tau, predict-momentum):
    call c's gradient is taken at x - a_c lr m, a_c = min(queued, tau), m = BETA m + (1 - BETA) g
    over the applied gradients (m = 0 before the first)."""
    calls = 20
    x = torch.tensor(X0, requires_grad=True)
    opt = Delayed(torch.optim.SGD([x], lr=LR, momentum=BETA), tau, "predict-momentum")
    got = []
    for c in range(calls):
        before = x.detach().clone()
        with opt.predicted_weights():
            x.grad = torch.tensor(grad(x.detach().numpy(), c))
        assert torch.equal(x.detach(), before)
        opt.step()
        got.append(x.detach().numpy().copy())
    xk, buf, m, queue, expected = X0.copy(), None, None, [], []
    for c in range(calls):
        ahead = min(len(queue), tau)
        point = xk - ahead * LR * m if m is not None and ahead else xk
        queue.append(grad(point, c))
        if len(queue) > tau:
            g = queue.pop(0)
            m = (1 - BETA) * g if m is None else BETA * m + (1 - BETA) * g
            buf = g if buf is None else BETA * buf + g
            xk = xk - LR * buf
        expected.append(xk.copy())
    np.testing.assert_allclose(np.array(got), np.array(expected), rtol=0, atol=1e-13)


def test_predict_momentum_refused_under_a_distribution():
    with pytest.raises(ConfigError, match="not defined for a delay distribution"):
        resolve(Config.from_dict({"delay_dist": "uniform:0-2", "correction": "predict-momentum"}), "simulator")
