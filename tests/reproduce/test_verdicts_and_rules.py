"""The verdict rule and the plan's three rules (lr grids grow at an edge, seeds by power,
longer runs for the iso-loss overhead) on hand-made run folders: no training."""

import json

import pytest

from delaylab.llm.sweep import Cell
from delaylab.reproduce import plan as P
from delaylab.reproduce.ledger import Folders
from delaylab.reproduce import verdicts as V
from delaylab.reproduce.runner import LLMRun

BASE = {"preset": "tiny", "steps": 100, "eval_every": 10, "ckpt_every": 50}


@pytest.mark.parametrize("interval,predicted,tolerance,want", [
    ([0.1, 0.3], (0, None), None, V.AGREES),       # a direction: the interval excludes 0 on its side
    ([-0.1, 0.3], (0, None), None, V.UNDETERMINED),
    ([-0.3, -0.1], (0, None), None, V.DISAGREES),
    ([55, 85], (50, 90), None, V.AGREES),          # inside the paper's 50-90%
    ([55, 94], (50, 90), None, V.UNDETERMINED),    # "agreed" before issue 36: it touches the range
    ([17, 30], (50, 90), None, V.DISAGREES),
    ([0.6, 0.9], 0.8, None, V.UNDETERMINED),       # a bare point can be contained, never agreed with
    ([0.6, 0.7], 0.8, None, V.DISAGREES),
    ([0.78, 0.84], 0.8, 0.05, V.AGREES),           # a point with a stated tolerance is a range
    ([0.78, 0.86], 0.8, 0.05, V.UNDETERMINED),
    (None, (0, None), None, V.UNDETERMINED),       # no bounded interval
])
def test_the_one_rule(interval, predicted, tolerance, want):
    assert V.state(interval, predicted, tolerance=tolerance) == want


# The seven non-directional "agrees" of the committed reports before issue 36 (EF against 50-90%,
# sync start against the theory's 13.9%): each straddles an edge, so each is undetermined now.
STRADDLING = [([14, 53], (50, 90)), ([6, 64], (50, 90)), ([21, 111], (50, 90)), ([19, 58], (50, 90)),
              ([9, 61], 13.9), ([2, 65], 13.9)]


@pytest.mark.parametrize("interval,predicted", STRADDLING)
def test_an_interval_that_also_covers_the_opposite_claim_is_undetermined(interval, predicted):
    assert V.state(interval, predicted) == V.UNDETERMINED
    assert V.state([14, 53], (10, 40)) == V.UNDETERMINED  # Muon's share against "EF recovers 10-40%" too


def test_no_interval_agrees_with_two_disjoint_claims():
    """Exhaustively on a grid: regions that do not overlap never both agree with one interval."""
    edges = [-2.0, -1.0, 0.0, 0.5, 1.0, 2.0]
    regions = [(a, b) for a in [None, *edges] for b in [*edges, None] if a is None or b is None or a < b]
    for lo in edges:
        for hi in [e for e in edges if e >= lo]:
            agreed = [r for r in regions if V.state([lo, hi], r) == V.AGREES]
            for r1 in agreed:
                for r2 in agreed:
                    lo1, hi1 = V.region(r1)
                    lo2, hi2 = V.region(r2)
                    assert max(lo1, lo2) < min(hi1, hi2), (lo, hi, r1, r2)  # they overlap


def test_censored_or_broken_protocol_is_undetermined_whatever_the_interval():
    assert V.state([0.6, 0.9], (0.5, 1), censored=True) == V.UNDETERMINED
    assert V.state([0.6, 0.9], (0.5, 1), issues=["muon momentum 0.95 needs 200 updates after warmup, has 190"]) \
        == V.UNDETERMINED
    sc = V.score("x", [0.6, 0.9], (0.5, 1), censored=True)
    assert V.why(sc) == "optimum censored at the lr grid's edge"
    assert V.why(V.score("x", [0.6, 0.9], 0.8)) == "a point with no stated tolerance: the interval contains it"
    assert V.why(V.score("x", [0.6, 1.1], (0.5, 1))) == "the interval straddles an edge of the claimed region"


def test_one_aggregation():
    A, D, U = V.AGREES, V.DISAGREES, V.UNDETERMINED
    assert V.aggregate([A, A]) == "yes"
    assert V.aggregate([A, U]) == "partly"  # before issue 24 finding 4 dropped the U and said yes
    assert V.aggregate([A, D]) == "partly"
    assert V.aggregate([D, U]) == "no"
    assert V.aggregate([U, U]) == "undetermined"
    assert V.aggregate([None]) == "n.a." and V.aggregate([]) == "n.a."
    assert V.counts([A, U, U]) == "agree 1, undetermined 2"


