"""The coverage table of docs/intervals.md, the skew estimator behind it, the held-out tuned gaps and the
family-wise line: each checked against a computation written here (plain numpy, scipy's t quantile).

The table's cells are recomputed by a smaller simulation of the same laws written independently
(its own draws, its own interval arithmetic; Fieller's set is checked by the t test it inverts), and
so is the library's method run now, so a wrong quantile or a wrong selection fails here.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import t as student

from delaylab.reproduce import coverage as C
from delaylab.reproduce import stats as S

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "intervals" / "coverage.json"
REPS = 20000


# -- an independent simulation of the same laws --------------------------------------------------------


def skewed(rng, skew, shape):
    """Mean 0, variance 1; a Gamma(4 / skew^2) shifted and scaled, mirrored for a negative skew."""
    if skew == 0:
        return rng.standard_normal(shape)
    k = 4.0 / skew ** 2
    return np.sign(skew) * (rng.gamma(k, 1.0, shape) - k) / np.sqrt(k)


def t_half(x):
    n = x.shape[-1]
    return student.ppf(0.975, n - 1) * x.std(-1, ddof=1) / np.sqrt(n)


def cover_t(n, skew, rng, reps=REPS, **_):
    x = skewed(rng, skew, (reps, n))
    return np.abs(x.mean(-1)) <= t_half(x)


def cover_welch(n, skew, rng, reps=REPS, ratio=3.0, rho=0.0, **_):
    a = skewed(rng, skew, (reps, n))
    b = np.sqrt(ratio) * (rho * a + np.sqrt(1 - rho ** 2) * skewed(rng, skew, (reps, n)))
    va, vb = a.var(-1, ddof=1) / n, b.var(-1, ddof=1) / n
    df = (va + vb) ** 2 / ((va ** 2 + vb ** 2) / (n - 1))
    return np.abs(b.mean(-1) - a.mean(-1)) <= student.ppf(0.975, df) * np.sqrt(va + vb)


def cover_fieller(n, skew, rng, reps=REPS, snr=3.0, ratio=0.4, **_):
    """Fieller's set holds r exactly where the t test of num - r den having mean 0 does not reject."""
    den = snr + skewed(rng, skew, (reps, n))
    d = ratio * den + 0.5 * skewed(rng, skew, (reps, n)) - ratio * den
    return np.abs(d.mean(-1)) <= t_half(d)


def _choose(losses, use):
    """Per rep the lr (axis 1) of least mean over the seeds in ``use`` (a bool per seed)."""
    return losses[:, :, use].mean(-1).argmin(-1)


def cover_tuned(n, skew, rng, reps=5000, held=True, **_):
    """Five lrs; sync's neighbours 1 SD above its optimum, the delayed mode's two best tied and the
    next ones 0.25 SD up; a shared per-seed offset (half the variance) plus noise."""
    k = np.arange(5) - 2.0
    true_s, true_d = k ** 2, 1.0 + 0.25 * ((k + 0.5) ** 2 - 0.25) / 2
    shared = np.sqrt(0.5) * skewed(rng, skew, (reps, 1, n))
    sync = true_s[:, None] + shared + np.sqrt(0.5) * skewed(rng, skew, (reps, 5, n))
    delayed = true_d[:, None] + shared + np.sqrt(0.5) * skewed(rng, skew, (reps, 5, n))
    rows = np.arange(reps)
    if not held:
        ls, ld = _choose(sync, np.ones(n, bool)), _choose(delayed, np.ones(n, bool))
        values = delayed[rows, ld, :] - sync[rows, ls, :]
        truth = true_d[ld] - true_s[ls]
    else:
        values, truth = np.empty((reps, n)), np.zeros(reps)
        for j in range(n):
            others = np.arange(n) != j
            ls, ld = _choose(sync, others), _choose(delayed, others)
            values[:, j] = delayed[rows, ld, j] - sync[rows, ls, j]
            truth += (true_d[ld] - true_s[ls]) / n
    return np.abs(values.mean(-1) - truth) <= t_half(values)


INDEPENDENT = {"t-gap": cover_t, "t-difference": cover_t, "t-overhead": cover_t, "welch": cover_welch,
               "welch-shared": cover_welch, "fieller": cover_fieller, "tuned-in-sample": cover_tuned,
               "tuned-held-out": cover_tuned}


