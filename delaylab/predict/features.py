"""What a predictor may compute from a view of a cell (:mod:`delaylab.predict.cells`), in one place.

* :func:`settings`: the settings alone, through the theory. ``margin`` is the log of the lr over
  the largest stable lr at the cell's delay and corrector, up to a constant of the model: for
  Adam-type optimizers (AdamW, SOAP, Adan, MARS) the frozen-preconditioner limit of
  :func:`delaylab.theory.stability.max_stable` (``lr / limit(beta1, tau, ef)``, whose ratio
  to sync's is 1/38 at beta1 0.9 and tau 1 and falls about like 1/tau beyond); for LMO
  optimizers (Muon, Lion), which have no such limit, Theorem 1's delay term over its momentum
  term, ``lr * tau (1-beta)/beta^2`` with Nesterov momentum
  (:func:`delaylab.reproduce.predict.lmo_relative_penalty`). A fractional mean delay (per-stage,
  random) is interpolated between the integers around it; below 1 it counts as 1 (any delayed
  stage meets the delayed limit).
* :func:`sync_curve`: the sync runs' mean val loss by update, and :func:`curve_features` of it.
* :func:`pilot`: the pilot's gap at its last validation (mean over seeds) and its spread.
* :func:`dense_pilot`: the dense pilot's paired train-loss gap over the last quarter of its
  updates, and its trend from the quarter before (:mod:`delaylab.predict.pilots`).
"""

from __future__ import annotations

import functools
import math

import numpy as np

ADAM, LMO = "adam", "lmo"
CORRECTORS = ("ef", "predict", "dc")  # indicator features; "ef+predict" sets the first two


def kind(optimizer: str) -> str:
    from delaylab.reproduce.predict import kind as theory_kind

    k = theory_kind(optimizer)
    return LMO if k == "lmo" else ADAM


@functools.lru_cache(maxsize=None)
def _adam_limit(beta: float, tau: int, ef: bool) -> float:
    from delaylab.theory.stability import max_stable

    return max_stable("adam", beta, tau, ef and tau > 0)


@functools.lru_cache(maxsize=None)
def _lmo_penalty(beta: float, nesterov: bool, tau: float) -> float:
    from delaylab.reproduce.predict import lmo_relative_penalty

    return lmo_relative_penalty(beta, tau, nesterov)


def margin(optimizer: str, momentum, lr: float, tau: float, ef: bool) -> float:
    """log(lr / the delayed stable limit) for Adam-type optimizers, log(lr * Theorem 1's relative
    delay penalty) for LMO ones (see the module doc)."""
    from delaylab.reproduce.predict import direction_beta

    beta, nesterov = direction_beta(optimizer, momentum)
    if kind(optimizer) == LMO:
        return math.log(lr * _lmo_penalty(beta, nesterov, max(tau, 1e-3)))
    t = max(tau, 1.0)
    lo, hi = math.floor(t), math.ceil(t)
    a, b = math.log(_adam_limit(beta, lo, ef)), math.log(_adam_limit(beta, hi, ef))
    return math.log(lr) - (a + (b - a) * (t - lo))


def settings(view: dict) -> dict:
    """Features of the settings (no run read): the constant, the optimizer's kind, the margin
    (per kind, and its square), the mean delay, updates, batch, model size, schedule, the
    corrector and the share of sync updates."""
    adam = kind(view["optimizer"]) == ADAM
    corr = view["correction"]
    ef = corr in ("ef", "ef+predict")
    x = margin(view["optimizer"], view["momentum"], view["lr"], view["mean_delay"], ef)
    steps = view["steps"]
    return {"1": 1.0, "adam": float(adam), "margin_adam": x * adam, "margin_lmo": x * (not adam),
            "margin2_adam": x * x * adam, "margin2_lmo": x * x * (not adam),
            "log_tau": math.log(max(view["mean_delay"], 0.25)), "log_lr": math.log(view["lr"]),
            "log_steps": math.log(steps), "log_steps_adam": math.log(steps) * adam,
            "log_batch": math.log(view["batch_size"]), "log_params": math.log(view["params"] or 1.0),
            "constant_lr": float(view["lr_schedule"] == "constant"),
            "ef": float(ef), "predict": float(corr in ("predict", "ef+predict")),
            "dc": float(corr.startswith("dc")),
            "sync_start": view["sync_start"] / steps, "sync_cooldown": view["sync_cooldown"] / steps}