def _finish(out, run: LLMRun, loss: float | None, curve=None):
    folder = out / run.folder
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps({"val_loss": loss}))
    if curve is not None:
        (folder / "metrics.jsonl").write_text("".join(
            json.dumps({"step": i + 1, "tokens": 100 * (i + 1), "val_loss": v}) + "\n" for i, v in enumerate(curve)))


def _run(mode, lr, seed, variant="main", base=BASE, label=None):
    return LLMRun(variant, base, Cell("adamw", mode, float(lr), 0.9, seed), label or mode)


def test_an_lr_grid_grows_at_its_edge_up_to_the_limit(tmp_path):
    def runs_at(lr):
        return [_run(m, lr, s) for m in ("sync", "delayed") for s in range(2)]

    loss = {"sync": lambda lr: abs(lr - 2e-3), "delayed": lambda lr: lr}  # delayed: always better lower

    def finish_all(lrs):
        for lr in lrs:
            for r in runs_at(lr):
                _finish(tmp_path, r, loss[r.label](lr))

    g = P.adaptive_lrs(Folders(tmp_path), [1e-3, 2e-3, 4e-3], runs_at, ("sync", "delayed"), limit=2)
    assert not g["done"] and g["lrs"] == [1e-3, 2e-3, 4e-3]  # nothing finished yet
    finish_all(g["lrs"])
    g = P.adaptive_lrs(Folders(tmp_path), [1e-3, 2e-3, 4e-3], runs_at, ("sync", "delayed"), limit=2)
    assert not g["done"] and g["lrs"] == [5e-4, 1e-3, 2e-3, 4e-3]  # delayed's best at the low edge
    finish_all(g["lrs"])
    g = P.adaptive_lrs(Folders(tmp_path), [1e-3, 2e-3, 4e-3], runs_at, ("sync", "delayed"), limit=2)
    finish_all(g["lrs"])
    g = P.adaptive_lrs(Folders(tmp_path), [1e-3, 2e-3, 4e-3], runs_at, ("sync", "delayed"), limit=2)
    assert g["done"] and g["lrs"] == [2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3] and g["extended"] == {"low": 2, "high": 0}
    assert g["best"] == {"sync": 2e-3, "delayed": 2.5e-4}
    assert g["censored"] == {"sync": None, "delayed": "low"}  # still at the edge after two steps: censored


def test_seeds_by_power_stop_when_the_gap_is_resolved_or_at_the_cap(tmp_path):
    gaps = [0.30, 0.10, 0.32, 0.28, 0.31, 0.29]  # noisy first seeds, then tight

    def runs_for(lo, hi):
        return [_run(m, 1e-3, s) for m in ("sync", "delayed") for s in range(lo, hi)]

    def finish(n):
        for s in range(n):
            _finish(tmp_path, _run("sync", 1e-3, s), 2.0)
            _finish(tmp_path, _run("delayed", 1e-3, s), 2.0 + gaps[s])

    finish(2)
    r = P.power_seeds(Folders(tmp_path), runs_for, 2, cap=6)
    assert not r["done"] and r["seeds"] == 4  # [0.30, 0.10]: the t interval is far wider than half the gap
    finish(4)
    r = P.power_seeds(Folders(tmp_path), runs_for, 2, cap=6)
    from delaylab.stats import t_interval

    ci = t_interval(gaps[:4])
    assert (ci[1] - ci[0]) >= sum(gaps[:4]) / 4 / 2 and r["seeds"] == 6 and not r["done"]
    finish(6)
    r = P.power_seeds(Folders(tmp_path), runs_for, 2, cap=6)
    assert r["done"] and r["seeds"] == 6 and r["resolved"] is (t_interval(gaps)[1] - t_interval(gaps)[0]
                                                               < sum(gaps) / 6 / 2)
    assert P.power_seeds(Folders(tmp_path), runs_for, 2, cap=None)["seeds"] == 2  # not a headline cell: no more seeds


