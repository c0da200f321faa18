"""Finding 1's verdicts from hand-made rows: the order claim reaches agrees, disagrees and
undetermined (lr-dependent), and the size claim disagrees with the paper's 23x, each from runs the
test writes down, not from a report."""

from __future__ import annotations

import pytest

from delaylab.reproduce import PRESETS
from delaylab.reproduce import findings as F
from delaylab.reproduce import stats as S
from delaylab.reproduce import verdicts as V

P = PRESETS["cpu-quick"]  # adamw and muon, 5 base seeds
NOISE = [0.00, 0.01, -0.01, 0.005, -0.005]  # per seed, shared by a seed's sync and delayed runs


def _rows(gaps: dict[tuple[str, float], float], sync: dict[tuple[str, float], float]) -> list[dict]:
    """Sync and delayed runs of every (optimizer, lr): sync loss + seed noise, delayed = sync + gap
    (+ a small seed-dependent wobble so the gap has a spread)."""
    rows = []
    for (opt, lr), g in gaps.items():
        mom = P.llm.momentum.get(opt)
        for s, e in enumerate(NOISE):
            base = sync[(opt, lr)] + e
            for mode, loss in (("sync", base), ("delayed", base + g + 0.3 * e * (1 + s % 2))):
                rows.append({"optimizer": opt, "mode": mode, "lr": lr, "momentum": mom, "seed": s,
                             "val_loss": loss, "run": f"{opt}_{mode}_{lr}_{s}", "issues": []})
    return rows


def _by(rows: list[dict], best: dict[str, float]) -> dict[str, dict]:
    by = {}
    for opt, lr in best.items():
        row = F.cell_row(rows, opt, lr, P.llm.momentum.get(opt), ("sync", "delayed"))
        row.update(censored=False, issues=[], tuned={"gap": row["gap"]},
                   prediction={"kind": "adam" if opt == "adamw" else "lmo", "stable_shrink": 38.0,
                               "relative_penalty": 0.05})
        by[opt] = row
    return by


def _order(rows, best) -> dict:
    verdicts, *_ = F.optimizer_verdicts(P, rows, _by(rows, best))
    return next(v for v in verdicts if v["claim"] == "adamw degrades more than muon")


# sync losses: each optimizer's lrs are 0.5 apart unless a case makes them indistinguishable
@pytest.mark.parametrize("case,gaps,sync,want", [
    ("adamw's gap larger at every lr", {("adamw", 1e-3): 0.30, ("adamw", 2e-3): 0.35, ("muon", 0.02): 0.05},
     {("adamw", 1e-3): 2.000, ("adamw", 2e-3): 2.001, ("muon", 0.02): 2.0}, V.AGREES),
    ("muon's gap larger", {("adamw", 1e-3): 0.05, ("adamw", 2e-3): 0.50, ("muon", 0.02): 0.30},
     {("adamw", 1e-3): 2.000, ("adamw", 2e-3): 2.500, ("muon", 0.02): 2.0}, V.DISAGREES),
    ("the order flips inside the optimum's indistinguishable lrs",
     {("adamw", 1e-3): 0.05, ("adamw", 2e-3): 0.35, ("muon", 0.02): 0.20},
     {("adamw", 1e-3): 2.000, ("adamw", 2e-3): 2.001, ("muon", 0.02): 2.0}, V.UNDETERMINED),
])
def test_the_order_claim_reaches_each_state(case, gaps, sync, want):
    # adamw 2e-3's sync loss wobbles +-0.02 by seed against 1e-3's: not resolved from the optimum
    rows = [dict(r, val_loss=r["val_loss"] + (0.02 if r["seed"] % 2 and r["lr"] == 2e-3 else 0.0))
            for r in _rows(gaps, sync)]
    v = _order(rows, {"adamw": 1e-3, "muon": 0.02})
    assert v["state"] == want, (case, v["line"])
    assert v["score"]["lr_dependent"] == (want == V.UNDETERMINED)


def test_the_indistinguishable_set_is_the_lrs_whose_paired_sync_difference_reaches_zero():
    rows = _rows({("adamw", 1e-3): 0.3, ("adamw", 2e-3): 0.3, ("adamw", 4e-3): 0.3},
                 {("adamw", 1e-3): 2.000, ("adamw", 2e-3): 2.001, ("adamw", 4e-3): 2.5})
    # 2e-3 differs from 1e-3 by a constant 0.001 at every seed: a zero-width interval above 0 resolves it
    got = F.indistinguishable(rows, "adamw", P.llm.momentum.get("adamw"), 1e-3)
    assert got == [1e-3]
    noisy = [dict(r, val_loss=r["val_loss"] + (0.02 if r["seed"] % 2 and r["lr"] == 2e-3 else 0.0)) for r in rows]
    assert F.indistinguishable(noisy, "adamw", P.llm.momentum.get("adamw"), 1e-3) == [1e-3, 2e-3]


def test_the_size_claim_disagrees_with_23x_when_the_ratio_is_resolved_near_1():
    rows = _rows({("adamw", 1e-3): 0.30, ("muon", 0.02): 0.25}, {("adamw", 1e-3): 2.0, ("muon", 0.02): 2.0})
    verdicts, *_ = F.optimizer_verdicts(P, rows, _by(rows, {"adamw": 1e-3, "muon": 0.02}))
    size = next(v for v in verdicts if v["claim"].startswith("size:"))
    lo, hi = size["score"]["interval"]
    assert hi < 23 and size["state"] == V.DISAGREES
    difference = S.sample([a - b for a, b in zip(*(F.cell_row(rows, o, lr, P.llm.momentum.get(o), ("sync", "delayed"))
                                              ["gap"]["values"] for o, lr in (("adamw", 1e-3), ("muon", 0.02))))])
    assert difference["mean"] == pytest.approx(0.05, abs=1e-9)  # the gaps the rows were written with
