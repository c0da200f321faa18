"""delaylab.llm.metrics on synthetic metrics records whose answers are computed by hand."""

import math

import pytest

from delaylab.errors import ConfigError
from delaylab import stats as ST
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


def test_overhead_of_a_run_that_never_gets_there_is_no_number():
    o = M.iso_loss_overhead(SYNC, curve([3.2, 2.8, 2.5, 2.3]))
    # no extrapolation of the last slope: at the end of a cosine schedule it is flat, not a bound
    assert not o["reached"] and o["overhead"] is None and "lower_bound" not in o
    assert o["tokens"] == pytest.approx(1.0) and M.fmt_overhead(o) == "not reached"
    first = M.iso_loss_overhead(SYNC, curve([2.0, 1.9]))
    assert first["upper_bound"] and first["overhead"] == pytest.approx(0.25) and M.fmt_overhead(first) == "<= 0.25"


def test_overhead_rejects_runs_without_validation():
    with pytest.raises(ConfigError, match="validation"):
        M.iso_loss_overhead(SYNC, [{"step": 1, "tokens": 10, "train_loss": 3.0}])


def test_overhead_over_seeds_has_no_mean_unless_every_seed_reaches():
    a = M.iso_loss_overhead(SYNC, curve([3.2, 2.8, 2.5, 2.3, 2.1]))  # 1.125
    b = M.iso_loss_overhead(SYNC, curve([3.2, 2.8, 2.5, 2.3]))  # never
    c = M.iso_loss_overhead(SYNC, curve([3.2, 2.8, 2.5, 2.25, 2.15, 2.1]))  # 400 + 0.05/0.1*100 = 450 -> 1.125
    d = M.iso_loss_overhead(SYNC, curve([3.2, 2.8, 2.5, 2.3, 2.2, 2.1]))  # at 500 exactly: 1.25
    s = M.overhead_over_seeds([a, c, d])
    assert s["mean"] == pytest.approx((1.125 + 1.125 + 1.25) / 3) and s["n_reached"] == 3
    assert s["ci"] == pytest.approx(ST.t_interval([1.125, 1.125, 1.25]))
    assert M.fmt_overhead(s) == f"{(1.125 * 2 + 1.25) / 3:.2f} [{s['ci'][0]:.2f}, {s['ci'][1]:.2f}]"
    s = M.overhead_over_seeds([a, b, None], max_length=4)
    assert s["values"] == [pytest.approx(1.125), None, None] and s["reached"] == [True, False, None]
    assert s["mean"] is None and s["median"] is None and s["ci"] is None and s["n_reached"] == 1
    assert M.fmt_overhead(s) == "not reached at 4x (1/3 seeds)"


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


def test_t_interval_and_the_one_sample_summary():
    lo, hi = ST.t_interval([1.0, 2.0, 3.0])
    half = 4.302652729911275 / math.sqrt(3)  # t_{0.975, 2} * sd 1 / sqrt(3)
    assert (lo, hi) == pytest.approx((2 - half, 2 + half))
    d = ST.sample([1.0, None, 3.0, float("nan"), 2.0])
    assert (d["n"], d["diverged"], d["mean"]) == (3, 2, 2.0) and d["std"] == pytest.approx(1.0)
    assert d["ci"] == pytest.approx([2 - half, 2 + half]) and d["values"][1] is None
    one = ST.sample([2.5])
    assert one["mean"] == 2.5 and one["std"] is None and one["ci"] is None  # one seed has no spread
    assert ST.sample([None]) == {"values": [None], "n": 0, "diverged": 1, "mean": None, "std": None, "ci": None}
    assert not hasattr(M, "describe") and not hasattr(ST, "bootstrap")  # one summary; no percentile bootstrap


def test_welch_interval_by_hand():
    a, b = [1.0, 2.0, 3.0], [2.0, 4.0, 6.0, 8.0]
    va, vb = 1.0 / 3, (20 / 3) / 4  # sample variances 1 and 6.667, over n
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 3)
    from scipy.stats import t

    half = t.ppf(0.975, df) * math.sqrt(va + vb)
    assert ST.welch_interval(a, b) == pytest.approx([5 - 2 - half, 5 - 2 + half])
    assert ST.welch_interval([1.0], b) is None


