"""The bounds: exact reductions, monotonicity, evaluation, and that they hold on simulations."""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import numpy as np
import pytest
import sympy as sp

from delaylab.theory import ASSUMPTIONS, evaluate, get_bound, lmo_bound, sgdm_bound, virtual_lmo_bound
from delaylab.theory import symbols as S
from theory_sim import (cauchy_f, cauchy_grad, dual_norm, logdet_f, logdet_grad, mean_and_se, run_lmo,
                        run_sgdm)

ROOT = Path(__file__).resolve().parents[2]
CONSTS = dict(L=2.0, sigma=1.0, rho=3.0, Delta=5.0, G0=2.0, T=1000.0, eta=0.01, beta=0.9, delta_bar=0.5,
              E_bar=0.1)

ALL_BOUNDS = [lmo_bound(0), lmo_bound(1), lmo_bound(2, nesterov=True), lmo_bound(1, init="first"),
              lmo_bound(1, ef=True), lmo_bound(2, ef=True, point="real"), virtual_lmo_bound(),
              virtual_lmo_bound(point="real"), sgdm_bound(0), sgdm_bound(1)]


@pytest.mark.parametrize("nesterov,init", list(itertools.product([False, True], ["zero", "first"])))
def test_tau_zero_reduces_the_delayed_bound_to_the_sync_bound_exactly(nesterov, init):
    sync = lmo_bound(0, nesterov=nesterov, init=init).expr
    delayed = lmo_bound(None, nesterov=nesterov, init=init).expr
    assert S.tau in delayed.free_symbols
    assert sp.simplify(delayed.subs(S.tau, 0) - sync) == 0
    # EF with lag 0 is the plain optimizer: its bound is the sync bound too.
    assert sp.simplify(lmo_bound(None, ef=True, nesterov=nesterov, init=init).expr.subs(S.tau, 0) - sync) == 0
    assert sp.simplify(sgdm_bound(None).expr.subs(S.tau, 0) - sgdm_bound(0).expr) == 0


def test_sync_bound_has_the_issue_form_and_the_delay_term_is_2_L_eta_tau():
    b = lmo_bound(None).term_dict
    L, eta, beta, T = S.L, S.eta, S.beta, S.T
    assert sp.simplify(b["opt"] - S.Delta / (eta * T)) == 0
    assert sp.simplify(b["step"] - L * eta / 2) == 0
    assert sp.simplify(b["momentum"] - 2 * L * eta * beta / (1 - beta)) == 0
    assert sp.simplify(b["delay"] - 2 * L * eta * S.tau) == 0
    assert sp.simplify(b["noise"] - 2 * S.rho * S.sigma * sp.sqrt((1 - beta) / (1 + beta))) == 0
    # the start-up term of zero-initialised momentum, docs/theory.md's I_T; exactly of order 1/T: T times
    # it is free of T and not 0 (an O(1) term, or one of lower order, fails here)
    assert sp.simplify(b["init"] - 2 * beta / ((1 - beta) * T) * (S.G0 + L * eta * beta / (1 - beta))) == 0
    scaled = sp.simplify(b["init"] * T)
    assert T not in scaled.free_symbols and sp.simplify(scaled) != 0
    # relative delay penalty at fixed beta (DESIGN.md): tau (1-beta)/beta
    assert sp.simplify(b["delay"] / b["momentum"] - S.tau * (1 - beta) / beta) == 0


