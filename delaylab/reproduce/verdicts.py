"""The report's one verdict rule and its one aggregation rule.

Every claim the report scores, the paper's or the theory's, is a prediction set against a
measured 95% interval and a null (what "no effect" would give):

- **undetermined** where there is no bounded interval (too few seeds, Fieller's set unbounded),
  where an optimum it rests on is censored (at the edge of its lr grid), where a run behind it
  broke the protocol (:func:`protocol_issues`), or where the interval contains both the
  prediction and the null: the data cannot tell the two apart;
- **agrees** where the interval meets the prediction (and excludes the null);
- **disagrees** where it does not meet the prediction.

A prediction is a number (the theory's lr shift x0.975) or a range, ``(lo, hi)`` with None for
an open end (the paper's "EF recovers 50-90%": ``(50, 90)``; "AdamW's gap is larger":
``(0, None)`` against the null 0). A part's summary, for the paper and for the theory alike,
is :func:`aggregate` of its scored states. Directions the theory gives without a number, and
sketches (a number derived beside the theory, not from an encoded bound), are shown, not scored.
"""

from __future__ import annotations

import math

AGREES, DISAGREES, UNDETERMINED = "agrees", "disagrees", "undetermined"
STATES = (AGREES, DISAGREES, UNDETERMINED)
SUMMARIES = ("yes", "partly", "no", "undetermined", "n.a.")


def _region(predicted) -> tuple[float, float]:
    if isinstance(predicted, (tuple, list)):
        lo, hi = predicted
        return (-math.inf if lo is None else lo, math.inf if hi is None else hi)
    return (predicted, predicted)


def state(interval, predicted, null: float, *, censored: bool = False, issues=()) -> str:
    """The rule above. ``interval``: a bounded ``[lo, hi]`` or None; ``issues``: protocol breaches."""
    if interval is None or censored or issues or predicted is None:
        return UNDETERMINED
    lo, hi = interval
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return UNDETERMINED
    p_lo, p_hi = _region(predicted)
    meets = p_lo <= hi and lo <= p_hi
    if meets and lo <= null <= hi:
        return UNDETERMINED
    return AGREES if meets else DISAGREES


def score(claim: str, interval, predicted, null: float, *, censored: bool = False, issues=(),
          measured: float | None = None) -> dict:
    """One scored claim: its inputs and its state (what a reader needs to recompute it)."""
    return {"claim": claim, "measured": measured, "interval": interval, "predicted": predicted, "null": null,
            "censored": bool(censored), "issues": sorted(set(issues)),
            "state": state(interval, predicted, null, censored=censored, issues=issues)}


def why(s: dict) -> str:
    """The reason behind an undetermined state, in a few words (empty otherwise)."""
    if s["state"] != UNDETERMINED:
        return ""
    if s["issues"]:
        return "protocol: " + "; ".join(s["issues"])
    if s["censored"]:
        return "optimum censored at the lr grid's edge"
    if s["interval"] is None:
        return "no bounded interval"
    return "the interval contains both the prediction and the null"


def aggregate(states: list) -> str:
    """yes: every scored claim agrees; no: none agrees and one disagrees; undetermined: all are;
    partly: the rest (some agree, others do not); n.a.: nothing scored."""
    s = [x for x in states if x in STATES]
    if not s:
        return "n.a."
    if all(x == AGREES for x in s):
        return "yes"
    if all(x == UNDETERMINED for x in s):
        return "undetermined"
    if AGREES not in s:
        return "no"
    return "partly"


def counts(states: list) -> str:
    """``agree 2, disagree 1, undetermined 3`` over the scored states."""
    s = [x for x in states if x in STATES]
    names = {AGREES: "agree", DISAGREES: "disagree", UNDETERMINED: "undetermined"}
    return ", ".join(f"{names[k]} {s.count(k)}" for k in STATES if s.count(k)) or "nothing scored"


def protocol_issues(optimizer: str, momentum, steps: int, warmup: int | None) -> list[str]:
    """The protocol's rules for one run: AdamW's beta1^2 < beta2 (else its second moment lags the
    first), and at least 10 / (1 - beta) updates after warmup for the momentum beta that drives the
    step (the momentum's memory, ten times over; :func:`delaylab.reproduce.predict.direction_beta`)."""
    from delaylab.optim.registry import DEFAULTS
    from delaylab.reproduce import predict

    out = []
    if predict.kind(optimizer) is None:
        return out
    beta, _ = predict.direction_beta(optimizer, momentum)
    if optimizer == "adamw":
        beta2 = DEFAULTS["adamw"]["betas"][1]
        if not beta * beta < beta2:
            out.append(f"AdamW beta1 {beta:g} needs beta2 > {beta * beta:.4f}, has {beta2:g}")
    after = steps - (steps // 20 if warmup is None else warmup)
    need = 10 / (1 - beta)
    if after < need:
        out.append(f"{optimizer} momentum {beta:g} needs {need:.0f} updates after warmup, has {after}")
    return out
