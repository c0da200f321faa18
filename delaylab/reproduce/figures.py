"""The report's PNG figures, one per finding, drawn from the parts of :mod:`delaylab.reproduce.findings`.

Every ``plot_*`` takes the part (and the :class:`~delaylab.reproduce.ledger.Ledger` where it
reads curves and toy results), draws on ``ax`` or a new figure, and returns the figure;
:func:`write` saves them as ``DIR/repro_*.png``, :func:`names` says which there are. The GPT
panels reuse :mod:`delaylab.llm.plots`, the toy panels :mod:`delaylab.toy.plots`.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from delaylab.llm import plots as llm_plots  # noqa: E402

FIX_COLORS = {"delayed": "tab:red", "ef": "tab:blue", "dc-asgd": "tab:green", "sync-start": "tab:purple",
              "sync-cooldown": "tab:orange"}


def _mean_curve(L, folders: list[str]):
    """(steps, mean train loss, seeds) over the runs in ``folders`` that kept a curve."""
    curves = [c for c in (L.train_curve(f) for f in folders) if c[0]]
    if not curves:
        return None
    n = min(len(c[0]) for c in curves)
    return curves[0][0][:n], [sum(c[1][i] for c in curves) / len(curves) for i in range(n)], len(curves)


def _subplots(n: int, ncols: int = 3, w: float = 4.0, h: float = 3.2):
    ncols = min(n, ncols)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def plot_loss_curves(part1: dict, part2: dict, L):
    """Train loss (mean over seeds) of sync, delayed and delayed+EF at each optimizer's best sync lr."""
    rows2 = {r["optimizer"]: r for r in part2["rows"]}
    fig, axes = _subplots(len(part1["rows"]))
    for ax, row in zip(axes, part1["rows"]):
        runs = dict(row["runs"])
        if "ef" in rows2.get(row["optimizer"], {}).get("runs", {}):
            runs["ef"] = rows2[row["optimizer"]]["runs"]["ef"]
        curves = {m: c for m, c in ((m, _mean_curve(L, f)) for m, f in runs.items()) if c}
        llm_plots.loss_curves(curves, f"{row['optimizer']} (lr {row['lr']:g}): gap {_g(row['gap']['mean'])}", ax=ax)
    fig.suptitle("train loss, sync vs one-step delay vs delay + EF (mean over seeds)", fontsize=10)
    fig.tight_layout()
    return fig


def _g(x) -> str:
    return "n/a" if x is None else f"{x:+.3f}"


def _t_error(stat: dict) -> tuple[float, float]:
    """(below, above) the mean: the 95% t interval of a :func:`delaylab.stats.sample` (0 without one)."""
    if stat.get("mean") is None or not stat.get("ci"):
        return 0.0, 0.0
    return stat["mean"] - stat["ci"][0], stat["ci"][1] - stat["mean"]


