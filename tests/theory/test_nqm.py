"""The NQM under delay: the exact recursion against independent computations.

Monte Carlo of the same dynamics (a direct simulation), the Lyapunov solve against the
recursion run long, a hand closed form for SGD, the stability limits of
delaylab.theory.stability, the lr schedule of delaylab.llm.config.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from delaylab.errors import ConfigError
from delaylab.theory import nqm
from delaylab.theory import stability as st

SPEC = nqm.Spectrum(h=[2.0, 0.5, 0.1, 0.02], c=[1.0, 0.5, 0.2, 0.1], x0sq=[1, 1, 1, 1], p=[0.5, 1, 2, 3])
LRS = 0.1 * nqm.lr_factors(40, "cosine", warmup=4)

CASES = [("sgd", 0.0, 1, None, False), ("heavyball", 0.5, 2, 2, False), ("adam", 0.9, 1, None, True),
         ("ema", 0.9, {0: 0.5, 2: 0.5}, None, False), ("adam", 0.9, 4, 4, False)]


@pytest.mark.parametrize("name,beta,delay,ef,predict", CASES)
def test_recursion_matches_monte_carlo(name, beta, delay, ef, predict):
    m = nqm.Method(name, beta, delay, ef=ef, predict=predict)
    rec = nqm.expected_loss(SPEC, m, LRS, batch=4)
    mc, se = nqm.monte_carlo(SPEC, m, LRS, batch=4, runs=20000, seed=3)
    random = se > 0  # x_0 = +-sqrt(x0sq): the loss is deterministic until the first noisy update
    np.testing.assert_allclose(mc[~random], rec[~random], rtol=1e-12)
    z = np.abs(mc[random] - rec[random]) / se[random]
    # 40 correlated points: a max beyond 4 standard errors is a bug, not chance
    assert z.max() < 4.0, z.max()
    assert abs(mc[-1] / rec[-1] - 1) < 0.02


def test_monte_carlo_sees_a_wrong_recursion():
    """The check has teeth: the recursion of delay 1 is far outside the MC of delay 2."""
    rec = nqm.expected_loss(SPEC, nqm.Method("adam", 0.9, 1), LRS, batch=4)
    mc, se = nqm.monte_carlo(SPEC, nqm.Method("adam", 0.9, 2), LRS, batch=4, runs=20000, seed=3)
    assert np.abs(mc[1:] - rec[1:]).max() / se[-1] > 10


def test_sgd_closed_form():
    """Sync SGD: E[x^2] -> eta c / (B h (2 - eta h)) (sum of a geometric series, by hand)."""
    spec = nqm.Spectrum(h=[1.0, 0.3], c=[2.0, 1.0], x0sq=[0.0, 0.0])
    eta, B = 0.4, 8
    want = 0.5 * sum(h * eta * c / (B * h * (2 - eta * h)) for h, c in zip(spec.h, spec.c))
    assert nqm.stationary_loss(spec, nqm.Method("sgd", 0.0, 0), eta, batch=B) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("m", [nqm.Method("heavyball", 0.5, 1), nqm.Method("ema", 0.9, 2, ef=2),
                               nqm.Method("ema", 0.9, {0: 0.5, 2: 0.5}), nqm.Method("sgd", 0.0, 1, predict=True,
                                                                                    damping=1.0)])
def test_lyapunov_is_the_limit_of_the_recursion(m):
    spec = nqm.Spectrum(h=[2.0, 0.5, 0.1], c=[1.0, 0.5, 0.2], x0sq=[1, 1, 1])
    s = nqm.stationary_loss(spec, m, 0.1, batch=2)
    rec = nqm.expected_loss(spec, m, np.full(4000, 0.1), batch=2)
    assert s == pytest.approx(rec[-1], rel=1e-9)


def test_unstable_is_inf_and_flagged():
    spec = nqm.Spectrum(h=[1.0], c=[1.0], x0sq=[1.0])
    m = nqm.Method("ema", 0.9, 1)
    assert nqm.stationary_loss(spec, m, 1.2) == math.inf  # the delay-1 limit is eta h < 1
    loss = nqm.expected_loss(spec, m, np.full(500, 1.2))
    assert nqm.diverged(loss, loss[0])
    assert not nqm.diverged(nqm.expected_loss(spec, m, np.full(500, 0.8)), loss[0])


@pytest.mark.parametrize("method,beta", [("gd", 0.0), ("heavyball", 0.5), ("heavyball", 0.9), ("ema", 0.9),
                                         ("ema", 0.99)])
@pytest.mark.parametrize("tau,ef", [(0, False), (1, False), (1, True), (2, False), (3, True)])
def test_stability_limit_matches_the_stability_module(method, beta, tau, ef):
    a = st.max_stable(method, beta, tau, ef)
    b = nqm.max_stable(nqm.Method("sgd" if method == "gd" else method, beta, tau, ef=tau if ef else None))
    assert b == pytest.approx(a, rel=1e-6)


@pytest.mark.parametrize("schedule", nqm.SCHEDULES)
def test_lr_factors_equal_the_trainers(schedule):
    from delaylab.llm.config import Config, lr_factor

    cfg = Config()
    cfg.run.steps, cfg.lr_schedule.lr_schedule = 137, schedule
    want = [lr_factor(k, cfg) for k in range(137)]
    np.testing.assert_allclose(nqm.lr_factors(137, schedule), want, rtol=0, atol=1e-15)


def test_delay_hurts_and_ef_helps_in_the_model():
    """Direction checks at a large lr: delay raises the loss, EF takes part of it back."""
    spec = nqm.Spectrum(h=np.geomspace(0.01, 1.0, 20), c=0.5, x0sq=1.0)
    lrs = 0.8 * nqm.lr_factors(200, "constant")
    sync, dly, ef = (nqm.expected_loss(spec, nqm.Method("ema", 0.9, t, ef=e), lrs, batch=4)[-1]
                     for t, e in ((0, None), (1, None), (1, 1)))
    assert dly > sync and sync < ef < dly


def test_nonlinear_monte_carlo_runs():
    spec = nqm.Spectrum(h=np.geomspace(0.01, 2, 6), c=0.3, x0sq=1.0)
    lrs = 0.02 * nqm.lr_factors(30, "constant")
    for name, shape in (("sign", None), ("adamw", None), ("muon", (2, 3))):
        mean, se = nqm.monte_carlo(spec, nqm.Method(name, 0.9, 1), lrs, batch=2, runs=400, shape=shape)
        assert mean[-1] < mean[0] and 0 < se[-1] < mean[-1]
    with pytest.raises(ConfigError):
        nqm.expected_loss(spec, nqm.Method("adamw", 0.9, 1), lrs)
    with pytest.raises(ConfigError):
        nqm.monte_carlo(spec, nqm.Method("muon", 0.9, 1), lrs, shape=(4, 4))


@pytest.mark.parametrize("kw", [dict(name="nope"), dict(beta=1.0), dict(delay=-1), dict(delay={1: 0.5}),
                                dict(name="sgd", beta=0.5), dict(ef=-1)])
def test_bad_input(kw):
    with pytest.raises(ConfigError):
        nqm.Method(**kw)


def test_slq_on_a_planted_spectrum():
    """SLQ from matvecs against the eigenvalues planted in a random basis: the top one to 1e-9,
    the trace to 15%, the NQM loss computed from its nodes to 5% of the exact one."""
    from delaylab.theory.slq import slq

    rng = np.random.default_rng(0)
    n = 600
    eig = np.concatenate([np.geomspace(1e-4, 1, n - 6), np.geomspace(2, 50, 6)])  # bulk + outliers
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    A = (Q * eig) @ Q.T
    nodes, w = slq(lambda v: A @ v, n, probes=4, steps=40)
    assert w.sum() == pytest.approx(n)
    assert nodes.max() == pytest.approx(50.0, rel=1e-9)
    assert (w * nodes).sum() == pytest.approx(eig.sum(), rel=0.15)
    lrs = 0.02 * nqm.lr_factors(300, "cosine")

    def loss(h, wt):
        return nqm.expected_loss(nqm.Spectrum(h=h.clip(0), w=wt, c=0.05 * h.clip(0), x0sq=1.0),
                                 nqm.Method("ema", 0.9, 1), lrs, batch=16)[-1]

    assert loss(nodes, w) == pytest.approx(loss(eig, np.ones(n)), rel=0.05)


@pytest.mark.parametrize("kw", [dict(sync_start=10), dict(sync_cooldown=8), dict(sync_start=5, sync_cooldown=5,
                                                                                  damping=1.0, ef=2)])
def test_sync_phases_recursion_matches_monte_carlo(kw):
    m = nqm.Method("adam", 0.9, 2, **kw)
    rec = nqm.expected_loss(SPEC, m, LRS, batch=4)
    mc, se = nqm.monte_carlo(SPEC, m, LRS, batch=4, runs=20000, seed=5)
    random = se > 0
    assert (np.abs(mc[random] - rec[random]) / se[random]).max() < 4.0
    assert not np.allclose(rec, nqm.expected_loss(SPEC, nqm.Method("adam", 0.9, 2, ef=kw.get("ef"),
                                                                   damping=kw.get("damping", 0.0)), LRS, batch=4))