@pytest.mark.parametrize("bound", ALL_BOUNDS, ids=lambda b: f"{b.name}-{b.option.get('point', '')}")
def test_each_bound_is_monotone_in_tau_L_and_sigma(bound):
    rng = np.random.default_rng(0)
    pts = {k: rng.uniform(0.2, 2.0, 200) for k in ("L", "sigma", "rho", "Delta", "G0", "E_bar")}
    pts.update(beta=rng.uniform(0, 0.99, 200), eta=rng.uniform(1e-4, 0.05, 200), T=rng.uniform(1, 1e5, 200),
               delta_bar=rng.uniform(0, 2, 200))
    for name in ("L", "sigma", "tau"):
        lo, hi = (dict(pts), dict(pts))
        if name == "tau":
            # delay is an integer parameter of the constructor
            opts = bound.option
            if opts.get("delay") is None or "virtual" in bound.name:
                continue
            lo_b = get_bound(opts["method"], opts["delay"], opts.get("ef", False), opts.get("nesterov", False),
                             opts.get("init", "zero"), opts.get("point", "virtual"))
            hi_b = get_bound(opts["method"], opts["delay"] + 1, opts.get("ef", False), opts.get("nesterov", False),
                             opts.get("init", "zero"), opts.get("point", "virtual"))
            v_lo, v_hi = evaluate(lo_b, **lo).value, evaluate(hi_b, **hi).value
        else:
            hi[name] = lo[name] * 1.5
            v_lo, v_hi = evaluate(bound, **lo).value, evaluate(bound, **hi).value
        assert np.all(v_hi >= v_lo * (1 - 1e-12)), (bound.name, name)
    # symbolically where sympy can decide: the derivatives in L and sigma are >= 0
    if bound.power == 1:
        for sym in (S.L, S.sigma):
            d = sp.diff(bound.expr, sym)
            assert d.subs({S.beta: sp.Rational(1, 2)}).is_nonnegative, (bound.name, sym)


@pytest.mark.parametrize("bound", ALL_BOUNDS, ids=lambda b: b.name)
def test_evaluate_matches_sympy_evalf_and_broadcasts(bound):
    rng = np.random.default_rng(1)
    grid = {k: rng.uniform(0.1, 1.0, (3, 4)) for k in ("L", "sigma", "rho", "Delta", "G0", "E_bar")}
    grid.update(eta=rng.uniform(1e-3, 0.05, (3, 4)), beta=rng.uniform(0, 0.99, (3, 4)), T=100.0, delta_bar=0.7)
    ev = evaluate(bound, **grid)
    assert ev.value.shape == (3, 4)
    for i, j in itertools.product(range(3), range(4)):
        point = {k: (v[i, j] if np.ndim(v) else v) for k, v in grid.items()}
        subs = {S.BY_NAME[k]: v for k, v in point.items() if k in bound.symbols}
        want = float(bound.expr.evalf(subs=subs))
        cond_ok = all(bool(c.subs(subs)) for c in bound.conditions)
        got = ev.value[i, j]
        if cond_ok:
            assert got == pytest.approx(want, rel=1e-12)
            assert sum(t[i, j] for t in ev.terms.values()) == pytest.approx(got, rel=1e-12)
        else:
            assert got == math.inf


def test_evaluate_a_million_points_in_one_call():
    eta = np.logspace(-6, -1, 10**6)
    ev = evaluate(lmo_bound(1), **dict(CONSTS, eta=eta))
    assert ev.value.shape == (10**6,)
    i = int(np.argmin(ev.value))
    # the minimiser of a/eta + b eta + c over eta is sqrt(a/b), known in closed form
    t = {k: v[i] for k, v in ev.terms.items()}
    a, b = t["opt"] * eta[i], (t["step"] + t["momentum"] + t["delay"] + t["init"] - 2 * CONSTS["beta"] * CONSTS["G0"]
                               / ((1 - CONSTS["beta"]) * CONSTS["T"])) / eta[i]
    assert eta[i] == pytest.approx(math.sqrt(a / b), rel=1e-4)


@pytest.mark.parametrize("bad", [dict(beta=1.0), dict(beta=-0.1), dict(eta=0.0), dict(eta=-1.0), dict(T=0.5),
                                 dict(tau=-1), dict(sigma=-1.0), dict(L=0.0), dict(delta_bar=2.5),
                                 dict(beta=float("nan")), dict(Lipschitz=1.0)])