def plot_mitigations(part2: dict, ax=None):
    """Gap to sync (final val loss) per optimizer, delayed and each mitigation: the mean over seeds with
    its 95% t interval (the interval the report quotes), the seeds in the legend."""
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(7.5, 3.8))
    rows = part2["rows"]
    modes = ["delayed"] + [k[: -len("_gap")] for k in rows[0] if k.endswith("_gap")]
    width = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        key = "gap" if mode == "delayed" else f"{mode}_gap"
        xs = [j + (i - (len(modes) - 1) / 2) * width for j in range(len(rows))]
        ys = [r[key]["mean"] if r[key]["mean"] is not None else math.nan for r in rows]
        err = list(zip(*(_t_error(r[key]) for r in rows)))
        seeds = sorted({r[key].get("n") for r in rows if r[key].get("n")})
        label = ("delayed (no fix)" if mode == "delayed" else mode) + \
            (f", {' or '.join(map(str, seeds))} seeds" if seeds else "")
        ax.bar(xs, ys, width, yerr=err, capsize=2, color=FIX_COLORS.get(mode), label=label)
    ax.set_xticks(range(len(rows)), [r["optimizer"] for r in rows])
    ax.axhline(0, color="black", lw=0.8)
    ax.set_ylabel("val loss - sync val loss")
    ax.set_title("gap to sync per optimizer, with and without mitigations (mean over seeds, error bars: "
                 "95% t interval)", fontsize=9)
    ax.legend(frameon=False, fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_momentum(part3: dict):
    """Measured gap vs momentum (left) and the theory's quantity for each optimizer (right)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    by_opt: dict[str, list] = {}
    for r in part3["rows"]:
        by_opt.setdefault(r["optimizer"], []).append(r)
    for i, (o, rs) in enumerate(by_opt.items()):
        color = f"C{i}"
        for style, label, get in ((":", "lr fixed", lambda r: r["fixed_gap"]), ("--", "sync-tuned", lambda r: r["gap"]),
                                  ("-", "each tuned", lambda r: r["tuned"]["gap"])):
            pts = [(r["momentum"], get(r)["mean"], _t_error(get(r))) for r in rs if get(r)["mean"] is not None]
            if pts:
                a.errorbar([x for x, _, _ in pts], [y for _, y, _ in pts], list(zip(*(e for _, _, e in pts))),
                           ls=style, marker="o", ms=3, capsize=2, color=color, label=f"{o}, {label}")
    a.axhline(0, color="black", lw=0.8)
    a.set_xlabel("momentum")
    a.set_ylabel("delayed - sync val loss")
    a.legend(frameon=False, fontsize=6)
    a.grid(alpha=0.3)
    a.set_title("measured, three lr protocols (error bars: 95% t interval over seeds)", fontsize=9)
    for o, rs in by_opt.items():
        pred = rs[0]["prediction"]
        key = "relative_penalty" if pred["kind"] == "lmo" else "stable_shrink"
        label = f"{o}: delay/momentum term (Thm 1)" if key == "relative_penalty" else f"{o}: sync/delayed stable range"
        b.plot([r["momentum"] for r in rs], [r["prediction"][key] for r in rs], marker="o", label=label)
    b.set_yscale("log")
    b.set_xlabel("momentum")
    b.set_ylabel("theory's quantity (log)")
    b.set_title("predicted (higher = more delay-sensitive)", fontsize=9)
    b.legend(frameon=False, fontsize=7)
    b.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig


def plot_learning_rate(part4: dict):
    by_opt: dict[str, list] = {}
    for r in part4["rows"]:
        by_opt.setdefault(r["optimizer"], []).append(r)
    fig, axes = _subplots(len(by_opt), ncols=len(by_opt), w=4.5, h=3.5)
    for ax, (o, rs) in zip(axes, by_opt.items()):
        # the t interval is symmetric about the mean: its half-width is the error bar
        pts = {m: [(r["lr"], r[m]["mean"], _t_error(r[m])[1]) for r in rs] for m in ("sync", "delayed")}
        llm_plots.loss_vs_lr(pts, f"{o}: final val loss vs peak lr (95% t)", ax=ax)
        for r in rs:
            if r["delayed"]["diverged"]:
                ax.annotate("diverged", (r["lr"], ax.get_ylim()[1]), ha="center", va="top", fontsize=7, color="tab:red")
    fig.tight_layout()
    return fig


def plot_schedules(part5: dict, ax=None):
    """Gap to sync of 2BW and PipeDream at each depth, per optimizer (mean over seeds, 95% t interval)."""
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(6.5, 3.6))
    rows = [r for r in part5["rows"] if r["schedule"] != "sync"]
    opts = list(dict.fromkeys(r["optimizer"] for r in rows))
    names = list(dict.fromkeys(r["schedule"] for r in rows))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        mine = {r["optimizer"]: r for r in rows if r["schedule"] == name}
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(opts))]
        ys = [mine[o]["gap"]["mean"] if mine[o]["gap"]["mean"] is not None else math.nan for o in opts]
        err = list(zip(*(_t_error(mine[o]["gap"]) for o in opts)))
        tau = mine[opts[0]]["delays"]
        ax.bar(xs, ys, width, yerr=err, capsize=2, label=f"{name} (tau {tau}, mean {mine[opts[0]]['mean_delay']:.2g})")
    ax.set_xticks(range(len(opts)), opts)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_ylabel("val loss - sync val loss")
    ax.set_title("constant delay (2BW) vs PipeDream's per-stage delays (error bars: 95% t interval)", fontsize=9)
    ax.legend(frameon=False, fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_toy(part6: dict, L):
    """Measured mean ||grad f||_* and the bound against T (log-log), one panel per problem."""
    from delaylab.toy.plots import plot_rates_grid

    results = [L.summary_of(r["runs"][0]) for r in part6["rows"]]
    return plot_rates_grid(results, ncols=min(3, len({r["problem"] for r in results})))


def plot_ablations(part7: dict):
    """Gap to sync with and without EF under each warmup and length setting, and DC-ASGD's
    recovered share against lambda (DC-ASGD-a dashed)."""
    rows = part7["rows"]
    panels = [k for k in ("warmup", "length", "dc") if rows[k]]
    fig, axes = _subplots(max(1, len(panels)), ncols=3, w=4.3, h=3.4)
    for ax, key in zip(axes, panels):
        if key == "dc":
            by_opt: dict[str, list] = {}
            for r in rows["dc"]:
                by_opt.setdefault(r["optimizer"], []).append(r)
            for i, (o, rs) in enumerate(by_opt.items()):
                pts = [(r["lambda"], r["recovered"]["ratio_of_means"], r["recovered"].get("ci")) for r in rs
                       if r["lambda"] is not None and r["recovered"] and r["recovered"]["ratio_of_means"] is not None]
                if pts:
                    ys = [y for _, y, _ in pts]
                    lo = [y - ci[0] if ci else 0.0 for _, y, ci in pts]
                    hi = [ci[1] - y if ci else 0.0 for _, y, ci in pts]
                    ax.errorbar([x for x, _, _ in pts], ys, [lo, hi], marker="o", capsize=2, color=f"C{i}", label=o)
                ada = [r for r in rs if r["lambda"] is None and r["recovered"] and
                       r["recovered"]["ratio_of_means"] is not None]
                if ada:
                    ax.axhline(ada[0]["recovered"]["ratio_of_means"], ls="--", color=f"C{i}", label=f"{o} DC-ASGD-a")
            ax.set_xscale("log")
            ax.axhline(0, color="black", lw=0.8)
            ax.set_xlabel("lambda")
            ax.set_ylabel("gap recovered (%)")
            ax.set_title("DC-ASGD: share of the gap recovered (95% Fieller, where bounded)", fontsize=9)
            ax.legend(frameon=False, fontsize=7)
            ax.grid(alpha=0.3, which="both")
            continue
        labels, gaps, efs = [], [], []
        for r in rows[key]:
            for name, st in r["settings"].items():
                labels.append(f"{r['optimizer']}\n{name.split('-', 1)[1]}")
                gaps.append((st["gap"]["mean"], _t_error(st["gap"])))
                fix = st.get("fix_gap") or {}
                efs.append((fix.get("mean"), _t_error(fix)))
        xs = range(len(labels))
        ax.bar([x - 0.2 for x in xs], [math.nan if g is None else g for g, _ in gaps], 0.4,
               yerr=list(zip(*(e for _, e in gaps))), capsize=2, color=FIX_COLORS["delayed"], label="delayed")
        ax.bar([x + 0.2 for x in xs], [math.nan if g is None else g for g, _ in efs], 0.4,
               yerr=list(zip(*(e for _, e in efs))), capsize=2, color=FIX_COLORS["ef"], label="delayed + EF")
        ax.set_xticks(list(xs), labels, fontsize=7)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_ylabel("val loss - sync val loss")
        ax.set_title(f"{key}: gap to the sync run of the same setting (95% t)", fontsize=9)
        ax.legend(frameon=False, fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_scale(part8: dict):
    """Gap to sync (mean, 95% t interval; dots: seeds) and EF's recovered share (95% Fieller where
    bounded) against tokens per parameter (log x), one line per (optimizer, model size)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    rows = part8["rows"]
    opts = list(dict.fromkeys(o for e in rows for o in e["optimizers"]))
    sizes = list(dict.fromkeys(e["size"] for e in rows))
    styles = ["-", "--", ":", "-."]
    for i, o in enumerate(opts):
        for j, size in enumerate(sizes):
            mine = [e for e in rows if e["size"] == size and o in e["optimizers"]]
            if not mine:
                continue
            xs = [e["tokens_per_param"] for e in mine]
            sts = [e["optimizers"][o] for e in mine]
            label = f"{o}, {size}"
            for x, st in zip(xs, sts):
                vals = [v for v in st["gap"]["values"] if v is not None]
                a.scatter([x] * len(vals), vals, s=8, color=f"C{i}", alpha=0.4)
            ys = [math.nan if st["gap"]["mean"] is None else st["gap"]["mean"] for st in sts]
            err = [[y - st["gap"]["ci"][0] if st["gap"]["ci"] else 0.0 for y, st in zip(ys, sts)],
                   [st["gap"]["ci"][1] - y if st["gap"]["ci"] else 0.0 for y, st in zip(ys, sts)]]
            a.errorbar(xs, ys, err, marker="o", ms=4, capsize=2, color=f"C{i}", ls=styles[j % 4], label=label)
            rec = [(x, st.get("recovered") or {}) for x, st in zip(xs, sts)]
            pts = [(x, r["ratio_of_means"], r.get("ci")) for x, r in rec if r.get("ratio_of_means") is not None]
            if pts:
                b.errorbar([x for x, _, _ in pts], [y for _, y, _ in pts],
                           [[y - ci[0] if ci else 0.0 for _, y, ci in pts],
                            [ci[1] - y if ci else 0.0 for _, y, ci in pts]],
                           marker="o", ms=4, capsize=2, color=f"C{i}", ls=styles[j % 4], label=f"{label} EF")
    b.axhspan(50, 90, color="0.9", label="paper: 50-90%")
    for ax in (a, b):
        ax.set_xscale("log")
        ax.set_xlabel("tokens per parameter")
        ax.grid(alpha=0.3, which="both")
        ax.legend(frameon=False, fontsize=7)
        ax.axvline(20, color="0.5", lw=0.8, ls=":")
    a.axhline(0, color="black", lw=0.8)
    a.set_ylabel("delayed - sync val loss")
    a.set_title("gap to sync against tokens per parameter (95% t; dots: seeds; 20 = the paper's)", fontsize=8)
    b.axhline(0, color="black", lw=0.8)
    b.set_ylabel("gap recovered by EF (%)")
    b.set_title("EF recovery against tokens per parameter (95% Fieller where bounded)", fontsize=8)
    fig.tight_layout()
    return fig


