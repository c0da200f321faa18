"""The theory side of the report against hand-derived closed forms (docs/theory.md)."""

import math

import pytest

from delaylab.reproduce import predict


@pytest.mark.parametrize("beta", [0.5, 0.9, 0.95, 0.99])
def test_lmo_relative_penalty_is_tau_over_the_momentum_lag(beta):
    # Theorem 1: delay term 2 L eta tau, momentum term 2 L eta beta/(1-beta) (beta^2/(1-beta) with Nesterov)
    assert math.isclose(predict.lmo_relative_penalty(beta, 1), (1 - beta) / beta, rel_tol=1e-12)
    assert math.isclose(predict.lmo_relative_penalty(beta, 2, nesterov=True), 2 * (1 - beta) / beta**2, rel_tol=1e-12)


@pytest.mark.parametrize("beta", [0.6, 0.9, 0.95])
def test_adam_stable_ranges_match_the_closed_forms(beta):
    pred = predict.optimizer_prediction("adamw", beta)
    assert pred["kind"] == "adam" and pred["beta"] == beta
    assert math.isclose(pred["stable_sync"], 2 * (1 + beta) / (1 - beta), rel_tol=1e-9)
    assert math.isclose(pred["stable_delayed"], 1.0, rel_tol=1e-9)
    assert math.isclose(pred["stable_ef"], (math.sqrt(1 + 4 / (1 - beta)) - 1) / 2, rel_tol=1e-9)


def test_direction_beta_follows_the_factory():
    assert predict.direction_beta("muon", 0.8) == (0.8, True)  # torch.optim.Muon with nesterov=True
    assert predict.direction_beta("adamw", 0.85) == (0.85, False)
    beta, nesterov = predict.direction_beta("lion", 0.97)  # Lion's momentum knob is its buffer's beta2
    assert (beta, nesterov) == (0.97, True)
    assert predict.optimizer_prediction("sgd")["kind"] is None


def test_undelayed_share_of_the_delay_term():
    base = dict(steps=40, lr_schedule="constant", warmup=0)
    assert math.isclose(predict.undelayed_share(base, first=10), 0.25)
    assert math.isclose(predict.undelayed_share(base, last=4), 0.1)
    # linear warmup of 8 updates, then constant: the first 8 carry (1+...+8)/8 = 4.5 of the 4.5 + 29 lr units
    warm = dict(steps=37, lr_schedule="constant", warmup=8)
    assert math.isclose(predict.undelayed_share(warm, first=8), 4.5 / (4.5 + 29), rel_tol=1e-12)
