"""The noisy quadratic model at the edge of stability, calibrated on the held-in cells.

The NQM score (:mod:`delaylab.predict.nqm_score`, docs/nqm.md) gives each covered cell the
model's end gap: ``diag-eos`` for Adam-type optimizers (each curve's curvatures capped at 0.9 of
its own stability limit), the Monte Carlo of the real update for Muon and Lion. Uncalibrated it
is 10^-4 to 10^-3 of the measured AdamW gap with either sign; here a per-kind line in log space,
``log gap = a_kind + b_kind log(max(nqm, 1e-6)) + c [nqm <= 0]``, is fitted on the held-in cells
it covers. Cells the NQM score does not cover (no spectrum of their model) get no prediction.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from delaylab.predict import features as F
from delaylab.predict import regression
from delaylab.predict.base import SYNC, Predictor, from_log
from delaylab.predict.baselines import NQM_SCORE, nqm_key
from delaylab.predict.cells import sync_view

NAMES = ["1", "adam", "log_nqm_adam", "log_nqm_lmo", "nqm_nonpositive"]


def _table(path) -> dict:
    p = Path(path)
    if not p.is_file():
        return {}
    out = {}
    for r in json.loads(p.read_text())["cells"]:
        pred = r["predicted"].get("diag-eos") or r["predicted"].get("mc")
        if pred is not None and pred["end_gap"] is not None:
            out[nqm_key(r)] = pred["end_gap"]
    return out


def _features(view, table):
    g = table.get(nqm_key(view))
    if g is None:
        return None
    adam = F.kind(view["optimizer"]) == F.ADAM
    z = math.log(max(g, 1e-6))
    return {"1": 1.0, "adam": float(adam), "log_nqm_adam": z * adam, "log_nqm_lmo": z * (not adam),
            "nqm_nonpositive": float(g <= 0)}


def nqm_eos(path=NQM_SCORE) -> Predictor:
    def fit(cells):
        table = _table(path)
        rows, target, groups = [], [], []
        for c in cells:
            f = _features(sync_view(c), table)
            if f is not None:
                rows.append(f)
                target.append(regression.log_gap(c["measured"]["gap"]))
                groups.append(c["report"])
        if len(rows) < len(NAMES) + 1:
            return None
        return table, regression.fit(rows, NAMES, target, groups)

    def predict(model, view):
        if model is None:
            return {"gap": None, "interval": None}
        table, ridge = model
        f = _features(view, table)
        return {"gap": None, "interval": None} if f is None else from_log(ridge.predict(f), ridge)

    return Predictor("NQM at the edge of stability, calibrated", SYNC, fit, predict,
                     about="docs/nqm's diag-eos (Adam-type) / mc (Muon, Lion) gap, a log-linear map per kind")