_SETTING_MARKERS = ("s", "^", "D", "v", "P", "X")


def plot_delays(part9: dict):
    """Top: each mode's gap (95% t) against the mean delay, one panel per optimizer; bottom: the
    share each corrector recovers (95% Fieller; hollow without a bar where the set is unbounded).
    Uniform tau on the base model as lines; per-stage, random and other-model settings as markers."""
    from delaylab.llm.plots import MODE_STYLE

    rows = part9["rows"]
    opts = list(dict.fromkeys(r["optimizer"] for r in rows))
    fig, axes = plt.subplots(2, len(opts), figsize=(5.2 * len(opts), 7.4), squeeze=False)
    lines = {(r["setting"]) for r in rows if isinstance(r["delay"], int) and not r["model"]}
    others = list(dict.fromkeys(r["setting"] for r in rows if r["setting"] not in lines))
    marker = {name: _SETTING_MARKERS[i % len(_SETTING_MARKERS)] for i, name in enumerate(others)}
    for col, opt in enumerate(opts):
        top, bottom = axes[0][col], axes[1][col]
        mine = [r for r in rows if r["optimizer"] == opt]
        for mode in dict.fromkeys(r["mode"] for r in mine):
            color = MODE_STYLE.get(mode, {}).get("color")
            for ax, get in ((top, lambda r: (r["gap"]["mean"], r["gap"]["ci"])),
                            (bottom, lambda r: ((r.get("recovered") or {}).get("ratio_of_means"),
                                                (r.get("recovered") or {}).get("ci")))):
                if ax is bottom and mode == "delayed":
                    continue
                pts = sorted((r["mean_delay"], *get(r)) for r in mine if r["mode"] == mode and r["setting"] in lines
                             and get(r)[0] is not None)
                if pts:
                    xs, ys = [x for x, _, _ in pts], [y for _, y, _ in pts]
                    ax.plot(xs, ys, "o-", color=color, label=mode, lw=1.2)
                    for x, y, ci in pts:
                        if ci:
                            ax.errorbar([x], [y], [[y - ci[0]], [ci[1] - y]], color=color, capsize=2, lw=0.8)
                        elif ax is bottom:
                            ax.plot([x], [y], "o", mfc="white", color=color)
                for r in mine:
                    if r["mode"] != mode or r["setting"] in lines or get(r)[0] is None:
                        continue
                    y, ci = get(r)
                    ax.errorbar([r["mean_delay"] * 1.04], [y], None if not ci else [[y - ci[0]], [ci[1] - y]],
                                fmt=marker[r["setting"]], color=color, capsize=2, lw=0.8,
                                mfc=color if ci or ax is top else "white")
        for name in others:
            top.plot([], [], marker[name], color="gray", label=name)
        top.axhline(0, color="black", lw=0.8)
        bottom.axhline(0, color="black", lw=0.8)
        bottom.axhline(100, color="gray", lw=0.8, ls=":")
        top.set(title=f"{opt}: gap to sync, each mode at its lr (95% t)", ylabel="val loss - sync val loss")
        bottom.set(title=f"{opt}: share of the gap recovered (95% Fieller)", ylabel="recovered (%)",
                   xlabel="mean delay tau")
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.grid(alpha=0.3)
            ax.legend(frameon=False, fontsize=7)
            ax.title.set_fontsize(9)
    fig.tight_layout()
    return fig