def test_overhead_reruns_longer_until_the_target_is_reached(tmp_path):
    sync = _run("sync", 1e-3, 0)
    delayed = _run("delayed", 1e-3, 0)
    _finish(tmp_path, sync, 2.0, [3.0, 2.5, 2.0])
    _finish(tmp_path, delayed, 2.2, [3.2, 2.6, 2.2])  # misses 2.0
    r = P.overhead_runs(Folders(tmp_path), BASE, sync, delayed, (1.5, 2, 4))
    assert not r["done"] and [x.variant for x in r["runs"]] == ["main", "length-1.5x"]
    longer = r["runs"][1]
    assert longer.base["steps"] == 150 and longer.base["eval_every"] == 15 and longer.cell == delayed.cell
    _finish(tmp_path, longer, 2.1, [3.2, 2.6, 2.3, 2.1])  # still misses
    r = P.overhead_runs(Folders(tmp_path), BASE, sync, delayed, (1.5, 2, 4))
    assert [x.variant for x in r["runs"]] == ["main", "length-1.5x", "length-2x"]
    _finish(tmp_path, r["runs"][2], 1.9, [3.2, 2.6, 2.3, 2.1, 1.9])  # crosses 2.0 between 400 and 500 tokens
    r = P.overhead_runs(Folders(tmp_path), BASE, sync, delayed, (1.5, 2, 4))
    assert r["done"] and r["length"] == 2 and r["overhead"]["overhead"] == pytest.approx(450 / 300)
    # never reached at 4x: no number
    other = _run("delayed", 1e-3, 1)
    s1 = _run("sync", 1e-3, 1)
    _finish(tmp_path, s1, 2.0, [3.0, 2.5, 2.0])
    for variant, f in (("main", 1), ("length-1.5x", 1.5), ("length-2x", 2), ("length-4x", 4)):
        run = other if f == 1 else LLMRun(variant, P.length_base(BASE, f), other.cell, "delayed")
        _finish(tmp_path, run, 2.5, [3.0, 2.5])
    r = P.overhead_runs(Folders(tmp_path), BASE, s1, other, (1.5, 2, 4))
    assert r["done"] and r["overhead"] is None and r["max_length"] == 4


def test_an_lr_dependent_claim_is_undetermined_whatever_its_interval():
    inside = V.score("x", [0.1, 0.2], (0, None), 0.0)
    assert inside["state"] == V.AGREES
    dep = V.score("x", [0.1, 0.2], (0, None), 0.0, lr_dependent=True)
    assert dep["state"] == V.UNDETERMINED and V.why(dep) == "depends on the lr choice: see the lr line"
    assert V.rescore(dep) == dep and V.rescore({**dep, "lr_dependent": False})["state"] == V.AGREES


def test_t_coverage_at_skew_is_exact_under_normality_and_loses_one_side_at_skew_2():
    from delaylab.reproduce.stats import t_coverage_at_skew

    normal = t_coverage_at_skew(0.0, 5, reps=40000)
    se = (0.95 * 0.05 / 40000) ** 0.5
    assert abs(normal["coverage"] - 0.95) < 4 * se  # the t interval is exact for normal draws
    skewed = t_coverage_at_skew(2.0, 5, reps=40000)
    assert 0.86 < skewed["coverage"] < 0.91 and skewed["miss_below"] > 0.09 > 0.01 > skewed["miss_above"]
    mirrored = t_coverage_at_skew(-2.0, 5, reps=40000)
    assert abs(mirrored["miss_above"] - skewed["miss_below"]) < 0.01


def test_skewness_check_null_sd_matches_normal_draws_and_flags_a_skewed_optimizer():
    import numpy as np

    from delaylab.reproduce.stats import skewness_check

    rng = np.random.default_rng(1)

    def rows(opt, draw, cells=40):
        out = []
        for lr in range(cells):
            for s in range(5):
                out.append({"optimizer": opt, "mode": "sync", "momentum": 0.9, "lr": lr, "seed": s, "val_loss": 0.0})
                out.append({"optimizer": opt, "mode": "delayed", "momentum": 0.9, "lr": lr, "seed": s,
                            "val_loss": float(draw())})
        return out

    data = rows("normal", rng.standard_normal) + rows("skewed", lambda: rng.gamma(1.0) - 1.0)
    got = skewness_check(data, ["normal", "skewed"], {"normal": set(range(5)), "skewed": set(range(5))})
    g1 = [c["skew"] for c in got["normal"]["cells"]]
    assert abs(np.std(g1) / got["normal"]["cells"][0]["null_sd"] - 1) < 0.35  # 40 cells: the SD's own error
    normal, skewed = got["normal"], got["skewed"]
    # Gamma(1) - 1 has skewness 2; its raw g1 at 5 seeds reads about 1.1, the bias-corrected size about 2
    assert skewed["mean_skew"] < 1.4 < skewed["estimate"]["size"] and skewed["estimate"]["signed"] > 1.4
    assert normal["estimate"]["size"] < 0.8 < skewed["estimate"]["size"] <= skewed["estimate"]["upper"]
    assert normal["coverage"]["coverage"] > 0.935 > 0.92 > skewed["coverage"]["coverage"]
    assert skewed["coverage"]["miss_below"] > skewed["coverage"]["miss_above"]
