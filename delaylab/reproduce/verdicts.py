"""The report's one verdict rule and its one aggregation rule.

Every claim the report scores, the paper's or the theory's, is a claimed region R set against a
measured 95% interval:

- **agrees** where the interval lies inside R;
- **disagrees** where it lies outside R (no point in common);
- **undetermined** otherwise: the interval straddles an edge of R, so it also covers values the
  claim excludes (Muon's EF share [14, 53]% against "50-90%" would have "agreed" with "10-40%" as
  well), and where there is no bounded interval (too few seeds, Fieller's set unbounded), an
  optimum it rests on is censored (at the edge of its lr grid), or a run behind it broke the
  protocol (:func:`protocol_issues`).

R is a range ``(lo, hi)`` with None for an open end (the paper's "EF recovers 50-90%":
``(50, 90)``; "AdamW's gap is larger": ``(0, None)``), or a point with the tolerance the preset
states before any run (``(p - t, p + t)``). A bare point (a number with no tolerance, the theory's
13.9%) has no inside: it can only be undetermined or disagree. Inside means strictly inside at a
finite edge, so a direction agrees only where the interval excludes 0. A part's summary, for the
paper and for the theory alike, is :func:`aggregate` of its scored states. Directions the theory
gives without a number, and sketches (a number derived beside the theory, not from an encoded
bound), are shown, not scored.
"""

from __future__ import annotations

import math

AGREES, DISAGREES, UNDETERMINED = "agrees", "disagrees", "undetermined"
STATES = (AGREES, DISAGREES, UNDETERMINED)
SUMMARIES = ("yes", "partly", "no", "undetermined", "n.a.")


def region(predicted, tolerance: float | None = None) -> tuple[float, float]:
    """R as ``(lo, hi)`` with infinite open ends; a point is ``(p - tolerance, p + tolerance)``."""
    if isinstance(predicted, (tuple, list)):
        lo, hi = predicted
        return (-math.inf if lo is None else lo, math.inf if hi is None else hi)
    t = tolerance or 0.0
    return (predicted - t, predicted + t)


def state(interval, predicted, null: float | None = None, *, censored: bool = False, issues=(),
          tolerance: float | None = None, lr_dependent: bool = False) -> str:
    """The rule above. ``interval``: a bounded ``[lo, hi]`` or None; ``issues``: protocol breaches;
    ``lr_dependent``: the claim's state differs across the lrs the data cannot tell from the optimum.
    ``null`` (what no effect would give) is kept in the score for the reader; the rule does not use it."""
    if interval is None or censored or issues or lr_dependent or predicted is None:
        return UNDETERMINED
    lo, hi = interval
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return UNDETERMINED
    r_lo, r_hi = region(predicted, tolerance)
    if hi < r_lo or lo > r_hi:
        return DISAGREES
    if r_lo < lo and hi < r_hi:
        return AGREES
    return UNDETERMINED


def score(claim: str, interval, predicted, null: float | None = None, *, censored: bool = False, issues=(),
          measured: float | None = None, tolerance: float | None = None, lr_dependent: bool = False) -> dict:
    """One scored claim: its inputs and its state (what a reader needs to recompute it)."""
    return {"claim": claim, "measured": measured, "interval": interval, "predicted": predicted, "null": null,
            "tolerance": tolerance, "censored": bool(censored), "issues": sorted(set(issues)),
            "lr_dependent": bool(lr_dependent),
            "state": state(interval, predicted, null, censored=censored, issues=issues, tolerance=tolerance,
                           lr_dependent=lr_dependent)}


def rescore(sc: dict) -> dict:
    """A score dict (as a report stores it) with its state under this rule."""
    return score(sc["claim"], sc["interval"], sc["predicted"], sc.get("null"), censored=sc["censored"],
                 issues=sc["issues"], measured=sc.get("measured"), tolerance=sc.get("tolerance"),
                 lr_dependent=sc.get("lr_dependent", False))


def why(s: dict) -> str:
    """The reason behind an undetermined state, in a few words (empty otherwise)."""
    if s["state"] != UNDETERMINED:
        return ""
    if s["issues"]:
        return "protocol: " + "; ".join(s["issues"])
    if s["censored"]:
        return "optimum censored at the lr grid's edge"
    if s.get("lr_dependent"):
        return "depends on the lr choice: see the lr line"
    if s["interval"] is None:
        return "no bounded interval"
    lo, hi = region(s["predicted"], s.get("tolerance"))
    if lo == hi:
        return "a point with no stated tolerance: the interval contains it"
    return "the interval straddles an edge of the claimed region"


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
    from delaylab.llm.config import warmup_updates
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
    after = steps - warmup_updates(steps, warmup)
    need = 10 / (1 - beta)
    if after < need:
        out.append(f"{optimizer} momentum {beta:g} needs {need:.0f} updates after warmup, has {after}")
    return out


# -- verdict rows: what a report part stores per claim -----------------------------------------------


def verdict(kind: str, claim: str, predicted: str, measured: str, sc: dict | None = None, line: str = "") -> dict:
    """A verdict line: scored (``sc`` from :func:`delaylab.reproduce.verdicts.score`) or a note."""
    state = None if sc is None else sc["state"]
    if not line:
        line = f"{claim}: {measured}"
        if sc is not None:
            reason = why(sc)
            line += f" -> {state}" + (f" ({reason})" if reason else "")
    return {"claim": claim, "predicted": predicted, "measured": measured, "kind": kind, "state": state,
            "score": sc, "line": line}


def part_states(verdicts: list[dict], numbers: list[dict]) -> dict:
    """The one aggregation: "reproduced" over the paper's scored verdicts, "theory agrees" over
    the theory's scored numbers ("qualitative" where the theory gives none to score)."""
    paper = [v["state"] for v in verdicts if v["kind"] == "paper"]
    theory = [n["state"] for n in numbers if n.get("state") is not None]
    return {"reproduced": aggregate(paper), "reproduced_counts": counts(paper),
            "theory_agrees": aggregate(theory) if theory else ("qualitative" if numbers else "n.a."),
            "theory_counts": counts(theory)}


def theory_number(quantity: str, predicted: float | None, measured: float | None, interval, source: str, *,
                  null: float, unit: str = "x", censored: bool = False, issues=(), set_=None) -> dict:
    """One scored row of the theory column: the theory's number against the measured interval."""
    sc = score(quantity, interval, predicted, null, censored=censored, issues=issues, measured=measured)
    return {"quantity": quantity, "predicted": predicted, "measured": measured, "ci": interval,
            "set": set_, "unit": unit, "source": source, "state": sc["state"], "score": sc, "note": ""}


def qualitative(quantity: str, what: str, note: str = "qualitative", measured=None, ci=None, set_=None,
                predicted=None) -> dict:
    """A theory-column row that is shown and not scored: a direction without a number
    (``qualitative``) or a number derived beside the theory (``sketch``)."""
    return {"quantity": quantity, "predicted": predicted, "measured": measured, "ci": ci, "set": set_, "unit": "",
            "source": what, "state": None, "score": None, "note": note}
