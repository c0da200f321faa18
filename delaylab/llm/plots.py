"""Figures of a sweep, in the style of the paper: loss curves, iso-loss crossings, gap vs momentum,
loss vs peak lr.

Each function draws on ``ax`` (a new figure when ``None``) and returns the figure; nothing
here calls ``plt.show()``. Inputs are the plain dicts that :mod:`delaylab.llm.sweep` writes.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODE_STYLE = {
    "sync": dict(color="black", ls="-"),
    "delayed": dict(color="tab:red", ls="--"),
    "ef": dict(color="tab:blue", ls="-."),
    "dc-asgd": dict(color="tab:green", ls=":"),
    "dc-asgd-a": dict(color="tab:olive", ls=":"),
    "predict": dict(color="tab:purple", ls="-."),
    "lookahead": dict(color="tab:brown", ls="-."),
    "damp": dict(color="tab:gray", ls="--"),
    "ef+predict": dict(color="tab:cyan", ls="-"),
}


def _axes(ax):
    if ax is None:
        fig, ax = plt.subplots(figsize=(5, 3.6))
        return fig, ax
    return ax.figure, ax


def loss_curves(curves: dict, title: str = "", ax=None):
    """``curves[mode] = (steps, train_loss)`` or ``(steps, train_loss, seeds)`` (the mean over that many
    seeds, said in the legend) for one optimizer: every update from 0 on the axes, and the last half
    magnified in an inset (upper right, where falling curves leave the axes empty); the legend below."""
    fig, ax = _axes(ax)
    drawn = []
    for mode, curve in curves.items():
        steps, loss = curve[0], curve[1]
        seeds = curve[2] if len(curve) > 2 else None
        label = mode if seeds is None else f"{mode} ({seeds} seed{'s' if seeds != 1 else ''})"
        ax.plot(steps, loss, label=label, lw=1.3, **MODE_STYLE.get(mode, {}))
        drawn.append((steps, loss, MODE_STYLE.get(mode, {})))
    ax.set_xlabel("update")
    ax.set_ylabel("train loss (mean over seeds)")
    ax.set_title(title, fontsize=9)
    ax.set_xlim(left=0)
    if drawn:
        end = max(s[-1] for s, _, _ in drawn if s)
        inset = ax.inset_axes([0.5, 0.4, 0.47, 0.45])
        tail = []
        for steps, loss, style in drawn:
            pts = [(x, y) for x, y in zip(steps, loss) if x >= end / 2]
            inset.plot([x for x, _ in pts], [y for _, y in pts], lw=1.1, **style)
            tail += [y for _, y in pts]
        if tail:
            pad = 0.05 * (max(tail) - min(tail) or 1.0)
            inset.set_ylim(min(tail) - pad, max(tail) + pad)
        inset.set_title(f"updates {end // 2}-{end}", fontsize=7)
        inset.tick_params(labelsize=6)
        inset.grid(alpha=0.3)
        ax.legend(frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, fontsize=8)  # off the data
    ax.grid(alpha=0.3)
    return fig


def iso_loss(curves: dict, title: str = "", ax=None):
    """``curves[mode] = (tokens, val_loss, overhead)`` for one optimizer, ``overhead`` the dict of
    :func:`delaylab.llm.metrics.iso_loss_overhead` against sync (None for sync): sync's final
    loss as a line, each run's crossing of it as a dot (an arrow past the end where it never
    crosses), the overhead in the legend."""
    from delaylab.llm.metrics import fmt_overhead

    fig, ax = _axes(ax)
    target = None
    for mode, (tokens, loss, o) in curves.items():
        label = mode if o is None else f"{mode}: {fmt_overhead(o)}x tokens"
        line, = ax.plot(tokens, loss, marker=".", ms=4, lw=1.3, label=label, **MODE_STYLE.get(mode, {}))
        if o is None:
            continue
        target = o["target_loss"]
        if o["reached"]:
            ax.plot([o["overhead"] * o["sync_tokens"]], [target], "o", color=line.get_color(), ms=6)
        else:
            ax.annotate("", xy=(tokens[-1] * 1.04, target), xytext=(tokens[-1], target),
                        arrowprops=dict(arrowstyle="->", color=line.get_color()))
    if target is not None:
        ax.axhline(target, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("tokens")
    ax.set_ylabel("val loss")
    ax.set_title(title)
    if curves:
        lo = min(min(v[1]) for v in curves.values())
        last = max(v[1][len(v[1]) // 4] for v in curves.values() if v[1])
        ax.set_ylim(lo - 0.05, max(last, lo + 0.2))  # the end of the runs, where the crossing is
        ax.legend(frameon=False, fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def gap_vs_momentum(rows: dict, ax=None):
    """``rows[optimizer] = [(momentum, gap_mean, gap_std), ...]``."""
    fig, ax = _axes(ax)
    for name, pts in rows.items():
        pts = sorted(pts)
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] or 0.0 for p in pts],
                    marker="o", capsize=3, label=name)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("momentum")
    ax.set_ylabel("delayed - sync val loss (at the best sync lr)")
    ax.legend(frameon=False)
    ax.grid(alpha=0.3)
    return fig


def loss_vs_lr(rows: dict, title: str = "", ax=None):
    """``rows[mode] = [(lr, loss_mean, loss_std), ...]`` for one optimizer."""
    fig, ax = _axes(ax)
    for mode, pts in rows.items():
        pts = sorted(p for p in pts if p[1] is not None)
        if pts:
            ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] or 0.0 for p in pts],
                        marker="o", capsize=3, label=mode, **MODE_STYLE.get(mode, {}))
    ax.set_xscale("log")
    lrs = sorted({p[0] for pts in rows.values() for p in pts})
    ax.set_xticks(lrs, [f"{v:g}" for v in lrs])
    ax.minorticks_off()
    ax.set_xlabel("peak lr")
    ax.set_ylabel("final val loss")
    ax.set_title(title)
    ax.legend(frameon=False)
    ax.grid(alpha=0.3)
    return fig


def grid(n: int, width: float = 4.2, height: float = 3.4):
    """A row of ``n`` axes (a figure and the list of axes)."""
    fig, axes = plt.subplots(1, n, figsize=(width * n, height), squeeze=False)
    return fig, list(axes[0])


def save(fig, path) -> None:
    from delaylab._io import save_figure

    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)