def _close(p_a, reps_a, p_b, reps_b, sigmas=4.0):
    p = (p_a + p_b) / 2
    return abs(p_a - p_b) <= sigmas * math.sqrt(max(p * (1 - p), 1e-4) * (1 / reps_a + 1 / reps_b))


def _row(result, key, label):
    return next(r for r in result["rows"] if r["key"] == key and r["skew_label"] == label)


@pytest.fixture(scope="module")
def committed():
    return json.loads(TABLE.read_text())


# (method, skew level, n): a few cells of the committed table
CELLS = [("t-gap", "measured", 3), ("t-gap", "upper bound", 10), ("welch", "measured", 4),
         ("welch-shared", "measured", 6), ("fieller", "measured", 5), ("fieller", "upper bound", 3),
         ("tuned-in-sample", "measured", 10), ("tuned-held-out", "measured", 8)]


@pytest.mark.parametrize("key,label,n", CELLS)
def test_committed_coverage_cells_match_an_independent_simulation(committed, key, label, n):
    row = _row(committed, key, label)
    cell = row["cells"][str(n)]
    kw = next(m["kwargs"] for m in C.METHODS if m["key"] == key)
    kw = dict(kw, snr=committed["measured"]["snr"])
    got = INDEPENDENT[key](n, row["skew"], np.random.default_rng(7), **kw)
    assert _close(cell["coverage"], cell["reps"], got.mean(), got.size), (key, label, n, cell["coverage"], got.mean())


@pytest.mark.parametrize("key,label,n", CELLS)
def test_the_library_methods_now_match_the_independent_simulation(committed, key, label, n):
    """The library's method run now (not the committed numbers), so a planted error fails here."""
    row = _row(committed, key, label)
    m = next(m for m in C.METHODS if m["key"] == key)
    kw = dict(m["kwargs"], **({"snr": committed["measured"]["snr"]} if m["fn"] is C.fieller else {}))
    mine = m["fn"](n, row["skew"], 5000, np.random.default_rng(11), **kw)
    got = INDEPENDENT[key](n, row["skew"], np.random.default_rng(13), **dict(kw, snr=committed["measured"]["snr"]))
    assert _close(mine["coverage"], 5000, got.mean(), got.size), (key, n, mine["coverage"], got.mean())


def test_the_normal_t_interval_is_exact_and_a_wrong_quantile_is_caught():
    """At skew 0 the t interval covers 95% within Monte-Carlo error; the 90% quantile would not."""
    rng = np.random.default_rng(3)
    c = C.t_mean(4, 0.0, 40000, rng)
    assert abs(c["coverage"] - 0.95) < 4 * c["se"]
    x = skewed(np.random.default_rng(3), 0.0, (40000, 4))
    wrong = np.abs(x.mean(-1)) <= student.ppf(0.95, 3) * x.std(-1, ddof=1) / 2
    assert not _close(c["coverage"], 40000, wrong.mean(), 40000)


def test_docs_table_is_the_rendering_of_the_committed_json(committed):
    page = (ROOT / "docs" / "intervals.md").read_text()
    start, end = C.PAGE_MARKERS
    assert page.split(start)[1].split(end)[0].strip() == C.markdown(committed).strip()
    assert (ROOT / "docs" / "intervals" / "coverage.md").read_text().strip() == C.markdown(committed).strip()


def test_committed_table_is_the_measured_skew_of_the_committed_reports(committed):
    """The skews the table is drawn at are those of docs/reproduce's runs as they are now."""
    now = C.measured(ROOT / "docs" / "reproduce")
    for kind, m in now["skew"].items():
        assert m == pytest.approx(committed["measured"]["skew"][kind]), kind
    assert now["snr"] == pytest.approx(committed["measured"]["snr"])


