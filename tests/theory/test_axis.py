"""The theory along the delay axis (``delaylab.theory.axis``) against hand formulas, the
time-domain recursion of the stability model, and, for a random delay, a run of the real
``Delayed`` optimizer in the drift phase where Lemma L3's bias is an equality."""

import json
import math

import numpy as np
import pytest
import torch

from delaylab.cli import main
from delaylab.optim import Delayed, LMOMomentum
from delaylab.optim.queue import DelayDistribution
from delaylab.theory.axis import TAUS, adam_point, axis_markdown, delay_axis, lmo_point
from delaylab.theory.stability import iterate


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("tau", [1, 2, 4, 8, 2.5])
def test_lmo_numbers_are_theorem_1_by_hand(tau, nesterov):
    """C_tau = 1/2 + 2 lag + 2 tau + the start-up term's eta part 2 beta^(p+1) / ((1-beta)^2 T),
    lag = beta/(1-beta) (Nesterov: beta^2/(1-beta), p = 2)."""
    beta, T = 0.95, 1000.0
    p = 2 if nesterov else 1
    lag = beta**p / (1 - beta)
    C = lambda t: 0.5 + 2 * lag + 2 * t + 2 * beta ** (p + 1) / ((1 - beta) ** 2 * T)  # noqa: E731
    got = lmo_point(beta, tau, nesterov, T)
    assert got.relative_penalty == pytest.approx(tau / lag, rel=1e-12)
    assert got.bound_ratio == pytest.approx(math.sqrt(C(tau) / C(0)), rel=1e-12)
    assert got.lr_shift * got.bound_ratio == pytest.approx(1.0, rel=1e-12)
    assert got.ef_drift_limit == pytest.approx(2 / (tau + 1))


@pytest.mark.parametrize("tau", TAUS)
def test_adam_limits_separate_decay_from_growth_in_the_recursion(tau):
    """At 0.9x each limit the method itself (iterated on x^2/2) decays; at 1.1x it grows."""
    beta = 0.9
    point = adam_point(beta, tau)
    for limit, ef in ((point.stable, False), (point.stable_ef, True), (point.stable_sync, False)):
        t = 0 if limit == point.stable_sync else tau
        assert iterate("adam", beta, t, ef, 0.9 * limit, 4000)[-1] < 1e-3
        assert np.nanmax(iterate("adam", beta, t, ef, 1.1 * limit, 4000)) > 1e3
    assert point.stable_sync == pytest.approx(2 * (1 + beta) / (1 - beta))
    if tau == 1:
        assert point.stable == pytest.approx(1.0) and point.stable_ef == pytest.approx((math.sqrt(1 + 4 / (1 - beta)) - 1) / 2)


def test_the_axis_table_is_monotone_in_tau():
    rows = delay_axis({"muon": ("lmo", 0.95, True), "adamw": ("adam", 0.9, False)})
    muon = [r for r in rows if r["optimizer"] == "muon"]
    adam = [r for r in rows if r["optimizer"] == "adamw"]
    assert [r["tau"] for r in muon] == list(TAUS)
    assert all(a["bound_ratio"] < b["bound_ratio"] for a, b in zip(muon, muon[1:]))
    assert all(a["stable"] > b["stable"] and a["stable_ef"] > b["stable_ef"] for a, b in zip(adam, adam[1:]))
    # EF widens Adam's stable range less and less as the delay grows (beta1 = 0.9)
    assert all(a["ef_gain"] > b["ef_gain"] > 1 for a, b in zip(adam, adam[1:]))
    table = axis_markdown(rows)
    assert "| muon | 0.95 (Nesterov) | 8 |" in table and "| adamw | 0.9 | 8 |" in table


def test_a_random_delay_enters_the_momentum_error_through_its_mean():
    """Sign-LMO momentum on f = L x^2 / 2 from far away (the drift phase): x falls by eta per
    step, and (m_t - f'(x_t)) / (L eta) settles at beta/(1-beta) + tau for a constant delay
    (theory notes, section 9) -- and at beta/(1-beta) + E tau for i.i.d. uniform delays, the
    mean that Theorem 1 then carries (docs/beyond.md)."""
    L, eta, beta, steps = 2.0, 1e-3, 0.9, 4000

    def error(delay):
        x = torch.tensor([50.0], dtype=torch.float64, requires_grad=True)
        opt = Delayed(LMOMomentum([x], lr=eta, beta=beta, norm="sign"), delay)
        errs = []
        for _ in range(steps):
            with opt.predicted_weights():
                x.grad = L * x.detach().clone()
            before = x.detach().clone()  # x_t: m_t is compared with f'(x_t)
            opt.step()
            if not opt.updated:  # the queue's fill calls (constant delay)
                continue
            m = opt.inner.state[x]["momentum_buffer"]
            errs.append(((m - L * before) / (L * eta)).item())
        return np.array(errs[steps // 2:])  # after the start-up

    lag = beta / (1 - beta)
    for dist, mean in (("uniform:0-4", 2.0), ("cycle:0,4", 2.0), ("uniform:1-8", 4.5)):
        e = error(DelayDistribution.parse(dist, seed=2))
        assert abs(e.mean() - (lag + mean)) < 0.05, (dist, e.mean())
    # the constant delay is an equality (to the start-up's geometric tail)
    assert np.abs(error(2) - (lag + 2)).max() < 1e-6


def test_the_command_prints_the_rows_and_draws_the_figure(tmp_path, capsys):
    png = tmp_path / "axis.png"
    code = main(["theory", "axis", "--taus", "1,2,4,8", "--plot", str(png), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and len(data["rows"]) == 8 and png.stat().st_size > 10_000
    muon = next(r for r in data["rows"] if r["optimizer"] == "muon" and r["tau"] == 8)
    assert muon["nesterov"] and muon["relative_penalty"] == pytest.approx(8 * 0.05 / 0.95**2)
    for argv, msg in ((["--taus", "2.5"], "constant integer delay"), (["--optimizers", "sgd"], "no model")):
        assert main(["theory", "axis", *argv]) == 2 and msg in capsys.readouterr().err