def sync_curve(runs: list[dict]) -> list[tuple[int, float]]:
    """The mean val loss over the runs at each update every run with a curve logged (a run that
    kept none, as one committed run did, is left out)."""
    logged = [r for r in runs if r["curve"]]
    at: dict = {}
    for r in logged:
        for u, v in r["curve"]:
            at.setdefault(u, []).append(v)
    return [(u, float(np.mean(v))) for u, v in sorted(at.items()) if len(v) == len(logged)]


def curve_features(view: dict) -> dict:
    """Features of the full sync curve: its end loss and the log of its drop over the second half."""
    curve = sync_curve(view["sync"])
    u = np.array([p[0] for p in curve], float)
    loss = np.array([p[1] for p in curve])
    half = float(np.interp(view["steps"] / 2, u, loss))
    return {"sync_end": float(loss[-1]), "log_late_drop": math.log(max(half - loss[-1], 0.0) + 1e-3)}


PILOT_FLOOR = 0.005  # a pilot gap below this (or negative) is read as this in log space


def pilot(view: dict) -> dict:
    """The pilot's gap at its last validation (the mean over seeds, paired by seed), the log of it
    (floored), the per-seed spread, and whether the pilot had a validation at all."""
    from delaylab.predict.cells import pilot_curve

    curve = pilot_curve(view)
    if not curve:
        return {"pilot_gap": None, "log_pilot": math.log(PILOT_FLOOR), "pilot_missing": 1.0, "pilot_at": 0.0}
    u, g = curve[-1]
    return {"pilot_gap": g, "log_pilot": math.log(max(g, PILOT_FLOOR)), "pilot_missing": 0.0,
            "pilot_at": u / view["steps"]}


def _quarter_gaps(view: dict) -> tuple[float, float] | None:
    """The paired train-loss gap (delayed - sync, bin by bin: the two runs of a seed drew the same
    batches) averaged over the pilot's last quarter of updates and over the quarter before, then over
    seeds; None where a run has no dense pilot or a quarter holds no bin both runs logged."""
    last = view["pilot_updates"]
    per_seed = []
    for a, b in zip(view["sync"], view["delayed"]):
        if not a.get("train") or not b.get("train"):
            return None
        at = dict((u, v) for u, v in a["train"])
        gaps = [(u, v - at[u]) for u, v in b["train"] if u in at]
        q4 = [g for u, g in gaps if u > 0.75 * last]
        q3 = [g for u, g in gaps if 0.5 * last < u <= 0.75 * last]
        if not q4 or not q3:
            return None
        per_seed.append((float(np.mean(q4)), float(np.mean(q3))))
    if not per_seed:
        return None
    return float(np.mean([p[0] for p in per_seed])), float(np.mean([p[1] for p in per_seed]))


def dense_pilot(view: dict) -> dict:
    """``log_tg``: the log of the last quarter's paired train-loss gap (floored as :func:`pilot`'s);
    ``tg_trend``: it minus the log of the quarter before (the gap growing: > 0); where the pilot is
    not dense (``dense_missing`` 1) the val pilot's log gap stands in and the trend is 0."""
    q = _quarter_gaps(view)
    if q is None:
        return {"log_tg": pilot(view)["log_pilot"], "tg_trend": 0.0, "dense_missing": 1.0}
    g4, g3 = (math.log(max(g, PILOT_FLOOR)) for g in q)
    return {"log_tg": g4, "tg_trend": g4 - g3, "dense_missing": 0.0}