def test_bad_constants_raise_value_error(bad):
    with pytest.raises(ValueError):
        evaluate(lmo_bound(1, ef=True), **dict(CONSTS, **bad))


def test_bad_construction_raises_value_error():
    for kw in (dict(delay=-1), dict(delay=1.5), dict(init="ones"), dict(point="middle")):
        with pytest.raises(ValueError):
            lmo_bound(**kw)
    with pytest.raises(ValueError):
        get_bound("adam")
    with pytest.raises(ValueError):
        get_bound("sgdm", ef=True)
    with pytest.raises(ValueError):
        evaluate(lmo_bound(1), L=1.0)  # missing constants


def test_every_bound_carries_assumptions_and_a_proof_section_that_exists():
    text = (ROOT / "docs" / "theory.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.*)$", text, flags=re.M)}
    for b in ALL_BOUNDS + [lmo_bound(1, nesterov=True)]:
        assert b.assumptions and all(a in ASSUMPTIONS for a in b.assumptions)
        assert b.references
        path, anchor = b.proof.split("#")
        assert path == "docs/theory.md" and anchor in anchors, b.proof


# --- the bounds against independent simulations ----------------------------------------

@pytest.mark.parametrize("beta,tau,nesterov", [(0.9, 0, False), (0.9, 1, False), (0.95, 3, False),
                                               (0.9, 1, True), (0.5, 2, True)])
def test_momentum_error_is_met_with_equality_in_the_drift_phase(beta, tau, nesterov):
    # f = L x^2/2 far from 0: the LMO step is -eta every time, so m_t - grad f(x_t) tends to
    # L eta (lag + tau), lag = beta/(1-beta) (Nesterov: beta^2/(1-beta)) -- Lemma 3 is tight.
    L, eta = 2.0, 1e-3
    r = run_lmo(lambda x: L * x, np.array([50.0]), eta, beta, 3000, tau, "l2", seeds=1, nesterov=nesterov)
    err = r["c"][-1, 0, 0] - L * r["x"][-1, 0, 0]
    lag = beta**2 / (1 - beta) if nesterov else beta / (1 - beta)
    assert err / (L * eta) == pytest.approx(lag + tau, abs=1e-6)


def _cauchy_constants(norm, d, x0, sigma):
    g0 = cauchy_grad(x0[None])
    return dict(L=2.0 if norm == "l2" else 2.0 * d, rho=1.0 if norm == "l2" else math.sqrt(d), sigma=sigma,
                Delta=float(cauchy_f(x0[None])[0]), G0=float(dual_norm(g0, norm)[0]))


@pytest.mark.parametrize("norm,tau,nesterov", [("l2", 0, False), ("l2", 1, False), ("sign", 1, False),
                                               ("sign", 2, True)])
def test_theorem_1_holds_on_the_cauchy_problem(norm, tau, nesterov):
    from delaylab.theory import tune

    d, T = 16, 1500
    x0 = np.full(d, 3.0)
    c = _cauchy_constants(norm, d, x0, sigma=1.0)
    bound = lmo_bound(tau, nesterov=nesterov)
    tuned = tune(bound, T, c)
    r = run_lmo(cauchy_grad, x0, tuned.eta, tuned.beta, T, tau, norm, sigma=1.0, seeds=16, nesterov=nesterov)
    per_seed = dual_norm(r["x"].reshape(-1, d), norm).reshape(T, -1).mean(axis=0)
    mean, se = mean_and_se(per_seed)
    assert mean + 3 * se <= tuned.value
    # every step has norm eta; the delayed point is within tau*eta
    steps = np.linalg.norm(np.diff(r["x"], axis=0), axis=-1) if norm == "l2" else \
        np.abs(np.diff(r["x"], axis=0)).max(axis=-1)
    assert np.allclose(steps, tuned.eta, rtol=1e-9)


