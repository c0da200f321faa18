"""No prediction of a held-out cell reads its delayed runs beyond the pilot's fraction: plant a wrong
measured gap and wrong late curve points into a held-out cell and the predictions must not move.

Two counter-checks show the plant reaches what it should: the same wrong points planted inside the
pilot's window do move the pilot's prediction, and a wrong gap planted into a held-in cell moves the
sync-only one (the fit reads the held-in cells)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from delaylab.predict import cells as C
from delaylab.predict import harness, publish
from delaylab.predict.base import BASELINE

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ("cpu-delays", "cpu-quick")  # two reports are enough for leave one report out, and fast
BEYOND = ("moe-cpu",)
WRONG = 5.0


@pytest.fixture(scope="module")
def cells():
    return C.load(ROOT / "docs", reports=REPORTS, beyond=BEYOND)


@pytest.fixture(scope="module")
def named():
    s = json.loads((ROOT / "docs/predict/score.json").read_text())["summary"]
    return s["sync_only"], s["pilot"]


def _predictors():
    return [p for p in harness.candidates(ROOT / "docs/nqm/score.json") if p.kind != BASELINE]


def _target(cells):
    return next(i for i, c in enumerate(cells) if c["report"] == "cpu-delays" and c["mean_delay"] == 1
                and c["correction"] == "none")


def _plant(cells, i, after: float | None):
    """A copy of the cells with cell i's measured gap, per-seed gaps, delayed final losses and the
    delayed (and measured) curve points past ``after`` of the updates (all of them: None) made wrong."""
    out = copy.deepcopy(cells)
    c = out[i]
    last = -1 if after is None else after * c["steps"]
    c["measured"].update(gap=WRONG, ci=[WRONG - 0.1, WRONG + 0.1],
                         per_seed={s: WRONG for s in c["measured"]["per_seed"]})
    c["measured"]["curve"] = [[u, g + WRONG if u > last else g] for u, g in c["measured"]["curve"]]
    for r in c["delayed"]:
        r["val_loss"] += WRONG
        r["curve"] = [[u, v + WRONG if u > last else v] for u, v in r["curve"]]
        # the dense pilot's train losses: wrong past ``after``, and a wrong one logged at the end
        r["train"] = [[u, v + WRONG if u > last else v] for u, v in r["train"]] + [[c["steps"], WRONG]]
    return out


def _held_out(cells, i):
    return {p.name: harness.held_out(p, cells, "report")[i]["gap"] for p in _predictors()}


def test_a_planted_wrong_gap_and_late_curve_do_not_move_any_held_out_prediction(cells, named):
    i = _target(cells)
    before = _held_out(cells, i)
    planted = _plant(cells, i, after=0.1)
    assert planted[i]["measured"]["gap"] == WRONG != cells[i]["measured"]["gap"]
    after = _held_out(planted, i)
    assert set(named) <= set(before)
    assert after == before  # every sync-only and pilot candidate, the named ones among them, bit for bit


def test_the_plant_inside_the_pilot_window_moves_the_pilot(cells, named):
    i = _target(cells)
    pilot = publish.by_name(named[1], ROOT / "docs/nqm/score.json")
    before = harness.held_out(pilot, cells, "report")[i]["gap"]
    everywhere = _plant(cells, i, after=None)  # the pilot's own validations are wrong too
    assert harness.held_out(pilot, everywhere, "report")[i]["gap"] != pytest.approx(before, rel=1e-3)


def test_a_plant_in_a_held_in_cell_moves_the_fit(cells, named):
    i = _target(cells)
    j = next(k for k, c in enumerate(cells) if c["report"] == "cpu-quick")
    sync = publish.by_name(named[0], ROOT / "docs/nqm/score.json")
    before = harness.held_out(sync, cells, "report")[i]["gap"]
    moved = harness.held_out(sync, _plant(cells, j, after=None), "report")[i]["gap"]
    assert moved != pytest.approx(before, rel=1e-6)


def test_the_plant_inside_the_pilot_window_moves_the_dense_pilot(cells):
    from delaylab.predict.pilot import pilot_dense

    i = _target(cells)
    p = pilot_dense()
    before = harness.held_out(p, cells, "report")[i]["gap"]
    assert harness.held_out(p, _plant(cells, i, after=0.1), "report")[i]["gap"] == before
    assert harness.held_out(p, _plant(cells, i, after=None), "report")[i]["gap"] != pytest.approx(before, rel=1e-3)
