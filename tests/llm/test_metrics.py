"""delaylab.llm.metrics on synthetic metrics records whose answers are computed by hand."""

import math

import numpy as np
import pytest

from delaylab.errors import ConfigError
from delaylab.llm import metrics as M


def curve(vals, every=100, step_tokens=1, lrs=None, key="val_loss"):
    """Records at tokens every, 2*every, ...; train-only lines in between (no val_loss)."""
    out = []
    for i, v in enumerate(vals):
        t = every * (i + 1)
        out.append({"step": t // step_tokens - 1, "tokens": t - 50, "train_loss": 9.0})  # no validation
        out.append({"step": t // step_tokens, "tokens": t, key: v, "train_loss": 9.0,
                    **({"lr": lrs[i]} if lrs else {})})
    return out


SYNC = curve([3.0, 2.6, 2.4, 2.2])  # target 2.2 at 400 tokens


def test_overhead_interpolates_linearly_between_validation_points():
    o = M.iso_loss_overhead(SYNC, curve([3.2, 2.8, 2.5, 2.3, 2.1]))
    # between (400, 2.3) and (500, 2.1): 400 + 0.1/0.2 * 100 = 450 tokens; 450/400
    assert o["reached"] and o["overhead"] == pytest.approx(1.125)
    assert o["resolution"] == pytest.approx(0.25) and o["target_loss"] == 2.2 and o["sync_tokens"] == 400
    assert M.fmt_overhead(o) == "1.12"
    # a faster run: crossing between (200, 2.5) and (300, 2.0): 200 + 0.3/0.5*100 = 260
    assert M.iso_loss_overhead(SYNC, curve([3.0, 2.5, 2.0]))["overhead"] == pytest.approx(0.65)
    # the sync run against itself reaches its own loss exactly at its end
    assert M.iso_loss_overhead(SYNC, SYNC)["overhead"] == pytest.approx(1.0)


def test_overhead_of_a_run_that_never_gets_there_is_a_lower_bound():
    o = M.iso_loss_overhead(SYNC, curve([3.2, 2.8, 2.5, 2.3]))
    # last interval falls 0.2 per 100 tokens: 0.1 more needs >= 50 tokens: (400 + 50) / 400
    assert not o["reached"] and o["overhead"] is None and o["extrapolated"]
    assert o["lower_bound"] == pytest.approx(1.125)
    assert M.fmt_overhead(o) == "> 1.12"
    flat = M.iso_loss_overhead(SYNC, curve([3.2, 2.8, 2.3, 2.3]))
    assert flat["lower_bound"] == pytest.approx(1.0) and not flat["extrapolated"]
    first = M.iso_loss_overhead(SYNC, curve([2.0, 1.9]))
    assert first["upper_bound"] and first["overhead"] == pytest.approx(0.25) and M.fmt_overhead(first) == "<= 0.25"


def test_overhead_rejects_runs_without_validation():
    with pytest.raises(ConfigError, match="validation"):
        M.iso_loss_overhead(SYNC, [{"step": 1, "tokens": 10, "train_loss": 3.0}])


def test_overhead_over_seeds_is_a_lower_bound_when_a_seed_never_reaches():
    a = M.iso_loss_overhead(SYNC, curve([3.2, 2.8, 2.5, 2.3, 2.1]))  # 1.125
    b = M.iso_loss_overhead(SYNC, curve([3.2, 2.8, 2.5, 2.3]))  # > 1.125
    c = M.iso_loss_overhead(SYNC, curve([3.2, 2.8, 2.5, 2.25, 2.15]))  # 400 + 0.05/0.1*100 = 450 -> 1.125
    s = M.overhead_over_seeds([a, c])
    assert s["mean"] == pytest.approx(1.125) and not s["is_lower_bound"] and M.fmt_overhead(s) == "1.12"
    s = M.overhead_over_seeds([a, b, None])
    assert s["values"][2] is None and s["reached"] == [True, False, None]
    assert s["is_lower_bound"] and s["median"] == pytest.approx(1.125) and M.fmt_overhead(s) == "> 1.12"


def train_curve(losses, warmup_lines=2, every=10):
    """Training-loss lines every ``every`` steps; the lr ramps over the first ``warmup_lines`` lines."""
    return [{"step": every * (i + 1), "tokens": 64 * every * (i + 1), "train_loss": v,
             "lr": min(1.0, (i + 1) / warmup_lines) * (1 - 0.001 * i)} for i, v in enumerate(losses)]


def test_warmup_end_is_the_first_logged_step_at_the_peak_lr():
    assert M.warmup_end(train_curve([4.0] * 6, warmup_lines=3)) == 30
    with pytest.raises(ConfigError, match="lr"):
        M.warmup_end([{"step": 1, "train_loss": 3.0}])


def test_loss_spike_after_warmup():
    # warmup ends at step 20; the rise 4.0 -> 4.6 inside warmup does not count; after it the
    # running minimum is 3.5 (step 30) and step 40 rises 0.4 above it; 3.45 is 0.05 above 3.4
    rec = train_curve([4.0, 4.6, 3.5, 3.9, 3.4, 3.45, 3.0])
    s = M.loss_spike(rec)
    assert s["warmup"] == 20 and s["step"] == 40
    assert s["spike"] == pytest.approx(0.4) and s["relative"] == pytest.approx(0.4 / 3.5)
    assert M.loss_spike(train_curve([4.0, 3.5, 3.0, 2.5]))["spike"] == 0.0  # monotone: no spike
    assert M.loss_spike(rec, warmup=40)["spike"] == pytest.approx(0.05)  # an explicit warmup


def test_plateau_exit():
    # level 3.3 at step 20; threshold 3.2; trailing means of 3 lines after warmup:
    # step 90: (3.3 + 3.29 + 3.1)/3 = 3.23, step 100: (3.29 + 3.1 + 2.9)/3 = 3.097 < 3.2
    plateau = [4.0, 3.3, 3.3, 3.32, 3.28, 3.3, 3.3, 3.29, 3.1, 2.9, 2.8, 2.7]
    p = M.plateau_exit(train_curve(plateau))
    assert (p["level"], p["step"], p["after_warmup"], p["left"]) == (3.3, 100, 80, True)
    falling = train_curve([4.0, 3.3, 3.1, 3.0, 2.9, 2.8])
    assert M.plateau_exit(falling)["step"] == 50  # the first full window: (3.1 + 3.0 + 2.9)/3 = 3.0
    assert M.plateau_exit(falling, window=1)["step"] == 30
    stuck = M.plateau_exit(train_curve([4.0, 3.3, 3.3, 3.25, 3.3]))
    assert stuck["step"] is None and not stuck["left"]
    with pytest.raises(ConfigError):
        M.plateau_exit(falling, drop=0)
    d = M.diagnostics(train_curve(plateau))
    assert d["plateau"]["step"] == 100 and d["spike"]["spike"] == pytest.approx(0.02)  # 3.32 - 3.3


def test_t_interval_and_describe():
    lo, hi = M.t_interval([1.0, 2.0, 3.0])
    half = 4.302652729911275 / math.sqrt(3)  # t_{0.975, 2} * sd 1 / sqrt(3)
    assert (lo, hi) == pytest.approx((2 - half, 2 + half))
    d = M.describe([1.0, None, 3.0, 2.0])
    assert d["n"] == 3 and d["mean"] == 2.0 and d["median"] == 2.0 and d["std"] == pytest.approx(1.0)
    assert d["ci_t"] == pytest.approx([2 - half, 2 + half]) and d["values"][1] is None
    one = M.describe([2.5])
    assert one["std"] is None and one["ci_t"] is None and one["ci_boot"] is None and one["median"] == 2.5


def test_bootstrap_equals_a_hand_resample_and_covers_a_known_mean():
    x = [1.0, 2.0, 4.0]
    # the documented draw, recomputed by a plain loop: 5 resamples of 3 seeds from PCG64(7)
    idx = np.random.Generator(np.random.PCG64(7)).integers(0, 3, (5, 3))
    means = sorted(sum(x[j] for j in row) / 3 for row in idx)
    lo, hi = M.bootstrap(x, resamples=5, seed=7, confidence=0.5)
    # numpy's linear quantile at 0.25 and 0.75 of 5 sorted values: the 2nd and 4th
    assert (lo, hi) == pytest.approx((means[1], means[3]))
    assert M.bootstrap([1.0]) is None
    # coverage: 95% intervals of N(0, 1) samples of 30 contain 0 in about 95% of 300 trials
    rng = np.random.default_rng(123)
    hits = sum(lo <= 0 <= hi for lo, hi in (M.bootstrap(rng.normal(size=30), seed=k) for k in range(300)))
    assert 0.89 <= hits / 300 <= 0.98  # percentile bootstrap under-covers slightly at n = 30


def test_recovery_ratio_of_means_with_a_paired_bootstrap():
    sync, delayed = {0: 2.0, 1: 2.2, 2: 2.1}, {0: 2.5, 1: 2.6, 2: 2.55}
    fix = {s: sync[s] + 0.2 * (delayed[s] - sync[s]) for s in sync}  # recovers 80% on every seed
    r = M.recovery(sync, delayed, fix)
    assert r["ratio_of_means"] == pytest.approx(80) and r["of_mean_gap"] == pytest.approx(80)
    assert r["ci_boot"] == pytest.approx([80, 80]) and r["values"] == pytest.approx([80] * 3)
    # gaps 0.5, 0.4, 0.45: t interval 0.45 +- 4.303 * 0.05 / sqrt(3) excludes 0
    assert not r["unstable"]
    # two seeds, gaps 0.5 and 0.3 (sweep's test): mean 0.4 +- 12.71 * 0.1414 / sqrt(2) contains 0
    r = M.recovery({0: 2.0, 1: 2.2}, {0: 2.5, 1: 2.5}, {0: 2.1, 1: 2.4})
    assert r["unstable"] and r["values"] == pytest.approx([80, 100 / 3]) and r["median"] == pytest.approx(170 / 3)
    # ratio of means: (2.5 - 2.25) / (2.5 - 2.1) = 62.5%; bootstrap draws each seed pair or a mix
    assert r["ratio_of_means"] == pytest.approx(62.5)
    lo, hi = r["ci_boot"]
    assert 100 / 3 - 1e-9 <= lo <= 62.5 <= hi <= 80 + 1e-9
    r = M.recovery({0: 2.0, 1: None}, {0: 2.5, 1: 2.5}, {0: 2.1, 1: 2.4})  # a diverged sync run
    assert r["values"] == [pytest.approx(80), None] and r["unstable"] and r["ci_boot"] is None
