"""The scoring harness: every predictor, every fold, beside the baselines.

Folds (named, fixed): ``report`` (leave one report out: the held-in cells are every other
report's), ``optimizer`` (leave one optimizer out) and ``tau`` (leave one mean delay out). In each,
a predictor is fitted on the held-in cells alone and predicts each held-out cell from its view
(:mod:`delaylab.predict.base`). The scores are :mod:`delaylab.predict.metrics`'; the seed-noise
floor is computed on the same cells.

Which predictors are named: the sync-only candidate and the pilot candidate with the most cells
within x2 on leave-one-report-out (ties: the larger Spearman). That choice reads held-out
scores, so the chosen ones are scored once more on fresh cells no predictor has seen
(:mod:`delaylab.predict.fresh`).
"""

from __future__ import annotations

import math
import time

from delaylab.predict import baselines, bound, law, nqm_eos, pilot, token_tax
from delaylab.predict import metrics as M
from delaylab.predict.base import PILOT, SYNC, Predictor
from delaylab.predict.cells import cell_id

FOLDS = {"report": lambda c: c["report"], "optimizer": lambda c: c["optimizer"], "tau": lambda c: c["mean_delay"]}
PRIMARY = "report"
# The 193 cells docs/nqm/score.json covers (and the issue's goals count on): these reports' cells.
NQM_REPORTS = ("cpu-small", "cpu-tokens", "cpu-delays")


def candidates(nqm_path=baselines.NQM_SCORE) -> list[Predictor]:
    """Every predictor the harness scores: the baselines, the sync-only candidates, the pilot."""
    return [*baselines.all_baselines(nqm_path), law.law(), law.law_tau(), law.law_curve(), bound.bound(),
            token_tax.token_tax(), nqm_eos.nqm_eos(nqm_path), pilot.pilot(), pilot.pilot_margin(),
            pilot.pilot_dense(), pilot.pilot_ratio()]


def held_out(p: Predictor, cells: list[dict], fold: str) -> list[dict]:
    """``p``'s prediction of every cell with the cell's group of ``fold`` held out of its fit."""
    key = FOLDS[fold]
    out: list = [None] * len(cells)
    groups: dict = {}
    for i, c in enumerate(cells):
        groups.setdefault(key(c), []).append(i)
    for g, idx in groups.items():
        model = p.fit([c for c in cells if key(c) != g])
        for i in idx:
            out[i] = p.predict(model, p.view(cells[i]))
    return out


def choose(scores: dict, kind: str, names: list[str]) -> str | None:
    """The ``kind`` candidate with the most cells within x2 (then the larger Spearman) on the primary
    fold; None where no predictor is of that kind (a run of the baselines alone)."""
    pool = [n for n in names if scores[n]["kind"] == kind]
    return max(pool, key=lambda n: (scores[n]["within_x2"], scores[n]["spearman"] or -math.inf)) if pool else None


def run(cells: list[dict], predictors: list[Predictor] | None = None, folds=tuple(FOLDS), progress=None) -> dict:
    """Score every predictor on every fold. Returns ``{"summary": ..., "cells": [...]}`` (score.json)."""
    predictors = predictors or candidates()
    t0 = time.perf_counter()
    preds: dict = {}
    for fold in folds:
        for p in predictors:
            preds[(fold, p.name)] = held_out(p, cells, fold)
            if progress:
                progress(f"{fold}: {p.name}")
    nqm = [i for i, c in enumerate(cells) if c["report"] in NQM_REPORTS]
    scores: dict = {}
    for fold in folds:
        scores[fold] = {}
        for p in predictors:
            pr = preds[(fold, p.name)]
            s = M.score(cells, pr)
            s["nqm_cells"] = M.score([cells[i] for i in nqm], [pr[i] for i in nqm])
            scores[fold][p.name] = {"kind": p.kind, "fraction": p.fraction, "about": p.about, **s}
    names = [p.name for p in predictors]
    primary = scores[PRIMARY]
    sync_only, pilot_name = choose(primary, SYNC, names), choose(primary, PILOT, names)
    pilot_fraction = next((p.fraction for p in predictors if p.name == pilot_name), None)
    summary = {"sync_only": sync_only, "pilot": pilot_name, "pilot_fraction": pilot_fraction,
               "primary_fold": PRIMARY, "cells": len(cells), "nqm_cells": len(nqm),
               "reports": sorted({c["report"] for c in cells}),
               "floor": M.floor(cells), "floor_nqm_cells": M.floor([cells[i] for i in nqm]),
               "scores": scores, "seconds": None}
    out_cells = []
    for i, c in enumerate(cells):
        row = {k: c[k] for k in ("report", "variant", "mode", "optimizer", "mean_delay", "delay", "delay_dist",
                                 "correction", "lr", "momentum", "steps", "batch_size", "preset", "lr_schedule",
                                 "sync_start", "sync_cooldown")}
        row["id"] = cell_id(c)
        row["measured"] = {k: c["measured"][k] for k in ("gap", "ci", "seeds", "curve")}
        row["measured"]["per_seed"] = {str(s): g for s, g in c["measured"]["per_seed"].items()}
        row["predictions"] = {p.name: preds[(PRIMARY, p.name)][i]["gap"] for p in predictors}
        row["intervals"] = {p.name: preds[(PRIMARY, p.name)][i]["interval"] for p in predictors
                            if preds[(PRIMARY, p.name)][i]["interval"] is not None}
        row["folds"] = {f: {p.name: preds[(f, p.name)][i]["gap"] for p in predictors} for f in folds if f != PRIMARY}
        out_cells.append(row)
    summary["seconds"] = time.perf_counter() - t0
    return {"summary": summary, "cells": out_cells}


