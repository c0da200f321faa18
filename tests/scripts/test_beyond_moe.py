"""The statistics of scripts/beyond_moe.py: Fieller's interval for a ratio of paired means."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

spec = importlib.util.spec_from_file_location("beyond_moe", Path(__file__).parents[2] / "scripts" / "beyond_moe.py")
beyond = importlib.util.module_from_spec(spec)
spec.loader.exec_module(beyond)


def test_fieller_with_an_exact_denominator_is_the_t_interval_scaled():
    a = np.array([0.3, 0.5, 0.2, 0.45])
    b = np.full(4, 0.8)
    lo, hi = beyond.fieller(a, b)
    t_lo, t_hi = beyond.t_interval(a)
    assert lo == pytest.approx(t_lo / 0.8, rel=1e-12) and hi == pytest.approx(t_hi / 0.8, rel=1e-12)


def test_fieller_endpoints_solve_its_equation_and_an_unresolved_denominator_is_undetermined():
    rng = np.random.default_rng(0)
    b = 1.0 + 0.2 * rng.standard_normal(5)
    a = 0.5 * b + 0.1 * rng.standard_normal(5)
    lo, hi = beyond.fieller(a, b)
    t = stats.t.ppf(0.975, 4)
    for r in (lo, hi):
        d = a - r * b
        assert abs(d.mean()) == pytest.approx(t * d.std(ddof=1) / np.sqrt(5), rel=1e-9)
    assert lo < a.mean() / b.mean() < hi
    assert beyond.fieller(a, np.array([0.1, -0.2, 0.15, -0.05, 0.02])) is None
