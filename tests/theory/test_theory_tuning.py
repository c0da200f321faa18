"""Tuning: sympy closed forms against numeric minimisation, rates, and the delay penalty."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp

from delaylab.theory import (closed_form, delay_penalty, evaluate, leading_order, lmo_bound, penalty_limit,
                             sgdm_bound, tune)
from delaylab.theory import symbols as S

C = dict(L=2.0, sigma=1.5, rho=2.0, Delta=3.0, G0=1.0, delta_bar=0.6)
LMO_BOUNDS = [lmo_bound(0), lmo_bound(1), lmo_bound(3), lmo_bound(1, nesterov=True), lmo_bound(1, ef=True),
              lmo_bound(1, init="first")]


@pytest.mark.parametrize("bound", LMO_BOUNDS + [sgdm_bound(0), sgdm_bound(1)], ids=lambda b: b.name)
@pytest.mark.parametrize("T", [1e4, 1e6])
def test_closed_form_agrees_with_numeric_minimisation_within_one_percent(bound, T):
    r = tune(bound, T, C)
    assert r.closed["value"] == pytest.approx(r.value, rel=0.01)
    assert r.value <= r.closed["value"] * (1 + 1e-12)
    # and with a brute-force grid, which needs no optimiser at all
    if bound.power == 1:
        eta = np.exp(np.linspace(math.log(r.eta) - 3, math.log(r.eta) + 3, 600))[:, None]
        alpha = np.exp(np.linspace(math.log(1 - r.beta) - 3, min(0.0, math.log(1 - r.beta) + 3), 600))[None, :]
        grid = evaluate(bound, **C, T=T, eta=eta, beta=1 - alpha).value
        assert r.value <= grid.min() * (1 + 1e-9)
        assert grid.min() <= r.value * (1 + 1e-3)


def test_leading_order_closed_forms_match_the_hand_derivation():
    L, D, T = S.L, S.Delta, S.T
    ss = S.rho * S.sigma
    for bound in LMO_BOUNDS:
        lo = leading_order(bound)
        (cv, rv), (ce, re), (ca, ra) = lo["value"], lo["eta"], lo["1-beta"]
        assert (rv, re, ra) == (sp.Rational(-1, 4), sp.Rational(-3, 4), sp.Rational(-1, 2)), bound.name
        assert sp.simplify(cv - 4 * (L * D * ss**2) ** sp.Rational(1, 4)) == 0
        assert sp.simplify(ce - D ** sp.Rational(3, 4) * L ** sp.Rational(-1, 4) / sp.sqrt(ss)) == 0
        assert sp.simplify(ca - 2 * sp.sqrt(L * D) / ss) == 0
        assert closed_form(bound).exponent == sp.Rational(-1, 4)
    # the exponent as a plain sympy limit of log(B*)/log(T), on the sync bound's closed form
    sigma_pos = sp.Symbol("sigma", positive=True)
    value = closed_form(lmo_bound(0)).value.subs(S.sigma, sigma_pos)
    assert sp.limit(sp.log(value) / sp.log(T), T, sp.oo) == sp.Rational(-1, 4)
    lo = leading_order(sgdm_bound(1))
    assert lo["value"][1] == sp.Rational(-1, 2)
    assert sp.simplify(lo["value"][0] - 2 * sp.sqrt(2 * L * D * S.sigma**2)) == 0


@pytest.mark.parametrize("bound", [lmo_bound(0), lmo_bound(2), lmo_bound(1, ef=True), sgdm_bound(1)],
                         ids=lambda b: b.name)
def test_exponents_are_minus_one_quarter_for_the_gradient_norm(bound):
    r = tune(bound, 1e5, C)
    assert r.exponent_norm == pytest.approx(-0.25, abs=1e-15)
    # independent of sympy: the numeric optimum decays like T^(-1/4) (norm scale)
    vals = [tune(bound, T, C).value ** (1 / bound.power) for T in (1e7, 1e9)]
    slope = math.log(vals[1] / vals[0]) / math.log(100)
    assert slope == pytest.approx(-0.25, abs=0.01)


def test_numeric_optimum_scales_like_the_closed_form_ansatz():
    # eta* ~ T^(-3/4) and 1 - beta* ~ T^(-1/2), found by scipy alone
    r1, r2 = tune(lmo_bound(1), 1e8, C), tune(lmo_bound(1), 1e10, C)
    assert math.log(r2.eta / r1.eta) / math.log(100) == pytest.approx(-0.75, abs=0.01)
    assert math.log((1 - r2.beta) / (1 - r1.beta)) / math.log(100) == pytest.approx(-0.5, abs=0.01)


def test_noise_free_tuning_has_beta_zero_and_rate_minus_one_half():
    c = dict(C, sigma=0.0)
    for tau in (0, 1, 2):
        r = tune(lmo_bound(tau), 1e4, c)
        assert r.regime == "noise-free" and r.beta == pytest.approx(0.0, abs=1e-6) and r.exponent == -0.5
        want = math.sqrt(2 * c["L"] * c["Delta"] * (1 + 4 * tau) / 1e4)
        assert r.value == pytest.approx(want, rel=1e-6)
        assert r.eta == pytest.approx(math.sqrt(c["Delta"] / (c["L"] * 1e4 * (0.5 + 2 * tau))), rel=1e-4)
    assert penalty_limit("lmo", noise_free=True).subs(S.tau, 1) == sp.sqrt(5)


def test_penalty_ratio_tends_to_one():
    for method, ef, nesterov in (("lmo", False, False), ("lmo", True, False), ("lmo", False, True),
                                 ("sgdm", False, False)):
        assert penalty_limit(method, ef, nesterov) == 1
    ratios = [delay_penalty(T, 1, C).ratio for T in (1e3, 1e5, 1e7)]
    assert ratios[0] > ratios[1] > ratios[2] > 1
    assert ratios[2] - 1 < 1e-3
    p = delay_penalty(1e5, 2, C, method="sgdm")
    assert p.ratio > 1 and p.limit == 1


def test_relative_penalty_at_fixed_beta_is_tau_one_minus_beta_over_beta():
    for beta, tau in ((0.9, 1), (0.95, 1), (0.99, 3)):
        p = delay_penalty(1e4, tau, C, beta=beta)
        assert p.delayed.beta == beta and p.sync.beta == beta
        assert p.relative_penalty == pytest.approx(tau * (1 - beta) / beta, rel=1e-12)
        # at fixed beta only the eta-part changes: sqrt(C_tau / C_0) with C = 1/2 + 2 beta/(1-beta) + 2 tau
        c0 = 0.5 + 2 * beta / (1 - beta)
        assert 1 < p.ratio < math.sqrt(1 + 2 * tau / c0)


@pytest.mark.parametrize("kw", [dict(T=0.5), dict(T=1e4, beta=1.0), dict(T=1e4, beta=-0.1),
                                dict(T=1e4, extra={"eta": 0.1}), dict(T=1e4, extra={"L": -1.0})])
def test_tune_bad_inputs_raise_value_error(kw):
    consts = dict(C, **kw.pop("extra", {}))
    with pytest.raises(ValueError):
        tune(lmo_bound(1), kw.pop("T"), consts, **kw)
    with pytest.raises(ValueError):
        delay_penalty(1e4, -1, C)
