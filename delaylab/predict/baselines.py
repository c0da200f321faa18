"""The cheap answers every predictor is scored beside: what a user gets without a model.

* ``constant +0.1``: the same gap for every cell;
* ``median of the other reports``: the median measured gap of the held-in cells;
* ``per-optimizer gap/tau``: the median of gap / mean delay over the held-in cells of the same
  optimizer without a corrector (correction ``none``), times the cell's mean delay; an optimizer
  no held-in cell has takes the median over every optimizer;
* ``pilot held, F``: the gap measured at the last validation within the first F of the updates,
  held to the end (F = 10%, 20%, 50%);
* ``NQM mc``: the noisy quadratic model's Monte Carlo prediction (``python -m
  delaylab.predict.nqm_score``, docs/nqm/score.json), for the cells it covers (cpu-small,
  cpu-tokens, cpu-delays), none elsewhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from delaylab.predict.base import BASELINE, Predictor
from delaylab.predict.cells import pilot_curve

NQM_SCORE = Path("docs/nqm/score.json")
NQM_KEY = ("report", "variant", "mode", "optimizer", "lr", "momentum", "steps", "batch_size", "sync_start",
           "sync_cooldown", "delay_dist")


def _none(cells):
    return None


def constant(value: float = 0.1) -> Predictor:
    return Predictor(f"constant {value:+g}", BASELINE, _none, lambda model, view: {"gap": value, "interval": None},
                     about="the same gap for every cell")


def median_other() -> Predictor:
    def fit(cells):
        return float(np.median([c["measured"]["gap"] for c in cells]))

    return Predictor("median of the other cells", BASELINE, fit, lambda m, view: {"gap": m, "interval": None},
                     about="the median measured gap of the held-in cells")


def gap_per_tau() -> Predictor:
    def fit(cells):
        plain = [c for c in cells if c["correction"] == "none" and c["mean_delay"] > 0]
        per = {}
        for c in plain:
            per.setdefault(c["optimizer"], []).append(c["measured"]["gap"] / c["mean_delay"])
        return {"per": {o: float(np.median(v)) for o, v in per.items()},
                "all": float(np.median([c["measured"]["gap"] / c["mean_delay"] for c in plain]))}

    def predict(m, view):
        return {"gap": m["per"].get(view["optimizer"], m["all"]) * view["mean_delay"], "interval": None}

    return Predictor("per-optimizer gap/tau", BASELINE, fit, predict,
                     about="median gap/tau of the held-in cells of the optimizer (no corrector), times tau")


def pilot_held(fraction: float) -> Predictor:
    def predict(m, view):
        curve = pilot_curve(view)
        return {"gap": curve[-1][1] if curve else None, "interval": None}

    return Predictor(f"pilot held, {fraction:.0%}", BASELINE, _none, predict, fraction,
                     about=f"the gap at the last validation within {fraction:.0%} of the updates, held to the end")


def nqm_key(cell: dict) -> str:
    return json.dumps([cell.get(k) for k in NQM_KEY] + [json.dumps(cell.get("delay"))])


def nqm_mc(path=NQM_SCORE) -> Predictor:
    """The NQM's Monte Carlo end gap as the NQM score computed it (no fit: the model is the theory's)."""
    def fit(cells):
        p = Path(path)
        if not p.is_file():
            return {}
        rows = json.loads(p.read_text())["cells"]
        return {nqm_key(r): r["predicted"]["mc"]["end_gap"] for r in rows if "mc" in r["predicted"]}

    return Predictor("NQM mc", BASELINE, fit, lambda m, view: {"gap": m.get(nqm_key(view)), "interval": None},
                     about="the noisy quadratic model, Monte Carlo of the real update (docs/nqm.md)")


def all_baselines(nqm_path=NQM_SCORE) -> list[Predictor]:
    return [constant(), median_other(), gap_per_tau(), pilot_held(0.1), pilot_held(0.2), pilot_held(0.5),
            nqm_mc(nqm_path)]