def _fieller_by_hand(x, y, tq):
    """Solve (mx - r my)^2 = tq^2 var(x - r y) / n for r with the quadratic formula, written out."""
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((a - mx) ** 2 for a in x) / (n - 1)
    syy = sum((b - my) ** 2 for b in y) / (n - 1)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y)) / (n - 1)
    q = tq ** 2 / n
    A, B, C = my ** 2 - q * syy, -2 * (mx * my - q * sxy), mx ** 2 - q * sxx
    r = sorted(((-B - math.sqrt(B * B - 4 * A * C)) / (2 * A), (-B + math.sqrt(B * B - 4 * A * C)) / (2 * A)))
    return A, r


def test_fieller_interval_by_hand_bounded_and_unbounded():
    x, y = [1.0, 1.2, 0.9, 1.1], [2.0, 2.1, 1.9, 2.3]
    tq = 3.182446305284263  # t_{0.975, 3}
    A, r = _fieller_by_hand(x, y, tq)
    got = ST.fieller(x, y)
    assert A > 0 and got["bounded"] and got["ci"] == pytest.approx(r, rel=1e-10)
    assert got["ratio"] == pytest.approx(sum(x) / sum(y))
    # each end is where the t statistic of x - r y equals the quantile
    for end in r:
        z = [a - end * b for a, b in zip(x, y)]
        m, sd = sum(z) / 4, math.sqrt(sum((v - sum(z) / 4) ** 2 for v in z) / 3)
        assert abs(m) / (sd / 2) == pytest.approx(tq, rel=1e-9)
    # a denominator whose t interval contains 0: the set is two half-lines (real roots) or everything
    x, y = [1.0, 1.2, 0.9], [0.5, -0.3, 0.2]
    A, r = _fieller_by_hand(x, y, 4.302652729911275)
    got = ST.fieller(x, y)
    assert A < 0 and not got["bounded"] and got["ci"] is None
    assert got["set"] == [[None, pytest.approx(r[0])], [pytest.approx(r[1]), None]]
    assert ST.fieller([1.0, -1.0, 0.1], [0.1, -0.1, 0.05])["set"] == [[None, None]]
    assert ST.fmt_set([[None, 1.0], [2.0, None]], ".1f") == "(-inf, 1.0] U [2.0, +inf)"
    assert ST.fmt_set([[None, None]]) == "unbounded" and ST.fmt_set(None) == "n/a"
    assert ST.map_set([[None, 0.2], [0.5, None]], -100, 100) == [[None, 50.0], [80.0, None]]


def test_recovery_ratio_of_means_with_fiellers_set():
    sync, delayed = {0: 2.0, 1: 2.2, 2: 2.1}, {0: 2.5, 1: 2.6, 2: 2.55}
    fix = {s: sync[s] + 0.2 * (delayed[s] - sync[s]) for s in sync}  # recovers 80% on every seed
    r = M.recovery(sync, delayed, fix)
    assert r["ratio_of_means"] == pytest.approx(80) and r["of_mean_gap"] == pytest.approx(80)
    assert r["ci"] == pytest.approx([80, 80]) and r["values"] == pytest.approx([80] * 3)
    # gaps 0.5, 0.4, 0.45: t interval 0.45 +- 4.303 * 0.05 / sqrt(3) excludes 0
    assert not r["unstable"]
    # EF gaps 0.05, 0.12, 0.10 against gaps 0.5, 0.4, 0.45: Fieller on (EF gap, gap), mapped to 100 (1 - r)
    fix = {0: 2.05, 1: 2.32, 2: 2.2}
    r = M.recovery(sync, delayed, fix)
    _, (lo, hi) = _fieller_by_hand([0.05, 0.12, 0.10], [0.5, 0.4, 0.45], 4.302652729911275)
    assert r["ci"] == pytest.approx([100 * (1 - hi), 100 * (1 - lo)], rel=1e-9)
    assert r["ratio_of_means"] == pytest.approx(100 * (1 - 0.27 / 1.35))
    # two seeds, gaps 0.5 and 0.3: mean 0.4 +- 12.71 * 0.1414 / sqrt(2) contains 0: unbounded
    r = M.recovery({0: 2.0, 1: 2.2}, {0: 2.5, 1: 2.5}, {0: 2.1, 1: 2.4})
    assert r["unstable"] and r["ci"] is None and r["set"][0][0] is None
    assert r["values"] == pytest.approx([80, 100 / 3]) and r["median"] == pytest.approx(170 / 3)
    assert r["ratio_of_means"] == pytest.approx(62.5)  # (2.5 - 2.25) / (2.5 - 2.1)
    r = M.recovery({0: 2.0, 1: None}, {0: 2.5, 1: 2.5}, {0: 2.1, 1: 2.4})  # a diverged sync run
    assert r["values"] == [pytest.approx(80), None] and r["unstable"] and r["ci"] is None and r["set"] is None