def test_every_method_reaches_94_percent_at_the_measured_skew_or_is_labelled(committed):
    """holds: least coverage over n at the measured skew (+2 SE) >= 94%. Welch's and the lr shift's
    must; a t or Fieller interval below it is labelled by each report's coverage paragraph (its own
    skew, its own seed counts: read as intervals of that level), and the held-out tuned gap is
    printed without an interval, saying why."""
    from delaylab.reproduce import selection

    verdict = C.holds(committed["rows"])
    assert verdict == committed["holds"]
    assert all(verdict[k]["holds"] for k in ("welch", "welch-shared", "lr-shift")), verdict
    assert {k for k, _, _, _ in C.REPORT_METHODS} == {"t", "fieller", "tuned"}
    cell = {"coverage": 0.921, "se": 0.002, "reps": 10000, "miss_low": 0.06, "miss_high": 0.02}
    block = {"ns": [5], "skew": None, "cells": {"t": {"5": cell}, "fieller": {"5": cell}, "tuned": {"5": cell}},
             "least": 0.921}
    assert "read the intervals of this report as 92% ones" in C.intervals_text(block)
    assert "read the intervals" not in C.intervals_text({**block, "least": 0.95})
    pair = {"held_out": 0.1, "in_sample": 0.2, "optimism": 0.1}
    line = selection.text("optimizers", [{"optimizer": "x", "gap": pair, "tuned": pair}])
    assert "carry no interval" in line and "covers less than 95%" in line


# -- the skew estimator --------------------------------------------------------------------------------


def _cells(rng, skew, count, n):
    return [(n, float(C.sample_skewness(skewed(rng, skew, n)))) for _ in range(count)]


def test_sample_skewness_is_g1_by_hand():
    x = np.array([0.0, 1.0, 5.0, 2.0])
    d = x - x.mean()
    assert C.sample_skewness(x) == pytest.approx((d ** 3).mean() / (d ** 2).mean() ** 1.5, rel=1e-12)


@pytest.mark.parametrize("true", [0.0, 1.0, 2.0])
def test_skewness_recovers_a_known_skew_where_raw_g1_reads_it_low(true):
    rng = np.random.default_rng(5)
    cells = _cells(rng, true, 400, 5)
    est = C.skewness(cells)
    # near 0, E[g1^2] grows with the square of the skew, so a small excess reads as a skew of ~0.5
    assert abs(est["size"] - true) < (0.7 if true == 0 else 0.3), est
    assert est["upper"] >= est["size"]
    if true:
        assert abs(est["signed"] - true) < 0.3 and est["raw_mean"] < 0.75 * true  # raw g1 reads it low


def test_skewness_upper_bound_holds_about_95_percent_of_the_time():
    rng = np.random.default_rng(9)
    hits = [C.skewness(_cells(rng, 1.0, 20, 5))["upper"] >= 1.0 for _ in range(200)]
    assert np.mean(hits) >= 0.88


def test_skewness_needs_cells_of_four_seeds():
    assert C.skewness([(3, 0.5), (3, -0.2)]) is None


# -- the held-out (leave one seed out) tuned gap ------------------------------------------------------


def test_held_out_gaps_by_hand():
    """Two lrs, three seeds; each seed's lrs chosen on the other two, worked out in the comments."""
    sync = {1e-3: {0: 1.0, 1: 2.0, 2: 2.0}, 2e-3: {0: 1.5, 1: 1.0, 2: 1.4}}
    delayed = {1e-3: {0: 3.0, 1: 3.0, 2: 3.0}, 2e-3: {0: 2.5, 1: 3.6, 2: 3.2}}
    got = S.tuned_values(sync, delayed, {0, 1, 2})
    # in sample: sync means 1.667 / 1.3 -> 2e-3; delayed 3.0 / 3.1 -> 1e-3
    assert (got["sync_lr"], got["lr"]) == (2e-3, 1e-3)
    assert got["in_sample"] == pytest.approx([3.0 - 1.5, 3.0 - 1.0, 3.0 - 1.4])
    # seed 0 out: sync {1,2}: 2.0 / 1.2 -> 2e-3; delayed {1,2}: 3.0 / 3.4 -> 1e-3
    # seed 1 out: sync {0,2}: 1.5 / 1.45 -> 2e-3; delayed {0,2}: 3.0 / 2.85 -> 2e-3
    # seed 2 out: sync {0,1}: 1.5 / 1.25 -> 2e-3; delayed {0,1}: 3.0 / 3.05 -> 1e-3
    assert got["held_lrs"] == [[2e-3, 1e-3], [2e-3, 2e-3], [2e-3, 1e-3]]
    assert got["held_out"] == pytest.approx([3.0 - 1.5, 3.6 - 1.0, 3.0 - 1.4])
    fixed = S.tuned_values(sync, delayed, {0, 1, 2}, tune_other=False)  # delayed at sync's lr
    assert fixed["lr"] == 2e-3 and fixed["in_sample"] == pytest.approx([1.0, 2.6, 1.8])


