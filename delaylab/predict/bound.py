"""A bound-shaped fit: the gap as a power of the delay term, per kind of optimizer.

Theorem 1 puts the delay's cost of an LMO method (Muon, Lion) in the term ``2 L eta tau``, beside the
momentum's; for Adam-type methods the theory's quantity is the margin to the delayed stability limit.
The fit: ``log gap = a_kind + b_kind * margin + c * log(updates) + the correctors and sync phases``,
few parameters, nothing about the lr's optimum.
"""

from __future__ import annotations

from delaylab.predict import features as F
from delaylab.predict.base import SYNC, ridge

NAMES = ["1", "adam", "margin_adam", "margin_lmo", "log_steps", "ef", "predict", "dc", "sync_start",
         "sync_cooldown"]


def bound():
    return ridge("bound-shaped", SYNC, F.settings, NAMES,
                 "log gap linear in the delay term (margin) per kind, updates, corrector")
