"""The committed figures' drawing rules: the GPT loss curves from update 0 with their seeds; the toy rate
figure's legends off the data and coinciding modes told apart; the mitigations chart's bars are 95% t
intervals; the profile plot writes inf where its table does instead of drawing a bar."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402


def _below(legend, ax) -> bool:
    ax.figure.draw_without_rendering()  # the layout placed
    return legend.get_window_extent().y1 <= ax.get_window_extent().y0


def test_llm_loss_curves_start_at_update_0_and_name_their_seeds():
    from delaylab.llm import plots

    steps = list(range(10, 201, 10))
    curves = {"sync": (steps, [5.0 - 0.01 * s for s in steps], 2),
              "delayed": (steps, [5.2 - 0.01 * s for s in steps], 2)}
    fig = plots.loss_curves(curves, "adamw")
    ax = fig.axes[0]
    assert ax.get_xlim()[0] == 0
    lo, hi = ax.get_ylim()
    assert hi >= 5.2 - 0.1 and lo <= 5.0 - 2.0  # every value, the first ones included
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["sync (2 seeds)", "delayed (2 seeds)"]
    assert _below(legend, ax)
    inset = ax.child_axes[0]  # the magnified last half
    assert min(min(line.get_xdata()) for line in inset.get_lines()) >= 100


def _rate(problem, delay, correction, shift, seeds=4):
    ts = [100, 400, 1600]
    pts = [{"T": t, "measured": shift * t ** -0.25, "ci": [0.9 * shift * t ** -0.25, 1.1 * shift * t ** -0.25],
            "bound": 3 * t ** -0.25, "ratio": shift / 3} for t in ts]
    return {"problem": problem, "method": "lmo-sign", "delay": delay, "correction": correction, "points": pts,
            "slope": -0.25, "seeds": seeds}


def test_toy_rates_legends_are_off_the_data_and_coinciding_modes_stay_visible():
    from delaylab.toy.plots import plot_rates_grid

    # tau = 1 with and without EF measure the same numbers: drawn on top of each other before
    results = [_rate(p, d, c, s) for p in ("cauchy", "rastrigin")
               for d, c, s in ((0, "none", 1.0), (1, "none", 1.3), (1, "ef", 1.3))]
    fig = plot_rates_grid(results)
    assert "16" not in fig.get_suptitle() and "4 seeds" in fig.get_suptitle() and "95% t interval" in fig.get_suptitle()
    for ax in [a for a in fig.axes if a.get_legend() is not None]:
        assert _below(ax.get_legend(), ax)
        lines = [c.lines[0] for c in ax.containers]  # errorbar containers: the data line of each mode
        assert len({line.get_marker() for line in lines}) == 3
        xs = [tuple(line.get_xdata()) for line in lines]
        assert len(set(xs)) == 3  # side by side, not on top of each other


def test_mitigations_chart_draws_95_percent_t_intervals():
    from delaylab.reproduce.figures import plot_mitigations
    from delaylab.stats import sample, t_interval

    gaps = {"adamw": [0.2, 0.25, 0.3, 0.22], "muon": [0.1, 0.12, 0.08]}
    ef = {"adamw": [0.1, 0.15, 0.05, 0.12], "muon": [0.05, 0.07, 0.02]}
    rows = [{"optimizer": o, "gap": sample(gaps[o]), "ef_gap": sample(ef[o])} for o in gaps]
    fig = plot_mitigations({"rows": rows})
    ax = fig.axes[0]
    assert "95% t interval" in ax.get_title()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["delayed (no fix), 3 or 4 seeds",
                                                                  "ef, 3 or 4 seeds"]
    # each bar's error bar spans exactly its t interval
    spans = sorted(tuple(round(v, 12) for v in seg[:, 1]) for c in ax.containers if hasattr(c, "errorbar")
                   and c.errorbar is not None for seg in c.errorbar.lines[2][0].get_segments())
    want = sorted(tuple(round(v, 12) for v in t_interval(vals)) for d in (gaps, ef) for vals in d.values())
    assert spans == want


def test_profile_plot_writes_inf_where_the_table_does():
    from delaylab.toy.plots import plot_profile
    from delaylab.toy.profile import profile
    from delaylab.toy.runs import METHODS  # noqa: F401  (the registry the factory below comes from)
    from delaylab.toy.profile import registry_optimizer

    r = profile(registry_optimizer("lmo-spectral", 1.0, 0.9), problems=("logdet",), delays=(0, 1), ef=False,
                lr_scales=(1.0,), steps=(10, 20), seeds=2, bound_check=False)
    modes = r["stability"]["modes"]
    assert all(math.isinf(m["measured_lr"]) for m in modes)  # an LMO method has no threshold: inf in the table
    ax = plot_profile(r).axes[3]
    heights = [p.get_height() for p in ax.patches]
    assert len(heights) == len(modes) and all(h == 0 for h in heights)  # no bar stands for inf
    notes = [t.get_text() for t in ax.texts]
    assert notes.count("inf\n(none found)") == len(modes)


@pytest.mark.parametrize("value,note", [(0.0, "0")])
def test_profile_plot_writes_0_too(value, note):
    from delaylab.toy.plots import plot_profile
    from delaylab.toy.profile import profile, registry_optimizer

    r = profile(registry_optimizer("sgdm", 0.1, 0.9), problems=("logdet",), delays=(0, 1), ef=False,
                lr_scales=(1.0,), steps=(10,), seeds=2, bound_check=False)
    r["stability"]["modes"][1]["measured_lr"] = value
    ax = plot_profile(r).axes[3]
    assert ax.patches[1].get_height() == 0 and note in [t.get_text() for t in ax.texts]
    assert ax.patches[0].get_height() == r["stability"]["modes"][0]["measured_lr"] > 0
