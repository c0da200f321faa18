"""The token-tax model: the delayed run is the sync run at a slower effective speed.

A delayed run that needs ``k`` times the updates to reach the sync run's loss ends where the sync
run stood at ``T / k``: the predicted gap is ``L_sync(T / k) - L_sync(T)``, read off the cell's own
sync curve (interpolated in log update). The tax ``k - 1`` is fitted on the held-in cells: each
one's ``k`` is where its sync curve is its measured gap above its end, and ``log(k - 1)`` is a
ridge law of the settings (:func:`delaylab.predict.features.settings`), so the stability margin
sets the speed and the sync curve turns it into loss: a run still falling fast pays more loss
for the same tax than one that has flattened. The tax is taken proportional to the mean delay, as
the gap of the tau laws (:mod:`delaylab.predict.law`): the fit is of ``log((k - 1) / tau)`` on
their features.
"""

from __future__ import annotations

import math

import numpy as np

from delaylab.predict import features as F
from delaylab.predict import regression
from delaylab.predict.base import SYNC, Predictor, from_log
from delaylab.predict.cells import sync_view
from delaylab.predict.law import LAW_TAU, tau_features, tau_offset

MIN_TAX = 0.01  # k - 1 below this (a gap at or below 0) is fitted as this


def _curve(view):
    c = F.sync_curve(view["sync"])
    return np.log([p[0] for p in c]), np.array([p[1] for p in c])


def tax_of(view: dict, gap: float) -> float:
    """The k - 1 at which the sync curve stands ``gap`` above its end (the first validation's
    update bounds it; a gap at or below 0 gives MIN_TAX)."""
    logu, loss = _curve(view)
    end = loss[-1]
    if gap <= 0:
        return MIN_TAX
    # walking back from the end, the first update where the loss is gap above the end
    for i in range(len(loss) - 2, -1, -1):
        if loss[i] - end >= gap:
            lo, hi = loss[i], loss[i + 1]
            frac = (end + gap - hi) / (lo - hi) if lo != hi else 0.0
            at = logu[i + 1] + frac * (logu[i] - logu[i + 1])
            return max(math.exp(logu[-1] - at) - 1, MIN_TAX)
    return max(math.exp(logu[-1] - logu[0]) - 1, MIN_TAX)


def gap_at(view: dict, tax: float) -> float:
    """``L_sync(T / (1 + tax)) - L_sync(T)`` on the sync curve (held at its first validation before it)."""
    logu, loss = _curve(view)
    at = logu[-1] - math.log1p(tax)
    return float(np.interp(at, logu, loss) - loss[-1])


def token_tax() -> Predictor:
    def fit(cells):
        views = [sync_view(c) for c in cells]
        target = [math.log(tax_of(v, c["measured"]["gap"])) - tau_offset(v) for c, v in zip(cells, views)]
        return regression.fit([tau_features(v) for v in views], LAW_TAU, target, [c["report"] for c in cells])

    def predict(model, view):
        tax = from_log(model.predict(tau_features(view)) + tau_offset(view), model)  # the tax and its band
        return {"gap": gap_at(view, tax["gap"]), "interval": [gap_at(view, t) for t in tax["interval"]]}

    return Predictor("token tax", SYNC, fit, predict,
                     about="the sync curve read at T/k, the tax k-1 a law of the settings")
