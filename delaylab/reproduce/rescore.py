"""A written report re-scored under this version's verdict rule, without rerunning its GPT runs.

Every stored score (``report.json``'s verdicts and theory numbers keep the interval, the claimed
region, the tolerance, censoring and protocol issues) is re-scored by :func:`verdicts.rescore`.
Two verdicts need more than a stored score and are recomputed from what the report keeps:

- finding 1's order claims, held to every lr the data cannot tell from each optimum, and its size
  claim, from the Ledger read back from the folder (:func:`findings.verdict_rows`,
  :func:`findings.optimizer_verdicts`);
- finding 6, from the toy runs' lines of ``runs.jsonl`` (the rate checks, the delay cost and the
  EF comparison: nothing reruns).

The axes' parts (the delay axis, the tokens axis and the scale axis) are built again from the Ledger. The part summaries and the theory column follow by the one aggregation rule;
the intervals' coverage at the report's skew and the multiplicity line (:mod:`~delaylab.reproduce.coverage`)
and the held-out tuned numbers (:mod:`~delaylab.reproduce.selection`) are recomputed. ``changes`` lists
every scored verdict whose state moved, before -> after.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from delaylab.reproduce import coverage, delays, protocol, selection, tokens
from delaylab.reproduce import findings as F
from delaylab.reproduce import ledger
from delaylab.reproduce import verdicts as V
from delaylab.reproduce.ledger import Ledger


# The axes' parts hold tables and separations, not stored scores: each is built again from the Ledger.
REBUILT = {"delays": delays.delays, "tokens": tokens.tokens, "scale": protocol.scale}


def _optimizers(part: dict, book: Ledger) -> None:
    by = {r["optimizer"]: r for r in part["rows"]}
    verdicts, numbers, robust, adamw_vs_muon, skew = F.optimizer_verdicts(book.preset, F.verdict_rows(book), by)
    part.update(verdicts=verdicts, theory_numbers=numbers, lr_robustness=robust, adamw_vs_muon=adamw_vs_muon,
                skew=skew)


def _toy(part: dict, book: Ledger) -> None:
    new = F.toy(book)  # every toy run's result is a line of runs.jsonl
    for key in ("rows", "ef", "verdicts", "theory_numbers", "headline"):
        part[key] = new[key]


def _scored(part: dict) -> dict:
    """``{claim: (state, score)}`` over the part's scored verdicts and theory numbers."""
    out = {v["claim"]: (v["state"], v.get("score")) for v in part["verdicts"] if v["state"] is not None}
    out.update({"theory: " + n["quantity"]: (n["state"], n.get("score"))
                for n in part.get("theory_numbers", []) if n.get("state") is not None})
    return out


def rescore(rep: dict, book: Ledger) -> tuple[dict, list[dict]]:
    """``(report, changes)``: ``rep`` re-scored (a copy) with the runs of ``book``, the Ledger read back
    from its folder; ``changes``: one entry per scored claim whose state differs (a claim new in this
    version has ``before`` None, one dropped ``after`` None)."""
    rep = copy.deepcopy(rep)
    changes = []
    for part in rep["parts"]:
        before = _scored(part)
        for v in part["verdicts"]:
            if v.get("score"):
                v["score"] = V.rescore(v["score"])
                v.update(V.verdict(v["kind"], v["claim"], v["predicted"], v["measured"], v["score"]))
        for n in part.get("theory_numbers", []):
            if n.get("score"):
                n["score"] = V.rescore(n["score"])
                n["state"] = n["score"]["state"]
        if part["key"] == "optimizers":
            _optimizers(part, book)
        elif part["key"] == "toy":
            _toy(part, book)
        elif part["key"] in REBUILT:  # built again from the Ledger; commands and figures stay the report's
            part.update(REBUILT[part["key"]](book))
        held = selection.selection(book, part["key"])
        if held is not None:
            part["selection"] = held
        part.update(V.part_states(part["verdicts"], part.get("theory_numbers", [])))
        after = _scored(part)
        for claim in list(before) + [c for c in after if c not in before]:
            (old, _), (new, sc) = before.get(claim, (None, None)), after.get(claim, (None, None))
            if old != new:
                changes.append({"part": part["id"], "claim": claim, "before": old, "after": new,
                                "interval": None if sc is None else sc["interval"],
                                "region": None if sc is None else list(V.region(sc["predicted"], sc.get("tolerance"))),
                                "why": "" if sc is None else V.why(sc)})
    for row in rep["summary"]:
        part = next(x for x in rep["parts"] if x["id"] == row["id"])
        row.update(measured=part["headline"], **{k: part.get(k, "") for k in
                                                 ("reproduced", "reproduced_counts", "theory_agrees", "theory_counts")})
    rep["theory_column"] = [{"id": part["id"], **n} for part in rep["parts"] for n in part.get("theory_numbers", [])]
    rep["intervals"] = coverage.report_intervals(book.lines)
    rep["multiplicity"] = coverage.multiplicity(rep["parts"], rep["intervals"])
    return rep, changes


def rescore_folder(folder: Path) -> list[dict]:
    """Re-score ``folder``'s report.json in place, rewrite report.md; return the changes."""
    from delaylab._io import write_json
    from delaylab.reproduce.markdown import markdown
    folder = Path(folder)
    rep = json.loads((folder / "report.json").read_text())
    new, changes = rescore(rep, ledger.read(folder))
    write_json(folder / "report.json", new)
    (folder / "report.md").write_text(markdown(new))
    return changes


def changes_table(changes: list[dict]) -> list[str]:
    """The before -> after lines of :func:`rescore`, as a markdown table."""
    def iv(x):
        return "-" if x is None else f"[{x[0]:.3g}, {x[1]:.3g}]"

    rows = [f"| {c['part']} | {c['claim']} | {c['before'] or '(new)'} | {c['after'] or '(not scored)'} | "
            f"{iv(c['interval'])} | {iv(c['region'])} | {c['why'] or '-'} |" for c in changes]
    return ["| finding | claim | before | after | 95% interval | claimed region | why |",
            "|---|---|---|---|---|---|---|", *rows]
