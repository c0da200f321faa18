"""The NQM score's bookkeeping: pairing by seed, the t interval, the three counts, and that its cells
(now built by delaylab.predict.cells) are the ones its committed score.json holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from delaylab.predict import nqm_score

ROOT = Path(__file__).resolve().parents[2]


def _row(mode, seed, loss, **kw):
    base = dict(kind="gpt", optimizer="adamw", mode=mode, correction="none" if mode != "ef" else "ef",
                delay=0 if mode == "sync" else 1, delay_dist=None, lr=0.002, momentum=0.9, seed=seed, preset="tiny",
                variant="main", steps=300, batch_size=16, block_size=None, n_layer=None, warmup=None, sync_start=0,
                sync_cooldown=0, dc_lambda=None, tokens=3000, val_loss=loss,
                val_curve=[[1500, loss + 1], [3000, loss]])
    return {**base, **kw}


def test_cells_pair_by_seed_and_measure_the_t_interval(tmp_path):
    rows = [_row("sync", s, 2.0 + 0.01 * s) for s in range(3)] + [_row("delayed", s, 2.1 + 0.02 * s) for s in range(4)]
    for report in nqm_score.REPORTS:
        (tmp_path / report).mkdir()
        (tmp_path / report / "runs.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cells = [c for c in nqm_score.cells(tmp_path) if c["report"] == "cpu-small"]
    assert len(cells) == 1 and len(cells[0]["sync"]) == 3  # seed 3 has no sync run
    m = cells[0]["measured"]
    assert m["gap"] == pytest.approx(0.11) and m["seeds"] == 3
    # gaps 0.10, 0.11, 0.12: sd 0.01, t(0.975, 2) = 4.303
    assert m["ci"][1] - m["gap"] == pytest.approx(4.302653 * 0.01 / 3 ** 0.5, rel=1e-5)
    assert m["curve"] == [[150, pytest.approx(0.11)], [300, pytest.approx(0.11)]]


def test_score_counts():
    meas = {"gap": 0.1, "ci": [0.05, 0.15]}
    assert nqm_score.score(0.12, meas) == {"inside": True, "sign": True, "factor2": True}
    assert nqm_score.score(0.01, meas) == {"inside": False, "sign": True, "factor2": False}
    assert nqm_score.score(-0.1, meas) == {"inside": False, "sign": False, "factor2": False}
    assert nqm_score.score(None, meas) == {"inside": False, "sign": False, "factor2": False}


def test_the_cells_are_the_committed_score_s_cells():
    """The committed docs/nqm/score.json was made by the score's own pairing code before it moved; the
    cells built now from the same runs.jsonl have the same settings and measured gaps, bit for bit."""
    old = json.loads((ROOT / "docs/nqm/score.json").read_text())["cells"]
    new = nqm_score.cells(ROOT / "docs/reproduce")
    assert len(new) == len(old) == 193
    for a, b in zip(new, old):
        assert {k: a[k] for k in nqm_score.FIELDS if k != "correction"} == {k: b[k] for k in nqm_score.FIELDS
                                                                             if k != "correction"}
        assert a["correction"] == b["correction"].replace(",", "+")
        assert {k: a["measured"][k] for k in nqm_score.MEASURED} == b["measured"]