def test_a_seed_outside_the_base_seeds_keeps_the_base_choice_and_a_diverged_lr_is_never_best():
    sync = {1e-3: {0: 1.0, 1: 1.0, 5: 0.0}, 2e-3: {0: 2.0, 1: None}}
    delayed = {1e-3: {0: 2.0, 1: 2.0, 5: 1.0}, 2e-3: {0: 0.5, 1: 0.5}}
    got = S.tuned_values(sync, delayed, {0, 1}, tune_other=False)
    assert got["sync_lr"] == 1e-3 and got["seeds"] == [0, 1, 5]
    assert got["held_seeds"] == [0, 1, 5] and got["held_out"] == pytest.approx([1.0, 1.0, 1.0])
    # seed 1 out: lr 2e-3 has seed 0's 2.0 only, worse; seed 0 out: 2e-3's seed 1 diverged, so 1e-3
    assert got["held_lrs"] == [[1e-3, 1e-3]] * 3


def test_tuned_values_agree_with_the_reports_tuned_gap_on_the_committed_runs():
    from delaylab.reproduce import findings as F
    from delaylab.reproduce import ledger
    from delaylab.reproduce import plan as P

    L = ledger.read(ROOT / "docs" / "reproduce" / "cpu-quick")
    rows = L.records(L.decided["grid"] + L.decided["headline"])
    for opt in L.preset.llm.optimizers:
        base, mom = set(range(P.seeds(L.preset, opt))), L.best[opt]["momentum"]
        sync, delayed = S.by_lr(rows, opt, "sync", mom), S.by_lr(rows, opt, "delayed", mom)
        mine, theirs = S.tuned_values(sync, delayed, base), F.tuned_gap(rows, opt, mom, seeds=base)
        assert (mine["sync_lr"], mine["lr"]) == (theirs["sync_lr"], theirs["lr"])
        assert np.mean(mine["in_sample"]) == pytest.approx(theirs["gap"]["mean"], abs=1e-12)
        assert S.tuned_values(sync, delayed, base, tune_other=False)["sync_lr"] == L.best[opt]["lr"]


# -- a report's family of verdicts --------------------------------------------------------------------


def test_multiplicity_counts_every_scored_state_and_bounds_chance():
    parts = [{"verdicts": [{"state": "agrees"}, {"state": "disagrees"}, {"state": None}],
              "theory_numbers": [{"state": "agrees"}, {"state": "undetermined"}, {"state": None}]},
             {"verdicts": [{"state": "agrees"}]}]
    m = C.multiplicity(parts, {"side": 0.04, "least": 0.92})
    assert (m["scored"], m["agrees"], m["disagrees"]) == (5, 3, 1)
    assert m["false_agrees"] == pytest.approx(5 * 0.04) and m["false_disagrees"] == pytest.approx(5 * 0.08)
    nominal = C.multiplicity(parts, {"side": 0.01, "least": 0.99})  # never below the nominal 2.5% / 5%
    assert nominal["false_agrees"] == pytest.approx(5 * 0.025) and nominal["false_disagrees"] == pytest.approx(0.25)
    assert "at most 0.2 of the agrees and 0.4 of the disagrees" in C.multiplicity_text(m)


