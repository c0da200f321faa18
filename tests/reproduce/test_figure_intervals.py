"""The report's figures draw each mean's 95% t interval (the interval the report quotes), not the
seeds' standard deviation: the drawn error bars of the committed cpu-small report's parts are
compared with t intervals recomputed from the seeds' values."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402

import scipy.stats  # noqa: E402
from delaylab.reproduce import figures  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def parts():
    rep = json.loads((ROOT / "docs/reproduce/cpu-small/report.json").read_text())
    return {p["key"]: p for p in rep["parts"]}


def _bar_lengths(fig) -> list[float]:
    """The length of every vertical error bar drawn (lo to hi) in the figure's axes."""
    out = []
    for ax in fig.axes:
        for coll in ax.collections:
            if isinstance(coll, LineCollection):
                out += [abs(seg[1][1] - seg[0][1]) for seg in coll.get_segments() if len(seg) == 2]
    return out


def _t_width(values) -> float:
    """2 t(0.975, n-1) s / sqrt(n), by hand."""
    x = np.array([v for v in values if v is not None], float)
    return 2 * float(scipy.stats.t.ppf(0.975, len(x) - 1)) * x.std(ddof=1) / np.sqrt(len(x))


def _check(drawn: list[float], stats_drawn: list[dict]):
    want = [_t_width(s["values"]) for s in stats_drawn if s.get("mean") is not None and s.get("ci")]
    sds = [2 * s["std"] for s in stats_drawn if s.get("std")]
    assert want and len(drawn) >= len(want)
    for w in want:
        assert any(abs(d - w) < 1e-9 for d in drawn), w
    # the standard deviation (either way) is not what is drawn: t * SD / sqrt(n) differs from SD
    assert not any(abs(d - x) < 1e-9 for d in drawn for x in sds if all(abs(x - w) > 1e-9 for w in want))


def test_the_schedules_figure_draws_95_t_intervals(parts):
    fig = figures.plot_schedules(parts["schedules"])
    rows = [r["gap"] for r in parts["schedules"]["rows"] if r["schedule"] != "sync"]
    _check(_bar_lengths(fig), rows)


def test_the_momentum_figure_draws_95_t_intervals(parts):
    fig = figures.plot_momentum(parts["momentum"])
    rows = parts["momentum"]["rows"]
    _check(_bar_lengths(fig), [r["fixed_gap"] for r in rows] + [r["gap"] for r in rows])


def test_the_learning_rate_figure_draws_95_t_intervals(parts):
    fig = figures.plot_learning_rate(parts["learning_rate"])
    rows = parts["learning_rate"]["rows"]
    _check(_bar_lengths(fig), [r["sync"] for r in rows] + [r["delayed"] for r in rows])


def test_the_ablations_figure_draws_95_t_intervals(parts):
    fig = figures.plot_ablations(parts["ablations"])
    rows = parts["ablations"]["rows"]
    gaps = [st["gap"] for k in ("warmup", "length") for r in rows[k] for st in r["settings"].values()]
    assert np.isfinite([g["mean"] for g in gaps if g["mean"] is not None]).all()
    _check(_bar_lengths(fig), gaps)
