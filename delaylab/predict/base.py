"""What a gap predictor is, and how a fitted one is made from features.

A :class:`Predictor` is fitted on the held-in cells of a fold (whole cells: measured gaps,
curves) and predicts a held-out cell from its *view* alone: :func:`~delaylab.predict.cells.sync_view`
for a sync-only predictor (and for a baseline that reads no run), or
:func:`~delaylab.predict.cells.pilot_view` at its ``fraction`` for a pilot. The harness makes the
view; a predictor never holds the held-out cell itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from delaylab.predict import regression
from delaylab.predict.cells import pilot_view, sync_view

BASELINE, SYNC, PILOT = "baseline", "sync", "pilot"


@dataclass(frozen=True)
class Predictor:
    """``fit(held-in cells) -> model``; ``predict(model, view) -> {"gap": float | None, "interval":
    [lo, hi] | None}``. ``fraction``: the pilot's share of the updates (None: the view has no
    delayed run). ``about``: one line for the table."""

    name: str
    kind: str
    fit: Callable[[list[dict]], object]
    predict: Callable[[object, dict], dict]
    fraction: float | None = None
    about: str = ""

    def view(self, cell: dict) -> dict:
        return view(cell, self.fraction)


def view(cell: dict, fraction: float | None) -> dict:
    """What a predictor of that pilot ``fraction`` (None: sync-only) sees of a cell."""
    return sync_view(cell) if fraction is None else pilot_view(cell, fraction)


def ridge(name: str, kind: str, features: Callable[[dict], dict], names: list[str], about: str,
          fraction: float | None = None, offset: Callable[[dict], float] | None = None) -> Predictor:
    """A predictor of ``log(max(gap, FLOOR)) - offset(view)`` by :func:`delaylab.predict.regression.fit`
    on ``features(view)``; the held-in cells' reports are the groups its penalty is chosen on. Its
    interval is the 95% t band of the leave-one-report-out residuals of the held-in cells."""
    off = offset or (lambda v: 0.0)

    def fit(cells):
        views = [view(c, fraction) for c in cells]
        rows = [features(v) for v in views]
        target = [regression.log_gap(c["measured"]["gap"]) - off(v) for c, v in zip(cells, views)]
        return regression.fit(rows, names, target, [c["report"] for c in cells])

    def predict(model, v):
        return from_log(model.predict(features(v)) + off(v), model)

    return Predictor(name, kind, fit, predict, fraction, about)


def from_log(mean: float, model: regression.Ridge) -> dict:
    """A predicted log gap as the gap and its 95% band (t at the residuals' degrees of freedom)."""
    from delaylab.stats import t_quantile

    half = float(t_quantile(model.dof + 1)) * model.sigma if math.isfinite(model.sigma) else math.inf
    return {"gap": math.exp(mean), "interval": [math.exp(mean - half), math.exp(mean + half)]}
