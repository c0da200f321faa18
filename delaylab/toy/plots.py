"""Figures for the toy checks (matplotlib, no pyplot state: every function takes ``ax=None``).

Each ``plot_*`` draws on ``ax`` (or a fresh figure) and returns the figure; :func:`save`
writes a PNG. Inputs are the dicts of :mod:`delaylab.toy.rates`.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter


def _axes(ax, size=(5.0, 3.6)):
    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=size, layout="constrained")
    return fig, fig.add_subplot()


def _label(result: dict) -> str:
    delay = result["delay"]
    mode = "sync" if delay == 0 else f"tau={delay}"
    if result["correction"] != "none":
        mode += f" {result['correction'].upper()}"
    return f"{result['method']} {mode}"


# One look per mode, so that runs whose numbers coincide (tau = 1 with and without EF often do) stay
# visible: the marker, its fill and the line width differ, and each mode sits a little to the side.
_MODE_LOOK = {"sync": dict(marker="o", lw=1.6, dodge=1 / 1.06),
              "delayed": dict(marker="s", lw=2.6, dodge=1.0),
              "corrected": dict(marker="^", lw=1.1, dodge=1.06, mfc="white")}


def _look(result: dict) -> dict:
    key = "sync" if result["delay"] == 0 else ("delayed" if result["correction"] == "none" else "corrected")
    return _MODE_LOOK[key]


def plot_rate(result: dict, ax=None, color=None, label: str | None = None):
    """Measured mean (with its 95% t interval over seeds) and the bound against T, on log-log axes."""
    fig, ax = _axes(ax)
    pts = result["points"]
    look = _look(result)
    ts = [p["T"] for p in pts]
    xs = [t * look["dodge"] for t in ts]
    mean = [p["measured"] for p in pts]
    err = [[m - p["ci"][0] for m, p in zip(mean, pts)], [p["ci"][1] - m for m, p in zip(mean, pts)]]
    label = label or _label(result)
    ratio = max((p["ratio"] for p in pts if p["ratio"] is not None), default=None)
    tail = "" if ratio is None else f", ratio <= {ratio:.2f}"
    line = ax.errorbar(xs, mean, yerr=err, marker=look["marker"], ms=5, capsize=2, color=color, lw=look["lw"],
                       mfc=look.get("mfc"), label=f"{label}: slope {result['slope']:.2f}{tail}")
    if result["points"][0]["bound"] is not None:
        ax.plot(ts, [p["bound"] for p in pts], ls="--", color=line[0].get_color(), alpha=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("T (updates)")
    ax.set_ylabel(r"mean$_{t<T}\ \|\nabla f(x_t)\|_*$")
    ax.grid(True, which="both", alpha=0.3)
    return fig


def plot_rates(results: list[dict], ax=None, title: str | None = None):
    """Several rate checks on one axis: solid = measured (mean over seeds, 95% t interval), dashed =
    bound; the legend below the axes, off the data."""
    fig, ax = _axes(ax)
    for r in results:
        plot_rate(r, ax=ax)
    seeds = results[0].get("seeds")
    ax.set_title(title or f"{results[0]['problem']}: measured (solid, {seeds} seeds, 95% t interval) vs bound "
                 "(dashed)", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    return fig


def _plot_gap(rows: list[dict], key: str, ax, xlabel: str, logx: bool):
    fig, ax = _axes(ax)
    xs = [r[key] for r in rows]
    rel = [100 * r["relative_gap"] for r in rows]
    err = [[100 * (r["gap"] - r["gap_ci"][0]) / r["sync"] for r in rows],
           [100 * (r["gap_ci"][1] - r["gap"]) / r["sync"] for r in rows]]
    ax.errorbar(xs, rel, yerr=err, marker="o", ms=4, capsize=2, label="measured (delayed - sync) / sync")
    if rows[0].get("predicted_relative_gap") is not None:
        ax.plot(xs, [100 * r["predicted_relative_gap"] for r in rows], ls="--", marker="s", ms=3,
                label="bound: delay term / sync bound")
    if logx:
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # label the swept values instead
        ax.set_xticks(xs, [f"{x:.2g}" for x in xs], fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("relative gap (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def plot_gap_vs_eta(cost: dict, ax=None):
    """Relative delay gap against eta at fixed beta: measured and the bound's prediction."""
    fig = _plot_gap(cost["eta_sweep"], "eta", ax, r"$\eta$", True)
    beta = cost["eta_sweep"][0]["beta"]
    fig.axes[-1].set_title(f"{cost['problem']} {cost['method']}, tau={cost['delay']}, beta={beta:g}, "
                           f"T={cost['T']}", fontsize=9)
    return fig


