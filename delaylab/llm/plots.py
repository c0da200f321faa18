"""Figures of a sweep, in the style of the paper: loss curves, gap vs momentum, loss vs peak lr.

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
}


def _axes(ax):
    if ax is None:
        fig, ax = plt.subplots(figsize=(5, 3.6))
        return fig, ax
    return ax.figure, ax


def loss_curves(curves: dict, title: str = "", ax=None):
    """``curves[mode] = (steps, train_loss)`` (mean over seeds) for one optimizer."""
    fig, ax = _axes(ax)
    for mode, (steps, loss) in curves.items():
        ax.plot(steps, loss, label=mode, lw=1.3, **MODE_STYLE.get(mode, {}))
    ax.set_xlabel("update")
    ax.set_ylabel("train loss")
    ax.set_title(title)
    if curves:
        lo = min(min(v) for _, v in curves.values())
        last = max(v[len(v) // 10] for _, v in curves.values() if v)
        ax.set_ylim(lo - 0.05, max(last, lo + 0.2))  # the informative part, not the first steps
        ax.legend(frameon=False)
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
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
