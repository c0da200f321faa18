"""The pilot predictor: from the first 10% of the updates of the sync and delayed runs, the end gap.

A pilot runs the cell's sync and delayed runs with the full run's schedule (warmup, peak lr,
decay to the end: all known) and stops them after ``FRACTION`` of the updates. Its gap at its last
validation is extrapolated to the end by a law fitted on the held-in cells' pilots:
``log gap_end = law(settings) + (a + a_adam [Adam-type]) log(max(gap_pilot, 0.005))``, the
settings' features being a sync-only law's (:mod:`delaylab.predict.law`: ``pilot law`` the tau
law's, log(gap / tau) on the lr, updates, batch, size, corrector; ``pilot law (margin)`` the
margin law's), so the extrapolation knows how long the run is, how the lr decays and how the
delay's cost moves with the lr and tau. The interval: the 95% t band of the held-in cells'
leave-one-report-out residuals.

``pilot ratio law, 10%`` fits the extrapolation itself: ``log gap_end - log gap_pilot`` on the
settings with the mean delay free (``log_tau``) and the pilot's log gap free (its weight shrinks
towards 1, not 0). The pilot's gap already carries the delay's cost, so the tau laws' offset
``log tau`` on top of it counts the delay twice wherever the held-in cells cannot fit it back out
(leave cpu-delays out and few held-in cells have a delay other than 1).

``pilot law (dense), 10%`` reads the dense pilot in place of the last validation: the paired
train-loss gap over the pilot's last quarter and its trend from the quarter before
(:func:`delaylab.predict.features.dense_pilot`; the runs :mod:`delaylab.predict.pilots` reran),
with the same tau law of the settings.
"""

from __future__ import annotations

from delaylab.predict import features as F
from delaylab.predict.base import PILOT, ridge
from delaylab.predict.law import LAW, LAW_TAU, tau_features, tau_offset

FRACTION = 0.1
PILOT_NAMES = ["log_pilot", "log_pilot_adam", "pilot_missing"]
DENSE_NAMES = ["log_tg", "log_tg_adam", "tg_trend", "dense_missing"]


def _features(view, settings=tau_features):
    f, p = settings(view), F.pilot(view)
    return {**f, **p, "log_pilot_adam": p["log_pilot"] * f["adam"]}


def pilot(fraction: float = FRACTION):
    return ridge(f"pilot law, {fraction:.0%}", PILOT, _features, LAW_TAU + PILOT_NAMES,
                 "the pilot's gap extrapolated by the tau law of the settings", fraction=fraction, offset=tau_offset)


def pilot_margin(fraction: float = FRACTION):
    return ridge(f"pilot law (margin), {fraction:.0%}", PILOT, lambda v: _features(v, F.settings),
                 LAW + PILOT_NAMES, "the pilot's gap extrapolated by the margin law of the settings", fraction=fraction)


def _dense_features(view):
    f, d = tau_features(view), F.dense_pilot(view)
    return {**f, **d, "log_tg_adam": d["log_tg"] * f["adam"]}


def pilot_dense(fraction: float = FRACTION):
    return ridge(f"pilot law (dense), {fraction:.0%}", PILOT, _dense_features, LAW_TAU + DENSE_NAMES,
                 "the dense pilot's train-loss gap and its trend, extrapolated by the tau law of the settings",
                 fraction=fraction, offset=tau_offset)


def _pilot_offset(view) -> float:
    return F.pilot(view)["log_pilot"]


def pilot_ratio(fraction: float = FRACTION):
    return ridge(f"pilot ratio law, {fraction:.0%}", PILOT, _features, LAW_TAU + ["log_tau"] + PILOT_NAMES,
                 "log(end gap / pilot gap) linear in the settings and the delay (the pilot's own weight free)",
                 fraction=fraction, offset=_pilot_offset)