def plot_gap_vs_beta(cost: dict, ax=None):
    """Relative delay gap against 1 - beta (log axis), eta tuned per beta or fixed."""
    rows = [dict(r, one_minus_beta=1 - r["beta"]) for r in cost["beta_sweep"]]
    fig = _plot_gap(rows, "one_minus_beta", ax, r"$1-\beta$", True)
    how = "tuned per beta" if cost["beta_sweep_eta"] == "tuned" else "fixed"
    fig.axes[-1].set_title(f"{cost['problem']} {cost['method']}, tau={cost['delay']}, eta {how}, T={cost['T']}",
                           fontsize=9)
    return fig


def plot_compare(result: dict, ax=None):
    """:func:`delaylab.toy.rates.compare`: each delayed mode's gap vs sync per method, with its
    interval's upper half-width."""
    fig, ax = _axes(ax, size=(6.0, 3.4))
    modes = [m for m in result["modes"] if m != "sync"]
    width = 0.8 / max(len(modes), 1)
    for i, mode in enumerate(modes):
        xs = [j + (i - (len(modes) - 1) / 2) * width for j in range(len(result["rows"]))]
        ys = [100 * row[mode]["relative_gap"] for row in result["rows"]]
        errs = [100 * (row[mode]["relative_gap_ci"][1] - row[mode]["relative_gap"]) for row in result["rows"]]
        ax.bar(xs, ys, width, yerr=errs, capsize=2, label=mode)
    ax.set_xticks(range(len(result["rows"])), [row["method"] for row in result["rows"]], fontsize=8)
    ax.axhline(0, color="k", lw=0.6)
    ax.set_ylabel("gap vs sync (%)")
    ax.set_title(f"{result['problem']}: T={result['T']}, tau={result['delay']}, beta={result['beta']:g}",
                 fontsize=9)
    ax.legend(fontsize=8)
    return fig


