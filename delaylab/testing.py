"""pytest helpers: fail a CI run when an optimizer becomes fragile under a gradient delay.

    from delaylab.testing import assert_delay_robust

    def test_my_optimizer_keeps_its_rate_under_delay():
        assert_delay_robust(lambda params: MyOpt(params, lr=0.01), max_cost=1.25)

The helper runs :func:`delaylab.toy.profile.profile` on a small, fast grid (a few seconds on
one core) and raises ``AssertionError`` with a table of every check when one fails. A copyable
example is docs/examples/test_my_optimizer.py.
"""

from __future__ import annotations

import math
from typing import Sequence

from delaylab.errors import ConfigError
from delaylab.toy.profile import profile
from delaylab.toy.runs import OptimizerFactory


class DelayFragile(AssertionError):
    """What :func:`assert_delay_robust` raises: the message is the table, ``.profile`` the result."""

    def __init__(self, message: str, profile: dict):
        super().__init__(message)
        self.profile = profile


CHECKS = {"best": ("cost_best", "cost at best lr"), "sync_lr": ("cost_at_sync_lr", "cost at sync lr")}
DEFAULT_PROBLEMS = ("logdet", "matrix-sensing")  # matrices: optimizers for 2-D parameters run too


def assert_delay_robust(
    make_optimizer: OptimizerFactory,
    *,
    max_cost: float = 1.25,
    at: Sequence[str] = ("best", "sync_lr"),
    delays: Sequence[int] = (1,),
    corrections: Sequence[str] = ("none",),
    problems: Sequence = DEFAULT_PROBLEMS,
    lr_scales: Sequence[float] = (0.25, 0.5, 1.0, 2.0, 4.0),
    steps: Sequence[int] = (50, 100, 200),
    seeds: int = 8,
    seed: int = 0,
    min_stability_ratio: float | None = None,
    allow_skipped: bool = False,
    **profile_kwargs,
) -> dict:
    """Assert that a delay costs ``make_optimizer`` at most ``max_cost``; returns the profile.

    The cost is ``mean_t ||grad f(x_t)||`` delayed / sync, per seed on the same noise, averaged
    over seeds (the 95% interval is shown), for every problem and delay, and for each entry of
    ``at``: ``"best"`` (each run at its own best lr of the grid ``lr_scales`` x the factory's lr)
    and ``"sync_lr"`` (the delayed run at the sync-best lr: tune without delay, then turn the
    pipeline on). A diverged run costs inf. ``corrections``: which delayed runs are held to
    the limit, plain (``"none"``) and/or with error feedback (``"ef"``).
    ``min_stability_ratio``: also require, per delay, largest stable lr on the quadratic
    delayed / sync >= it (meaningful for linear methods: SGD, heavy ball). A problem the
    factory cannot build on (Muon on a vector) fails unless ``allow_skipped``. Other keywords
    go to :func:`~delaylab.toy.profile.profile`. Raises :class:`DelayFragile` (an
    AssertionError) with the table of every check, failures marked FAIL.
    """
    __tracebackhide__ = True  # pytest: the failing test's line, then the table, not this function's source
    bad_at = [a for a in at if a not in CHECKS]
    if bad_at or not at:
        raise ConfigError(f"at must name checks among {', '.join(CHECKS)}, got {list(at)}")
    if not corrections or any(c not in ("none", "ef") for c in corrections):
        raise ConfigError(f"corrections must be among 'none' and 'ef', got {list(corrections)}")
    if not max_cost > 0:
        raise ConfigError(f"max_cost must be > 0, got {max_cost}")
    result = profile(make_optimizer, problems=problems, delays=(0, *delays), ef="ef" in corrections, lr_scales=lr_scales,
                     steps=steps, seeds=seeds, seed=seed, stability_check=min_stability_ratio is not None,
                     bound_check=False, **profile_kwargs)
    rows = []  # (problem, mode, check, measured text, limit text, ok)
    for p in result["problems"]:
        for m in p["modes"]:
            if not m["delay"] or m["correction"] not in corrections:
                continue
            for a in at:
                key, label = CHECKS[a]
                c = m[key]
                rows.append((p["problem"], m["mode"], label, _ci(c), f"<= {max_cost:g}", c["mean"] <= max_cost))
    for s in result["skipped"]:
        rows.append((s["problem"], "-", "runs", "skipped: " + s["reason"], "runs", allow_skipped))
    if min_stability_ratio is not None and result["stability"] is None:
        rows.append(("quadratic", "-", "runs", "skipped: " + result["stability_skipped"], "runs", False))
    elif min_stability_ratio is not None:
        for m in result["stability"]["modes"]:
            if m["delay"]:
                r = m["measured_ratio"]
                ok = r is None or r >= min_stability_ratio  # None: sync has no threshold either
                rows.append(("quadratic", m["mode"], "stable lr / sync", _fmt(r), f">= {min_stability_ratio:g}", ok))
    failed = [r for r in rows if not r[5]]
    if failed:
        raise DelayFragile(_table(result["optimizer"], rows, len(failed)), result)
    return result


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.4g}"


def _ci(c: dict) -> str:
    if math.isinf(c["mean"]):
        return "diverged"
    return f"{c['mean']:.4g} [{c['ci'][0]:.4g}, {c['ci'][1]:.4g}]"


def _table(name: str, rows: list[tuple], n_failed: int) -> str:
    head = ("problem", "mode", "check", "measured [95% CI]", "limit", "")
    body = [r[:5] + ("ok" if r[5] else "FAIL",) for r in rows]
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(6)]
    fmt = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip()  # noqa: E731
    lines = [f"{name} is not delay-robust: {n_failed} of {len(rows)} checks failed "
             "(cost = delayed / sync mean gradient norm, same noise; diverged = inf)", fmt(head)]
    lines += [fmt(r) for r in body]
    return "\n".join(lines)