def test_theorem_1_holds_for_muon_on_the_logdet_problem():
    from delaylab.theory import tune

    m, n, T, tau = 6, 4, 800, 1
    w0 = np.random.default_rng(3).normal(size=(m, n))
    c = dict(L=2.0 * min(m, n), rho=math.sqrt(min(m, n)), sigma=1.0, Delta=float(logdet_f(w0[None])[0]),
             G0=float(dual_norm(logdet_grad(w0[None]), "spectral")[0]))
    tuned = tune(lmo_bound(tau), T, c)
    r = run_lmo(logdet_grad, w0, tuned.eta, tuned.beta, T, tau, "spectral", sigma=1.0, seeds=8)
    per_seed = dual_norm(logdet_grad(r["x"].reshape(-1, m, n)), "spectral").reshape(T, -1).mean(axis=0)
    mean, se = mean_and_se(per_seed)
    assert mean + 3 * se <= tuned.value


@pytest.mark.parametrize("beta1,beta2,tau", [(0.9, 0.99, 0), (0.9, 0.99, 1), (0.5, 0.9, 2)])
def test_lions_momentum_error_is_met_with_equality_in_the_drift_phase(beta1, beta2, tau):
    # Lion's direction c_t = beta1 m_{t-1} + (1-beta1) g_t: its lag is beta1/(1-beta2) (docs/theory.md#lion)
    L, eta = 2.0, 1e-3
    r = run_lmo(lambda x: L * x, np.array([500.0]), eta, beta2, 4000, tau, "sign", seeds=1, lion_beta1=beta1)
    err = r["c"][-1, 0, 0] - L * r["x"][-1, 0, 0]
    assert err / (L * eta) == pytest.approx(beta1 / (1 - beta2) + tau, abs=1e-6)
    bound = lmo_bound(tau, lion_beta1=beta1)
    assert bound.term_dict["momentum"].subs(S.beta, sp.nsimplify(beta2)) == \
        2 * S.L * S.eta * sp.nsimplify(beta1) / (1 - sp.nsimplify(beta2))


def test_lion_weights_from_their_sums_and_nesterov_as_a_special_case():
    from delaylab.theory.bounds import lion_weights, momentum_weights

    b1, b = 0.8, 0.95
    w = np.array([1 - b1] + [b1 * (1 - b) * b ** (j - 1) for j in range(1, 4000)])
    lag, noise, start = lion_weights(b1)
    sub = {S.beta: b}
    assert w.sum() == pytest.approx(1.0, abs=1e-12)
    assert float(lag.subs(sub)) == pytest.approx((np.arange(w.size) * w).sum(), rel=1e-10)
    assert float(noise.subs(sub)) == pytest.approx((w**2).sum(), rel=1e-10)
    # the weight missing at step t of the zero-initialised buffer is start * beta^t
    for t in (0, 10, 100):
        assert 1 - w[:t + 1].sum() == pytest.approx(float(start) * b**t, rel=1e-9)
    # Nesterov is Lion with beta1 = beta^2: the same lag, noise and start-up
    nl, nn, p = momentum_weights(True)
    ll, ln, ls = lion_weights(sp.Rational(81, 100))
    for a, c in ((nl, ll), (nn, ln), (S.beta**p, ls)):
        assert float(a.subs(S.beta, sp.Rational(9, 10))) == pytest.approx(float(sp.sympify(c).subs(
            S.beta, sp.Rational(9, 10))), rel=1e-12)


@pytest.mark.parametrize("tau", [0, 2])
def test_theorem_1_holds_for_lion_on_the_cauchy_problem(tau):
    d, T, beta1, beta2, eta = 16, 1500, 0.5, 0.9, 0.01
    x0 = np.full(d, 3.0)
    c = _cauchy_constants("sign", d, x0, sigma=1.0)
    ev = evaluate(lmo_bound(tau, norm="sign", lion_beta1=beta1), **c, T=T, eta=eta, beta=beta2, tau=tau)
    r = run_lmo(cauchy_grad, x0, eta, beta2, T, tau, "sign", sigma=1.0, seeds=16, lion_beta1=beta1)
    per_seed = dual_norm(r["x"].reshape(-1, d), "sign").reshape(T, -1).mean(axis=0)
    mean, se = mean_and_se(per_seed)
    assert mean + 3 * se <= ev.value


