"""The protocol's pure pieces: presets' rules, lr neighbourhoods, the lr optimum, ratios, Theorem 1's lr shift."""

import math

import numpy as np
import pytest

from delaylab.errors import ConfigError
from delaylab import stats as ST
from delaylab.llm import metrics
from delaylab.reproduce import PRESETS, plan, predict
from delaylab.reproduce.plan import check_protocol


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_keeps_the_momentum_rules(name):
    check_protocol(PRESETS[name])


def test_check_protocol_refuses_a_grid_that_breaks_a_rule():
    from dataclasses import replace

    p = PRESETS["cpu-small"]
    with pytest.raises(ConfigError, match="beta2"):
        check_protocol(replace(p, llm=replace(p.llm, momenta={"adamw": (0.9, 0.98)})))
    with pytest.raises(ConfigError, match="updates after warmup"):
        check_protocol(replace(p, llm=replace(p.llm, momenta={"muon": (0.98,)})))


def test_axis_steps_give_the_stated_tokens_per_parameter():
    from delaylab.llm.model import GPT, preset

    p = PRESETS["cpu-tokens"]
    s = p.scale
    assert s.points() == [("tiny", 0.5), ("tiny", 2.0), ("tiny", 5.0), ("tiny", 20.0), ("small", 0.5)]
    for size, ratio in s.points():
        params = sum(x.numel() for x in GPT(preset(size, vocab_size=256, block_size=s.block_size)).parameters())
        base = plan.axis_base(p, size, ratio)
        tokens = base["steps"] * s.batch_size[size] * s.block_size
        assert abs(tokens / params - ratio) < 0.005 * ratio
        for opt in s.optimizers:  # every point keeps the protocol (Muon 0.95: 200 updates after warmup)
            assert base["steps"] - base["steps"] // 20 >= 10 / (1 - s.momentum[opt])


def test_protocol_issues_name_the_rule_broken():
    from delaylab.reproduce.verdicts import protocol_issues

    assert protocol_issues("muon", 0.95, 220, None) == []  # 209 after warmup >= 200
    assert "200 updates" in protocol_issues("muon", 0.95, 200, None)[0]  # cpu-quick before issue 24: 190
    assert "1000 updates" in protocol_issues("lion", None, 300, None)[0]  # Lion's buffer beta2 0.99
    assert "beta2" in protocol_issues("adamw", 0.98, 10000, None)[0]
    assert protocol_issues("adamw", 0.9, 300, 75) == []  # 225 >= 100


def test_neighbours_are_three_grid_lrs_around_the_best():
    grid = [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2]
    assert plan.neighbours(grid, 4e-3) == [2e-3, 4e-3, 8e-3]
    assert plan.neighbours(grid, 1e-3) == [1e-3, 2e-3, 4e-3]  # at the edge: the three nearest
    assert plan.neighbours(grid, 1.6e-2) == [4e-3, 8e-3, 1.6e-2]
    assert plan.neighbours([1e-3, 3e-3], 3e-3) == [1e-3, 3e-3]


def test_optimum_is_a_log_parabola_vertex_or_censored():
    lrs = [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2]
    star = 3.1e-3
    losses = [2.0 + 0.3 * (math.log(lr) - math.log(star)) ** 2 for lr in lrs]
    o = metrics.optimum(lrs, losses)
    assert math.isclose(o["lr"], star, rel_tol=1e-10) and o["grid_lr"] == 4e-3 and o["censored"] is None
    # at the grid's edge the optimum is censored: the grid point, no vertex
    o = metrics.optimum(lrs, [5, 4, 3, 2, 1])
    assert (o["lr"], o["censored"], o["fitted"]) == (1.6e-2, "high", False)
    assert metrics.optimum(lrs, [1, 2, 3, 4, 5])["censored"] == "low"
    # a diverged neighbour: bracketed, but no parabola through it
    o = metrics.optimum(lrs, [3, 2, None, 2.5, 3])
    assert (o["lr"], o["censored"], o["fitted"]) == (2e-3, None, False)


def test_lr_shift_ratio_interval_and_censoring():
    lrs = [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2]
    rng = np.random.default_rng(1)
    base, other = {}, {}
    for lr in lrs:
        base[lr] = {s: (math.log(lr) - math.log(4e-3)) ** 2 + 0.01 * rng.normal() for s in range(4)}
        other[lr] = {s: (math.log(lr) - math.log(2e-3)) ** 2 + 0.01 * rng.normal() for s in range(4)}
    out = metrics.lr_shift(base, other)
    means_b = [np.mean(list(base[lr].values())) for lr in lrs]
    means_o = [np.mean(list(other[lr].values())) for lr in lrs]
    assert math.isclose(out["ratio"], metrics.optimum(lrs, means_o)["lr"] / metrics.optimum(lrs, means_b)["lr"])
    assert out["grid"] == 0.5 and not out["censored"]
    assert out["ci"][0] <= out["ratio"] <= out["ci"][1] and out["ci"][0] <= 0.5 <= out["ci"][1]
    # the interval by hand: each vertex's Fieller interval at 97.5% from the per-seed parabolas
    def vertex_ci(grid, trio):
        a, b = [], []
        for s in range(4):
            A, B, _ = np.polyfit(np.log(trio), [grid[lr][s] for lr in trio], 2)
            a.append(A)
            b.append(-B / 2)
        return ST.fieller(b, a, 0.975)["ci"]

    vb, vo = vertex_ci(base, [2e-3, 4e-3, 8e-3]), vertex_ci(other, [1e-3, 2e-3, 4e-3])
    assert out["ci"] == pytest.approx([math.exp(vo[0] - vb[1]), math.exp(vo[1] - vb[0])], rel=1e-8)
    # the other optimum beyond the grid's low end: censored, no interval
    low = {lr: {s: math.log(lr) + 0.01 * s for s in range(4)} for lr in lrs}  # rising: best at the lowest lr
    cen = metrics.lr_shift(base, low)
    assert cen["censored"] and cen["ci"] is None and cen["other"]["censored"] == "low" and cen["grid"] == 0.25


def test_mean_ratio_by_hand():
    num, den = {0: 0.3, 1: 0.5, 2: 0.4}, {0: 0.2, 1: 0.2, 2: 0.3}
    out = metrics.mean_ratio(num, den)
    assert math.isclose(out["ratio"], 0.4 / (0.7 / 3))
    assert out["ci"][0] <= out["ratio"] <= out["ci"][1] and out["unstable"] is False
    bad = metrics.mean_ratio({0: 1.0, 1: 1.0}, {0: 0.1, 1: -0.1})
    assert bad["unstable"] is True and bad["ci"] is None


@pytest.mark.parametrize("beta", [0.8, 0.9, 0.95])
def test_theorem_1_lr_shift_is_the_closed_form(beta):
    """eta* ~ 1/sqrt(sum of the eta-linear coefficients): L/2 + 2 L beta^2/(1-beta) (Nesterov), + 2 L tau."""
    c = 0.5 + 2 * beta**2 / (1 - beta)
    assert math.isclose(predict.lmo_lr_shift(beta, True, 1, T=1e12), math.sqrt(c / (c + 2)), rel_tol=1e-6)


def test_loading_a_preset_builds_no_model_and_imports_no_planner():
    """presets.py is data: the protocol check (which counts a GPT's parameters) lives in plan.py."""
    import subprocess
    import sys

    code = ("import sys; from delaylab.reproduce.presets import get_preset; get_preset('cpu-tokens'); "
            "print(sorted(m for m in ('delaylab.reproduce.plan', 'delaylab.llm.model', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
