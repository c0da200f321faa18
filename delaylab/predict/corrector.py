"""Which corrector: for a setting with several of none / EF / weight prediction / EF + prediction
measured, predict the one with the smallest gap.

A *setting* is the cells of one report that differ only in the corrector (same optimizer, lr,
momentum, delay, run, no sync phases), with two correctors or more measured. Its best is the
corrector with the smallest mean gap; it is *resolved* where the per-seed difference of the best
to every other corrector (delayed loss minus delayed loss, paired by seed: the sync run cancels)
has a 95% t interval above 0. The choice is scored on the resolved settings only.

The chooser fits, on the held-in cells (leave one report out), the tau law's features
(:mod:`delaylab.predict.law`) with each corrector's indicator also times the optimizer's kind and
log tau (a corrector's effect may turn with tau: the delay axis measured EF + prediction below plain
delay at tau 1 and above it at tau 4 to 8 for AdamW), and picks the corrector of smallest predicted
gap. Its baseline: the corrector that is best in most held-in settings, for every setting.
"""

from __future__ import annotations

import json
from collections import Counter

from delaylab import stats
from delaylab.predict import regression
from delaylab.predict.base import from_log
from delaylab.predict.cells import sync_view
from delaylab.predict.law import LAW_TAU, tau_features, tau_offset

CORRECTORS = ("none", "ef", "predict", "ef+predict")
SETTING = ("report", "variant", "optimizer", "lr", "momentum", "delay", "delay_dist", "steps", "batch_size",
           "preset", "lr_schedule")
INTERACTIONS = ["ef_adam", "ef_tau", "predict_adam", "predict_tau"]


def settings(cells: list[dict]) -> list[dict]:
    """The settings (module doc): ``{"key", "cells": {corrector: cell}, "best", "resolved"}``."""
    groups: dict = {}
    for c in cells:
        if c["correction"] in CORRECTORS and not c["sync_start"] and not c["sync_cooldown"]:
            key = json.dumps([c[k] for k in SETTING])
            groups.setdefault(key, {})[c["correction"]] = c
    out = []
    for key, by in groups.items():
        if len(by) < 2:
            continue
        best = min(by, key=lambda k: by[k]["measured"]["gap"])
        resolved = True
        for other, c in by.items():
            if other == best:
                continue
            _, diff = stats.paired(by[best]["measured"]["per_seed"], c["measured"]["per_seed"])
            ci = stats.t_interval(diff)
            resolved = resolved and ci is not None and ci[0] > 0
        out.append({"key": key, "cells": by, "best": best, "resolved": resolved})
    return out


def _features(view):
    f = tau_features(view)
    return {**f, "ef_adam": f["ef"] * f["adam"], "ef_tau": f["ef"] * f["log_tau"],
            "predict_adam": f["predict"] * f["adam"], "predict_tau": f["predict"] * f["log_tau"]}


def fit(cells: list[dict]) -> regression.Ridge:
    views = [sync_view(c) for c in cells]
    target = [regression.log_gap(c["measured"]["gap"]) - tau_offset(v) for c, v in zip(cells, views)]
    return regression.fit([_features(v) for v in views], LAW_TAU + INTERACTIONS, target, [c["report"] for c in cells])


def predicted_gap(model: regression.Ridge, view: dict) -> dict:
    return from_log(model.predict(_features(view)) + tau_offset(view), model)


def choose(model: regression.Ridge, setting: dict) -> str:
    """The corrector of smallest predicted gap among those the setting measured (read from their sync views)."""
    return min(setting["cells"], key=lambda k: predicted_gap(model, sync_view(setting["cells"][k]))["gap"])


def score(cells: list[dict]) -> dict:
    """Leave one report out: the chooser's pick and the majority baseline's for every setting, and
    how many of the resolved settings each gets right."""
    rows = []
    by_report: dict = {}
    for s in settings(cells):
        by_report.setdefault(next(iter(s["cells"].values()))["report"], []).append(s)
    for report, group in by_report.items():
        held_in = [c for c in cells if c["report"] != report]
        model = fit(held_in)
        majority = Counter(s["best"] for s in settings(held_in) if s["resolved"]).most_common()
        for s in group:
            pick = choose(model, s)
            base = next((k for k, _ in majority if k in s["cells"]), "none")
            rows.append({"report": report, "setting": json.loads(s["key"]), "measured": sorted(s["cells"]),
                         "gaps": {k: c["measured"]["gap"] for k, c in s["cells"].items()}, "best": s["best"],
                         "resolved": s["resolved"], "chosen": pick, "baseline": base})
    resolved = [r for r in rows if r["resolved"]]
    return {"settings": len(rows), "resolved": len(resolved),
            "right": sum(r["chosen"] == r["best"] for r in resolved),
            "baseline_right": sum(r["baseline"] == r["best"] for r in resolved), "rows": rows}