@pytest.mark.parametrize("norm,tau", [("l2", 1), ("sign", 2)])
def test_a_schedule_is_bounded_at_the_largest_step_and_the_effective_horizon(norm, tau):
    """docs/theory.md#step-size-schedules: the eta_t-weighted mean of E||grad f(x_t)||_* is at most the
    bound at eta_max and T_eff = sum_t eta_t / eta_max."""
    d, T, beta, peak = 16, 1500, 0.9, 0.05
    warm = T // 20
    etas = np.array([peak * (k + 1) / warm if k < warm else
                     peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (k - warm) / (T - 1 - warm))))
                     for k in range(T)])
    x0 = np.full(d, 3.0)
    c = _cauchy_constants(norm, d, x0, sigma=1.0)
    r = run_lmo(cauchy_grad, x0, None, beta, T, tau, norm, sigma=1.0, seeds=16, etas=etas)
    g = dual_norm(r["x"].reshape(-1, d), norm).reshape(T, -1)
    per_seed = (etas[:, None] * g).sum(axis=0) / etas.sum()
    mean, se = mean_and_se(per_seed)
    T_eff = etas.sum() / etas.max()
    bound = evaluate(lmo_bound(tau), **c, T=T_eff, eta=etas.max(), beta=beta, tau=tau).value
    assert mean + 3 * se <= bound
    # the unweighted bound at the mean step would not be a theorem; the weighted one is tighter than
    # the same bound at the full horizon T would suggest only through T_eff <= T
    assert T_eff < T


@pytest.mark.parametrize("norm,tau", [("l2", 1), ("l2", 2), ("sign", 1)])
def test_ef_bound_holds_with_the_measured_drift_at_both_points(norm, tau):
    d, T, eta, beta = 16, 1500, 0.01, 0.95
    x0 = np.full(d, 3.0)
    c = _cauchy_constants(norm, d, x0, sigma=0.3)
    r = run_lmo(cauchy_grad, x0, eta, beta, T, tau, norm, sigma=0.3, seeds=16, ef=True)
    delta_bar = float(r["delta"].mean())
    for point, pts in (("virtual", r["w"]), ("real", r["y"])):
        b = lmo_bound(tau, ef=True, point=point)
        val = evaluate(b, **c, T=T, eta=eta, beta=beta, delta_bar=min(delta_bar, 2.0)).value
        per_seed = dual_norm(cauchy_grad(pts.reshape(-1, d)), norm).reshape(T, -1).mean(axis=0)
        mean, se = mean_and_se(per_seed)
        assert mean + 3 * se <= val, point
    # the virtual sequence is undelayed: w_{t+1} - w_t = eta d_t, a step of norm eta exactly
    dw = np.diff(r["w"], axis=0)
    norms = np.linalg.norm(dw, axis=-1) if norm == "l2" else np.abs(dw).max(axis=-1)
    assert np.allclose(norms[tau + 1:], eta, rtol=1e-9)


@pytest.mark.parametrize("beta,tau", [(0.0, 0), (0.0, 2), (0.9, 1)])
def test_theorem_4_holds_for_delayed_sgdm(beta, tau):
    from delaylab.theory import tune

    d, T = 16, 1500
    x0 = np.full(d, 3.0)
    c = _cauchy_constants("l2", d, x0, sigma=1.0)
    tuned = tune(sgdm_bound(tau), T, c, beta=beta)
    ys = run_sgdm(cauchy_grad, x0, tuned.eta, beta, T, tau, sigma=1.0, seeds=16)
    per_seed = (cauchy_grad(ys.reshape(-1, d)) ** 2).sum(-1).reshape(T, -1).mean(axis=0)
    mean, se = mean_and_se(per_seed)
    assert mean + 3 * se <= tuned.value
