"""Linear stability: textbook thresholds, closed forms, Jury vs roots vs the iterated method."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import sympy as sp

from delaylab.theory.stability import (beta_sym, char_poly, coefficients, h_sym, is_schur_stable, iterate,
                                       max_stable, spectral_radius, threshold_closed_form, z)


def test_textbook_thresholds():
    assert max_stable("gd", 0.0, 0) == pytest.approx(2.0, rel=1e-9)
    assert max_stable("gd", 0.0, 1) == pytest.approx(1.0, rel=1e-9)
    for tau in range(2, 7):
        assert max_stable("gd", 0.0, tau) == pytest.approx(2 * math.sin(math.pi / (2 * (2 * tau + 1))), rel=1e-9)
    for beta in (0.0, 0.5, 0.9, 0.99):
        assert max_stable("heavyball", beta, 0) == pytest.approx(2 * (1 + beta), rel=1e-9)
        assert max_stable("ema", beta, 0) == pytest.approx(2 * (1 + beta) / (1 - beta), rel=1e-9)
    # Adam with a frozen preconditioner at beta1 = 0.9: 38 in sync (Cohen et al.), 1 under delay 1
    assert max_stable("adam", 0.9, 0) == pytest.approx(38.0, rel=1e-9)
    assert max_stable("adam", 0.9, 1) == pytest.approx(1.0, rel=1e-9)


CASES = [(m, b, t, e) for m in ("gd", "heavyball", "ema") for b in ((0.0,) if m == "gd" else (0.0, 0.3, 0.5, 0.9, 0.99))
         for t, e in ((0, False), (1, False), (1, True), (3, False), (2, True))]


@pytest.mark.parametrize("method,beta,tau,ef", CASES)
def test_closed_forms_and_iteration_agree_with_the_jury_threshold(method, beta, tau, ef):
    hmax = max_stable(method, beta, tau, ef)
    cf = threshold_closed_form(method, beta, tau, ef)
    if cf is not None:
        assert hmax == pytest.approx(cf, rel=1e-9)
    # numpy roots: radius < 1 just inside the threshold, > 1 just outside
    assert spectral_radius(method, beta, tau, ef, hmax * (1 - 1e-6)) < 1
    assert spectral_radius(method, beta, tau, ef, hmax * (1 + 1e-6)) > 1
    # iterating the method itself: decays at 0.9x, grows at 1.1x
    for factor, grows in ((0.9, False), (1.1, True)):
        r = spectral_radius(method, beta, tau, ef, factor * hmax)
        steps = int(min(20000, 40 / abs(math.log(r)) + 100))
        x = iterate(method, beta, tau, ef, factor * hmax, steps)
        if grows:
            assert x[-1] > 1e3 * max(1.0, x[:tau + 3].max())
        else:
            assert x[-50:].max() < 1e-3 * x[:50].max()


def test_jury_matches_numpy_roots_on_a_grid():
    rng = np.random.default_rng(0)
    n = 0
    for method in ("heavyball", "ema"):
        for tau in range(4):
            for ef in (False, True):
                for _ in range(40):
                    beta, hh = rng.uniform(0, 0.99), math.exp(rng.uniform(-4, 4))
                    r = spectral_radius(method, beta, tau, ef, hh)
                    if abs(r - 1) > 1e-8:
                        assert is_schur_stable(coefficients(method, beta, tau, ef, hh)) == (r < 1)
                        n += 1
    assert n > 500


def test_jury_is_exact_with_rational_coefficients():
    # EF lag 1, EMA at beta = 1/2: the closed form says eta*lambda = 1 exactly
    p = char_poly("ema", 1, True).as_expr()
    for hh, want in ((Fraction(999_999, 1_000_000), True), (Fraction(1_000_001, 1_000_000), False)):
        poly = sp.Poly(p.subs({h_sym: sp.Rational(hh.numerator, hh.denominator), beta_sym: sp.Rational(1, 2)}), z)
        coeffs = [Fraction(int(c.p), int(c.q)) for c in poly.all_coeffs()]
        assert is_schur_stable(coeffs) is want
    # at the threshold two roots sit on the unit circle and the third is a = (1-beta) h
    roots = sp.Poly(p.subs({h_sym: 1, beta_sym: sp.Rational(1, 2)}), z).nroots()
    mods = sorted(abs(complex(r)) for r in roots)
    assert mods == pytest.approx([0.5, 1.0, 1.0], abs=1e-12)


def test_ef_shrinks_the_region_below_beta_half_and_widens_it_above():
    assert max_stable("ema", 0.3, 1, ef=True) < max_stable("ema", 0.3, 1)
    assert max_stable("ema", 0.5, 1, ef=True) == pytest.approx(max_stable("ema", 0.5, 1), rel=1e-9)
    assert max_stable("ema", 0.9, 1, ef=True) > max_stable("ema", 0.9, 1)


@pytest.mark.parametrize("kw", [dict(method="adamw"), dict(beta=1.0), dict(beta=-0.1), dict(tau=-1),
                                dict(tau=1.5), dict(method="gd", beta=0.5)])
def test_bad_inputs_raise_value_error(kw):
    args = dict(method="ema", beta=0.9, tau=1)
    args.update(kw)
    with pytest.raises(ValueError):
        max_stable(args["method"], args["beta"], args["tau"])
