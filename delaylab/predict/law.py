"""Sync-only laws fitted on the held-in cells: the log gap as a linear function of the settings.

* ``law``: the margin to the delayed stability limit (Adam-type) or Theorem 1's delay term
  (LMO), per kind and squared (the gap rises with the lr and saturates past the sync optimum),
  the updates, batch, model size, schedule, corrector and sync phases
  (:func:`delaylab.predict.features.settings`); the delay enters through the margin alone.
* ``law, gap ~ tau``: the gap taken proportional to the mean delay, as Theorem 1's delay term is
  (the fit is of log(gap / tau)), on the same features with the lr in place of the margin.
* ``law + sync curve``: ``law, gap ~ tau`` with the sync run's end loss and late drop
  (:func:`delaylab.predict.features.curve_features`).
"""

from __future__ import annotations

import math

from delaylab.predict import features as F
from delaylab.predict.base import SYNC, ridge

COMMON = ["log_steps", "log_steps_adam", "log_batch", "log_params", "constant_lr", "ef", "predict", "dc",
          "sync_start", "sync_cooldown"]
LAW = ["1", "adam", "margin_adam", "margin_lmo", "margin2_adam", "margin2_lmo"] + COMMON
LAW_TAU = ["1", "adam", "log_lr", "log_lr_adam", "log_lr2_adam", "log_lr2_lmo"] + COMMON


def tau_offset(view) -> float:
    """log(mean delay), the part of the log gap the tau laws take from Theorem 1 (a mean delay below
    0.25, none in the reports, counts as 0.25)."""
    return math.log(max(view["mean_delay"], 0.25))


def tau_features(view):
    f = F.settings(view)
    lr, adam = f["log_lr"], f["adam"]
    return {**f, "log_lr_adam": lr * adam, "log_lr2_adam": lr * lr * adam, "log_lr2_lmo": lr * lr * (1 - adam)}


def _with_curve(view):
    return {**tau_features(view), **F.curve_features(view)}


def law():
    return ridge("law (margin)", SYNC, F.settings, LAW,
                 "log gap linear in the stability margin at tau (squared), updates, batch, size, corrector")


def law_tau():
    return ridge("law, gap ~ tau", SYNC, tau_features, LAW_TAU,
                 "log(gap / tau) linear in log lr (squared), updates, batch, size, corrector", offset=tau_offset)


def law_curve():
    return ridge("law + sync curve", SYNC, _with_curve, LAW_TAU + ["sync_end", "log_late_drop"],
                 "law, gap ~ tau, with the sync run's end loss and late drop", offset=tau_offset)