def plot_tokens(part: dict):
    """Left: the gap (mean, 95% t band) at every validation of the 20:1 runs, against the fraction of
    the run, cosine / constant / 10x batch per size. Right: the final gap at every point (95% t)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    rows = part["rows"]
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    top = max(r["tokens_per_param"] for r in rows)
    styles = {"cosine": "-", "constant": "--", "wide": ":"}
    for i, size in enumerate(sizes):
        for r in rows:
            if r["size"] != size or r["tokens_per_param"] != top:
                continue
            xs = [x["fraction"] for x in r["along"]]
            ys = [math.nan if x["gap"]["mean"] is None else x["gap"]["mean"] for x in r["along"]]
            a.plot(xs, ys, color=f"C{i}", ls=styles[r["kind"]], marker="o", ms=2, label=f"{size}, {r['kind']}")
            lo = [x["gap"]["ci"][0] if x["gap"]["ci"] else math.nan for x in r["along"]]
            hi = [x["gap"]["ci"][1] if x["gap"]["ci"] else math.nan for x in r["along"]]
            a.fill_between(xs, lo, hi, color=f"C{i}", alpha=0.12)
    a.axhline(0, color="black", lw=0.8)
    a.set_xlabel("fraction of the run (updates)")
    a.set_ylabel("delayed - sync val loss")
    a.set_title(f"gap along the {top:g}:1 runs (95% t band)", fontsize=8)
    order = list(dict.fromkeys((r["tokens_per_param"], r["kind"]) for r in rows))
    for i, size in enumerate(sizes):
        mine = {(r["tokens_per_param"], r["kind"]): r for r in rows if r["size"] == size}
        for j, key in enumerate(order):
            g = mine[key]["gap"]
            if g["mean"] is None:
                continue
            err = [[g["mean"] - g["ci"][0]], [g["ci"][1] - g["mean"]]] if g["ci"] else None
            b.errorbar([j + 0.2 * (i - 1)], [g["mean"]], err, marker="o", ms=4, capsize=2, color=f"C{i}",
                       label=size if j == 0 else None)
    b.set_xticks(range(len(order)), [f"{r:g}:1\n{k}" for r, k in order], fontsize=7)
    b.axhline(0, color="black", lw=0.8)
    b.set_title("final gap at each point (95% t)", fontsize=8)
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(frameon=False, fontsize=7)
    fig.tight_layout()
    return fig


FILES = {"optimizers": "repro_loss_curves.png", "mitigations": "repro_gap_mitigations.png",
         "momentum": "repro_gap_vs_momentum.png", "learning_rate": "repro_loss_vs_lr.png",
         "schedules": "repro_schedules.png", "toy": "repro_toy_rates.png", "ablations": "repro_ablations.png",
         "scale": "repro_scale.png", "delays": "repro_delays.png", "tokens": "repro_tokens.png"}


def names(parts: dict) -> dict[str, str]:
    """``{part key: file name}`` of the figures the report of ``parts`` has."""
    return {k: v for k, v in FILES.items() if k in parts}


def write(parts: dict, L, out: Path) -> dict[str, str]:
    """Every figure as ``out/repro_<name>.png``; returns ``{part key: file name}``."""
    figs = {
        "optimizers": lambda: plot_loss_curves(parts["optimizers"], parts["mitigations"], L),
        "mitigations": lambda: plot_mitigations(parts["mitigations"]),
        "momentum": lambda: plot_momentum(parts["momentum"]),
        "learning_rate": lambda: plot_learning_rate(parts["learning_rate"]),
        "schedules": lambda: plot_schedules(parts["schedules"]),
        "toy": lambda: plot_toy(parts["toy"], L),
        "ablations": lambda: plot_ablations(parts["ablations"]),
        "scale": lambda: plot_scale(parts["scale"]),
        "delays": lambda: plot_delays(parts["delays"]),
        "tokens": lambda: plot_tokens(parts["tokens"]),
    }
    written = names(parts)
    for key, name in written.items():
        fig = figs[key]()
        fig.savefig(Path(out) / name, dpi=110, bbox_inches="tight")
        plt.close(fig)  # no-op for the pyplot-free figures of toy.plots
    return written