def plot_rates_grid(results: list[dict], ncols: int = 3):
    """The README figure: one panel per problem with its first method's runs (the suite
    lists the natural LMO first: spectral for matrices, sign for vectors) in every mode; each
    panel's legend below it, the seeds and the interval in the figure's title."""
    problems = list(dict.fromkeys(r["problem"] for r in results))
    nrows = -(-len(problems) // ncols)
    fig = Figure(figsize=(4.4 * ncols, 4.1 * nrows), layout="constrained")
    for i, name in enumerate(problems):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        mine = [r for r in results if r["problem"] == name]
        chosen = [r for r in mine if r["method"] == mine[0]["method"]]
        plot_rates(chosen, ax=ax, title=f"{name}, {mine[0]['method']}")
    seeds = sorted({r["seeds"] for r in results})
    fig.suptitle(f"measured mean over {', '.join(map(str, seeds))} seeds with its 95% t interval (solid; "
                 "markers side by side where modes coincide) against the bound (dashed)", fontsize=10)
    return fig


def plot_profile(result: dict):
    """One page for :func:`delaylab.toy.profile.profile`: the delay cost per problem (each mode at
    its best lr, and at the sync-best lr), the lr sweeps (every problem) and the
    largest stable lr on the quadratic, measured (bars) and predicted (markers)."""
    import math

    fig = Figure(figsize=(12.0, 7.5), layout="constrained")
    axes = fig.subplots(2, 2)
    probs = result["problems"]
    delayed = [m["mode"] for m in probs[0]["modes"] if m["delay"]]
    width = 0.8 / max(len(delayed), 1)
    for ax, key, title in ((axes[0, 0], "cost_best", "delay cost, each mode at its best lr"),
                           (axes[0, 1], "cost_at_sync_lr", "delay cost at the sync-best lr")):
        top = 1.0
        for i, mode in enumerate(delayed):
            xs, ys, errs, div = [], [], [[], []], []
            for j, p in enumerate(probs):
                c = next(m for m in p["modes"] if m["mode"] == mode)[key]
                x = j + (i - (len(delayed) - 1) / 2) * width
                if math.isinf(c["mean"]):
                    div.append(x)
                    continue
                xs.append(x)
                ys.append(c["mean"])
                errs[0].append(c["mean"] - c["ci"][0])
                errs[1].append(c["ci"][1] - c["mean"])
                top = max(top, c["ci"][1])
            bars = ax.bar(xs, ys, width, yerr=errs, capsize=2, label=mode)
            for x in div:  # a diverged mode: a marker at the top, not an infinite bar
                ax.plot(x, top * 1.05, marker="^", color=bars.patches[0].get_facecolor() if bars.patches else "k")
        ax.axhline(1.0, color="k", lw=0.6)
        ax.set_xticks(range(len(probs)), [p["problem"] for p in probs], fontsize=7)
        ax.set_ylabel("delayed / sync metric")
        ax.set_title(title + " (mean, 95% t interval over seeds; ^ diverged)", fontsize=9)
        ax.legend(fontsize=7)
    ax = axes[1, 0]
    for k, mode in enumerate(m["mode"] for m in probs[0]["modes"]):
        for j, p in enumerate(probs):
            row = next(m for m in p["modes"] if m["mode"] == mode)
            sync_best = p["modes"][0]["best"]["mean"]
            ys = [v / sync_best for v in row["values"]]
            ax.plot(row["lrs"], ys, color=f"C{k}", alpha=0.8, marker=".", label=mode if j == 0 else None)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("lr")
    ax.set_ylabel(f"metric at T={result['steps'][-1]} / sync best")
    ax.set_title("lr sweeps, every problem (one line each)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax = axes[1, 1]
    stab = result.get("stability")
    if stab:
        # What the table calls inf (no threshold found in the scanned range) or 0 (unstable at every lr)
        # is written as such, not drawn as a bar of some height.
        modes = [r["mode"] for r in stab["modes"]]
        values = [r["measured_lr"] for r in stab["modes"]] + [r["predicted_lr"] for r in stab["modes"]
                                                             if r["predicted_lr"] is not None]
        finite = [v for v in values if 0 < v < math.inf]
        lo, hi = (min(finite) / 3, max(finite) * 3) if finite else (0.1, 10.0)
        ax.set_yscale("log")
        ax.set_ylim(lo, hi)
        ax.bar(modes, [v if 0 < v < math.inf else 0 for v in (r["measured_lr"] for r in stab["modes"])],
               color="C0", label="measured")
        for m, r in zip(modes, stab["modes"]):
            v = r["measured_lr"]
            if not 0 < v < math.inf:
                ax.annotate("inf\n(none found)" if v == math.inf else "0", (m, hi), xytext=(0, -4),
                            textcoords="offset points", ha="center", va="top", fontsize=7, color="C0")
        pred = [(m, r["predicted_lr"]) for m, r in zip(modes, stab["modes"]) if r["predicted_lr"] is not None]
        shown = [(m, v) for m, v in pred if 0 < v < math.inf]
        if shown:
            ax.plot([m for m, _ in shown], [v for _, v in shown], "rD", label="predicted")
        for m, v in pred:
            if not 0 < v < math.inf:
                ax.annotate("predicted " + ("inf" if v == math.inf else "0"), (m, lo), xytext=(0, 4),
                            textcoords="offset points", ha="center", va="bottom", fontsize=7, color="r")
        ax.set_ylabel("largest stable lr")
        ax.set_title(f"quadratic {'x'.join(map(str, stab['shape']))}, lambda={stab['curvature']:g}", fontsize=9)
        ax.legend(fontsize=7)
    else:
        ax.axis("off")
    fig.suptitle(f"{result['optimizer']}: {result['metric']}, {result['seeds']} seeds", fontsize=10)
    return fig


def save(fig, path: str | Path) -> Path:
    from delaylab._io import save_figure

    return save_figure(fig, path, dpi=120)


FIGURES = {
    "rates": (("toy_rate.png", lambda r: plot_rates([r])),),
    "suite": (("toy_rates.png", lambda r: plot_rates_grid(r["results"])),),
    "compare": (("toy_compare.png", plot_compare),),
    "cost": (("toy_gap_vs_eta.png", plot_gap_vs_eta), ("toy_gap_vs_beta.png", plot_gap_vs_beta)),
    "profile": (("toy_profile.png", plot_profile),),
}
"""The figures of each ``delaylab toy`` command's result: (file name, plot)."""


def save_figures(kind: str, result: dict, folder: str | Path) -> list[str]:
    """Write the :data:`FIGURES` of ``kind`` for ``result`` into ``folder``; their paths."""
    return [str(save(plot(result), Path(folder) / name)) for name, plot in FIGURES[kind]]