def test_cli_help_and_a_bad_reports_folder(tmp_path):
    run = [sys.executable, "-m", "delaylab.reproduce.coverage"]
    assert subprocess.run(run + ["--help"], capture_output=True, text=True).returncode == 0
    bad = subprocess.run(run + ["--out", str(tmp_path), "--reports", str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and bad.stderr.startswith("error:")


def test_the_selection_line_of_cpu_small_recomputed_from_runs_jsonl():
    """Finding 1's held-out gaps, recomputed in plain Python from runs.jsonl: per seed, each lr the
    least mean over the other base seeds (seeds 0-4), the gap read there."""
    from delaylab.reproduce import ledger, selection

    folder = ROOT / "docs" / "reproduce" / "cpu-small"
    runs = [json.loads(x) for x in (folder / "runs.jsonl").read_text().splitlines() if x.strip()]

    report = json.loads((folder / "report.json").read_text())
    momentum = {r["optimizer"]: r["momentum"] for r in report["parts"][0]["rows"]}

    def grid(opt, mode):
        g = {}
        for r in runs:
            if r["kind"] == "gpt" and (r["variant"], r["optimizer"], r["mode"], r["momentum"]) == (
                    "main", opt, mode, momentum[opt]):
                g.setdefault(r["lr"], {})[r["seed"]] = r["val_loss"]
        return g

    def best(g, seeds):
        return min(g, key=lambda lr: sum(g[lr][s] for s in seeds) / len(seeds))

    sel = {r["optimizer"]: r for r in selection.selection(ledger.read(folder), "optimizers")}
    for opt in ("adamw", "soap"):
        sync, delayed = grid(opt, "sync"), grid(opt, "delayed")
        base = [0, 1, 2, 3, 4] if opt == "adamw" else [0, 1, 2]
        held = []  # each mode at its own best lr
        for s in sorted(set(sync[best(sync, base)]) & set(delayed[best(delayed, base)])):
            others = [x for x in base if x != s]
            held.append(delayed[best(delayed, others)][s] - sync[best(sync, others)][s])
        assert sel[opt]["tuned"]["held_out"] == pytest.approx(sum(held) / len(held), abs=1e-12)
        held = []  # both modes at sync's best lr; seeds 5-6 of AdamW's best cell chose nothing
        lr = best(sync, base)
        for s in sorted(set(sync[lr]) & set(delayed[lr])):
            ls = best(sync, [x for x in base if x != s])
            held.append(delayed[ls][s] - sync[ls][s])
        assert sel[opt]["gap"]["held_out"] == pytest.approx(sum(held) / len(held), abs=1e-12)
    assert sel["adamw"]["tuned"]["optimism"] == pytest.approx(0.049, abs=0.0005)  # quoted in docs/intervals.md


def test_gap_cells_pair_each_treatment_with_the_sync_run_of_its_configuration_and_seed():
    """cpu-quick's AdamW headline cell (best sync lr, 10 seeds) is one of the cells, with the per-seed gaps
    written out here; a sync-start run pairs with the plain sync run, not with itself."""
    lines = [json.loads(x) for x in (ROOT / "docs" / "reproduce" / "cpu-quick" / "runs.jsonl").read_text().splitlines()]
    cells = C.gap_cells(lines)
    gpt = [x for x in lines if x["kind"] == "gpt" and x["variant"] == "main" and x["optimizer"] == "adamw"
           and x["lr"] == 1e-3]
    sync = {x["seed"]: x["val_loss"] for x in gpt if x["mode"] == "sync"}
    delayed = {x["seed"]: x["val_loss"] for x in gpt if x["mode"] == "delayed"}
    want = {s: delayed[s] - sync[s] for s in sorted(set(sync) & set(delayed))}
    assert len(want) == 10
    mine = [c for c in cells if json.loads(c["config"][1]) == "adamw" and json.loads(c["config"][2]) == 1e-3
            and json.loads(c["treatment"][0]) == "delayed" and json.loads(c["config"][6]) == gpt[0]["steps"]]
    assert len(mine) == 1 and mine[0]["gaps"] == pytest.approx(want)
    starts = [c for c in cells if json.loads(c["treatment"][5])]
    assert starts and all(c["gaps"] for c in starts)


def _span(result, key, label):
    cells = _row(result, key, label)["cells"].values()
    return f"{100 * min(c['coverage'] for c in cells):.1f}-{100 * max(c['coverage'] for c in cells):.1f}%"


def test_the_reading_of_the_table_quotes_the_committed_json(committed):
    """The numbers the prose of docs/intervals.md reads off the table, each at its place."""
    text = (ROOT / "docs" / "intervals.md").read_text().split("## Reading it")[1].split("## What the reports")[0]
    text = " ".join(text.split())
    gap, per = committed["measured"]["skew"]["gap"], committed["measured"]["gap_by_report"]
    assert f"{gap['size']:.2f} pooled over {gap['cells']} cells of the five reports (one-sided upper bound " \
           f"{gap['upper']:.2f}), {per['cpu-small']['size']:.2f} in cpu-small's" in text
    assert f"cover {_span(committed, 't-gap', 'measured')} and {_span(committed, 'fieller', 'measured')}" in text
    t_up, f_up = (_row(committed, k, "upper bound")["cells"].values() for k in ("t-gap", "fieller"))
    both = [c["coverage"] for c in [*t_up, *f_up]]
    assert f"at the upper bound {100 * min(both):.1f}-{100 * max(both):.1f}%" in text
    assert f"({committed['measured']['skew']['gap difference']['size']:.2f}: " \
           f"{_span(committed, 't-difference', 'measured')})" in text
    assert f"covers {_span(committed, 'welch-shared', 'measured')}" in text
    assert f"covers {_span(committed, 'tuned-in-sample', 'measured')}" in text
    assert f"covers only {_span(committed, 'tuned-held-out', 'measured')}" in text


def test_the_skew_paragraph_of_reproduction_md_is_the_reports_skew_check():
    from delaylab.reproduce import findings as F
    from delaylab.reproduce import ledger
    from delaylab.reproduce import plan as P

    text = " ".join((ROOT / "docs" / "reproduction.md").read_text().split("**Skew.**")[1].split("\n\n")[0].split())
    check = {}
    for name in ("cpu-small", "cpu-quick"):
        L = ledger.read(ROOT / "docs" / "reproduce" / name)
        opts = list(L.preset.llm.optimizers)
        check[name] = S.skewness_check(F.verdict_rows(L), opts, {o: set(range(P.seeds(L.preset, o))) for o in opts})

    def est(name, opt, key):
        return f"{check[name][opt]['estimate'][key]:.2f}"

    def cov(name, opt, key="coverage"):
        return f"{100 * check[name][opt][key]['coverage']:.1f}%"

    a, m = check["cpu-small"]["adamw"], check["cpu-small"]["muon"]
    assert (f"AdamW cells: skewness {est('cpu-small', 'adamw', 'size')} over {a['estimate']['cells']} cells (one-sided "
            f"95% upper bound {est('cpu-small', 'adamw', 'upper')}), where the 95% t interval covers "
            f"{cov('cpu-small', 'adamw')} at {a['coverage']['n']} seeds") in text
    assert (f"Muon's: {est('cpu-small', 'muon', 'size')} over {m['estimate']['cells']} (bound "
            f"{est('cpu-small', 'muon', 'upper')}), {cov('cpu-small', 'muon')}") in text
    q = check["cpu-quick"]
    assert (f"cpu-quick's cells ({q['adamw']['estimate']['cells']} and {q['muon']['estimate']['cells']}) measure "
            f"{est('cpu-quick', 'adamw', 'size')} (bounds {est('cpu-quick', 'adamw', 'upper')} and "
            f"{est('cpu-quick', 'muon', 'upper')}): {cov('cpu-quick', 'adamw')} at 5 seeds, "
            f"{cov('cpu-quick', 'adamw', 'coverage_upper')} and {cov('cpu-quick', 'muon', 'coverage_upper')} at the "
            "bounds") in text
    assert est("cpu-quick", "adamw", "size") == est("cpu-quick", "muon", "size")
    assert cov("cpu-quick", "adamw") == cov("cpu-quick", "muon")


def test_the_intervals_paragraph_of_reproduction_md(committed):
    text = " ".join((ROOT / "docs" / "reproduction.md").read_text().split("## Intervals and their coverage")[1]
                    .split("## The protocol")[0].split())
    lines = [json.loads(x) for x in (ROOT / "docs" / "reproduce" / "cpu-small" / "runs.jsonl").read_text().splitlines()]
    block = C.report_intervals(lines)
    both = [c["coverage"] for k in ("t", "fieller") for c in block["cells"][k].values()]
    gap = committed["measured"]["skew"]["gap"]
    assert (f"({gap['size']:.2f} pooled over the five reports, {block['skew']['size']:.2f} in cpu-small's own cells), "
            f"and there a t or Fieller interval covers {_span(committed, 't-gap', 'measured')} (pooled) and "
            f"{100 * min(both):.1f}-{100 * max(both):.1f}% (cpu-small, at its seed counts)") in text
