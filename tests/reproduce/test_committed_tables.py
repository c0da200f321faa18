"""The tables and headline numbers of docs/nqm.md (the NQM score), docs/beyond.md (dense vs MoE) and
docs/toy_results.md (the toy rate suites), recomputed from their committed data with plain Python
(not delaylab's scoring code) and compared at their place in the page (tests/reproduce/anchors.py):
a table cell by its row and column, a number in prose in its paragraph.

- docs/nqm/score.json: every cell's measured gap and each model's predicted end gap and curve;
  the scores (inside the 95% interval, right sign, within a factor 2), the counts and medians are
  written out again here;
- docs/nqm/spectrum_*.json: the spectra table;
- docs/beyond/moe-cpu/runs.jsonl: the 88 runs of the MoE comparison (its table, and the differences
  of gaps in their claims' sentences; the router table's statistics are not committed data);
- docs/toy_results/*.json: the toy rate suites (``delaylab toy rates --suite ... --json``).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import anchors as A  # noqa: E402
import recompute as R  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _page(doc: str) -> str:
    return (ROOT / doc).read_text()


def _cell(doc: str, section: str, row, column: str) -> str:
    return A.region(_page(doc), {"section": section, "row": row, "column": column})


def _says(doc: str, section: str, phrase: str, *expected: str) -> None:
    """The paragraph of ``section`` holding ``phrase`` quotes each of ``expected``."""
    text = A.region(_page(doc), {"section": section, "paragraph": phrase})
    for e in expected:
        assert A.quotes(text, e), f"{doc}, {section!r} / {phrase!r}: no {e!r} in: {text}"


# -- the NQM score (docs/nqm.md) --------------------------------------------------------------------

NQM = ROOT / "docs" / "nqm"
ADAM_TYPE = ("adamw", "soap", "adan", "mars")
VIEWS = ("primary", "diag-eos", "mc")


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def nqm_score(pred, measured) -> dict:
    """A prediction's three scores against its measured gap, written out again: inside the 95%
    interval, the same sign, predicted / measured in [1/2, 2]."""
    if pred is None:
        return {"inside": False, "sign": False, "factor2": False}
    gap, ci = measured["gap"], measured["ci"]
    ratio = pred / gap if gap else math.inf
    return {"inside": ci is not None and ci[0] <= pred <= ci[1], "sign": _sign(pred) == _sign(gap),
            "factor2": 0.5 <= ratio <= 2}


def model_of(cell: dict, view: str) -> str:
    """The model a view reads: 'primary' is diag where a cell has one (Adam-type), else mc; 'diag-eos'
    falls back to mc the same way; 'mc' is mc."""
    want = {"primary": "diag"}.get(view, view)
    return want if want in cell["predicted"] else "mc"


def _plain(cell) -> bool:
    return cell["mode"] in ("delayed", "2bw")


def counts(rows: list[tuple[dict, dict]]) -> dict:
    """The summary of (cell, prediction) pairs: the three counts, the diverged ones, the median of
    predicted / measured over the plain-delay cells, and along the run (every logged eval of a
    cell that did not diverge) the right-sign and factor-2 points."""
    ratios = [x["end_gap"] / c["measured"]["gap"] for c, x in rows
              if x["end_gap"] is not None and c["measured"]["gap"] and _plain(c)]
    along = [(g, q) for c, x in rows if x["end_gap"] is not None for _, g, q in x["along"] if q is not None and g]
    out = {"cells": len(rows), "diverged": sum(x["end_gap"] is None for _, x in rows),
           "median_ratio_plain_delay": statistics.median(ratios) if ratios else None,
           "along": {"points": len(along), "sign": sum(_sign(g) == _sign(q) for g, q in along),
                     "factor2": sum(0.5 <= q / g <= 2 for g, q in along)}}
    for k in ("inside", "sign", "factor2"):
        out[k] = sum(nqm_score(x["end_gap"], c["measured"])[k] for c, x in rows)
    return out


@pytest.fixture(scope="module")
def score():
    return json.loads((NQM / "score.json").read_text())


def view(score, name, optimizer=None):
    return [(c, c["predicted"][model_of(c, name)]) for c in score["cells"]
            if optimizer is None or c["optimizer"] == optimizer]


def test_every_nqm_cell_is_scored_by_the_rule(score):
    cells = score["cells"]
    assert len(cells) == score["summary"]["cells"] > 0
    for c in cells:
        m = c["measured"]
        assert m["seeds"] >= 2 and m["ci"][0] <= m["gap"] <= m["ci"][1]
        if m["curve"]:  # the measured curve ends at the measured gap
            assert m["curve"][-1][1] == pytest.approx(m["gap"], abs=1e-12)
        assert set(c["predicted"]) == ({"diag", "diag-eos", "mc"} if c["optimizer"] in ADAM_TYPE else {"mc"})
        for model, x in c["predicted"].items():
            assert x["score"] == nqm_score(x["end_gap"], m), (c["report"], c["variant"], c["lr"], c["mode"], model)
            if x["along"] and x["end_gap"] is not None:  # the predicted curve ends at the end gap
                assert x["along"][-1][2] == pytest.approx(x["end_gap"], abs=1e-12)


def test_the_stored_nqm_summary_is_the_cells_counted_again(score):
    s = score["summary"]
    for name in VIEWS:  # equal to the last bit: the same sums and medians, computed again
        assert s[name] == {**counts(view(score, name)), "by_optimizer": s[name]["by_optimizer"]}, name
        for opt, stored in s[name]["by_optimizer"].items():
            got = counts(view(score, name, opt))
            del got["along"]
            assert stored == got, (name, opt)


def _med(v, fmt):
    return "n/a" if v is None else format(v, fmt)


def test_the_nqm_tables_are_the_recount(score):
    doc, sec = "docs/nqm.md", "The score"
    labels = {"primary": "primary (diag for Adam-type, mc for Muon/Lion)", "diag-eos": "diag-eos (mc for Muon/Lion)",
              "mc": "mc (all)"}
    for name in VIEWS:
        c = counts(view(score, name))
        want = {"cells": str(c["cells"]), "inside the 95% interval": str(c["inside"]), "right sign": str(c["sign"]),
                "within a factor 2": str(c["factor2"]), "diverged": str(c["diverged"]),
                "median predicted / measured (plain delay)": _med(c["median_ratio_plain_delay"], ".3g"),
                "along the run: right sign, within x2 (points)":
                    f"{c['along']['sign']}, {c['along']['factor2']} ({c['along']['points']})"}
        for column, value in want.items():
            assert _cell(doc, sec, labels[name], column) == value, (name, column)
    optimizers = sorted({c["optimizer"] for c in score["cells"]})
    for opt in optimizers:
        rows = [c for c in score["cells"] if c["optimizer"] == opt]
        assert _cell(doc, sec, opt, "cells") == str(len(rows))
        for column in ("diag", "diag-eos", "mc"):
            if column == "diag" and "diag" not in rows[0]["predicted"]:
                assert _cell(doc, sec, opt, column) == "(mc)"
                continue
            c = counts([(r, r["predicted"][model_of(r, column)]) for r in rows])
            assert _cell(doc, sec, opt, column) == (f"{c['inside']} / {c['sign']} / {c['factor2']} / {c['diverged']}; "
                                                     f"{_med(c['median_ratio_plain_delay'], '.2g')}"), (opt, column)
    n = len(score["cells"])
    _says(doc, sec, "covers every delayed cell", f"{n} cells, {score['summary']['seconds']:.0f} s")


def _muon_settings(score) -> dict:
    """Muon's median predicted / measured (mc, plain delay) per (model preset, lr, delay)."""
    groups: dict = {}
    for c, x in view(score, "mc", "muon"):
        if x["end_gap"] is not None and c["measured"]["gap"] and _plain(c):
            key = (c["preset"], c["lr"], str(c["delay_dist"] or c["delay"]))
            groups.setdefault(key, []).append(x["end_gap"] / c["measured"]["gap"])
    return {k: statistics.median(v) for k, v in sorted(groups.items())}


def test_the_nqm_prose_quotes_the_recount(score):
    doc = "docs/nqm.md"
    cells = score["cells"]
    mu = counts(view(score, "mc", "muon"))
    _says(doc, "Predicting the delay gap", "The result, stated first",
          f"the sign in {mu['sign']} of {mu['cells']} cells and is within a factor 2 in {mu['factor2']}")
    # AdamW where the model is stable: predicted / measured of order 1e-4 to 1e-3, either sign
    adamw = {m: counts(view(score, m, "adamw")) for m in ("diag-eos", "mc")}
    meds = [adamw[m]["median_ratio_plain_delay"] for m in ("diag-eos", "mc")]
    assert sorted(math.floor(math.log10(abs(v))) for v in meds) == [-4, -3]
    preds = [x["end_gap"] for m in ("diag-eos", "mc") for _, x in view(score, m, "adamw")]
    assert min(preds) < 0 < max(preds)
    sec = "What the model gets right"
    plain = [c["measured"]["gap"] for c in cells if c["optimizer"] == "adamw" and _plain(c)]
    zero = [c for c in cells if c["optimizer"] in ADAM_TYPE and c["measured"]["ci"][0] <= 0 <= c["measured"]["ci"][1]]
    inside = {m: [c for c, x in view(score, m) if c["optimizer"] in ADAM_TYPE and x["score"]["inside"]]
              for m in ("diag-eos", "mc")}
    assert all(c in zero for m in inside for c in inside[m])  # "and no other"
    assert len(inside["mc"]) == len(zero)  # "all ... for mc"
    _says(doc, sec, "**With the adaptation put in by hand", f"is {meds[0]:.1g} (diag-eos) and {meds[1]:.2g} (mc)",
          f"measured gaps there of {min(plain):+.2f} to {max(plain):+.2f}",
          f"sign is right in {adamw['diag-eos']['sign']} and {adamw['mc']['sign']} of {adamw['mc']['cells']} cells",
          f"all {len(zero)} such Adam-type cells for mc, {len(inside['diag-eos'])} of them for diag-eos")
    listed = "; ".join(f"{c['report']} {c['variant']} lr {c['lr']:g} {c['mode']}: measured {c['measured']['gap']:+.3f}, "
                       f"predicted {x['end_gap']:+.3f}" for c, x in view(score, "mc", "muon") if x["score"]["factor2"])
    settings = _muon_settings(score)
    _says(doc, sec, "**Muon is where the model says something.**",
          f"Of {mu['cells']} Muon cells the Monte Carlo model has the right sign in {mu['sign']}, is inside the "
          f"interval in {mu['inside']} and within a factor 2 in {mu['factor2']} ({listed})",
          f"over the plain-delay cells is {mu['median_ratio_plain_delay']:.2g}",
          "; ".join(f"{p} lr {lr:g} delay {d}: {v:.2g}" for (p, lr, d), v in settings.items()) + ".")
    # the decay: the end gap smaller in size than the largest along the run, per cell with a curve
    closes = {}
    for m in ("mc", "diag-eos"):
        curves = [(x["end_gap"], [abs(q) for _, _, q in x["along"] if q is not None]) for _, x in view(score, m)
                  if x["end_gap"] is not None]
        curves = [(e, q) for e, q in curves if q]
        closes[m] = (sum(abs(e) < max(q) for e, q in curves), len(curves))
    _says(doc, sec, "**The lr decay.**",
          f"In {closes['mc'][0]} of the {closes['mc'][1]} cells", f"(all {closes['diag-eos'][1]} for diag-eos)")
    assert closes["diag-eos"][0] == closes["diag-eos"][1]
    s = settings
    _says(doc, sec, "**tau 8, PipeDream.**",
          f"{s['small', 0.04, '1']:.2g} at tau 1, {s['small', 0.04, '2']:.2g} at tau 2, {s['small', 0.04, '4']:.2g} at "
          f"tau 4 and {s['small', 0.04, '8']:.2g} at tau 8",
          f"{s['small', 0.02, '8']:.2g} at lr 0.02 and {s['small', 0.08, '8']:.2g} at lr 0.08",
          f"({s['small', 0.04, '[3, 2, 1, 0]']:.2g} at P = 4, {s['small', 0.04, '[7, 6, 5, 4, 3, 2, 1, 0]']:.2g} at "
          f"P = 8) and the uniform 0-4 delay ({s['small', 0.04, 'uniform:0-4']:.2g})",
          f"from {s['tiny', 0.01, '1']:.1g} at lr 0.01 to {s['tiny', 0.08, '1']:.2g} at 0.08 and "
          f"{s['tiny', 0.16, '1']:.2g} at 0.16")
    mc = counts(view(score, "mc"))
    f2 = {c["optimizer"] for c, x in view(score, "mc") if x["score"]["factor2"]}
    assert f2 == {"muon"}
    _says(doc, sec, "The measured result is",
          f"{mc['sign']} of {mc['cells']} cells with the right sign and {mc['factor2']} within a factor 2 (mc), "
          f"all {mu['factor2']} of them Muon")


def test_the_nqm_spectra_table_is_the_spectrum_files():
    doc, sec = "docs/nqm.md", "Fitting to a run"
    rows = {("tiny", "adamw"): "tiny AdamW lr 0.002 (135k params)", ("tiny", "muon"): "tiny Muon lr 0.04",
            ("small", "adamw"): "small AdamW lr 5e-4 (861k params)", ("small", "muon"): "small Muon lr 0.04"}
    for (size, opt), label in rows.items():
        sp = json.loads((NQM / f"spectrum_{size}_{opt}.json").read_text())
        last = sp["checkpoints"][-1]
        assert _cell(doc, sec, label, "time").startswith(f"{sp['seconds']:.0f} s")
        assert _cell(doc, sec, label, "last checkpoint: val loss, top eigenvalue of H, noise trace") == \
            f"{last['val_loss']:.3f}, {max(last['hessian']['nodes']):.3g}, {last['noise_trace']:.3g}"
        top = _cell(doc, sec, label, "AdamW: top of D^1/2 H D^1/2")
        assert top == (f"{max(last['precond']['nodes']):.4g}" if opt == "adamw" else "-")
        if opt == "adamw":
            assert max(last["precond"]["nodes"]) == pytest.approx(float(top), rel=1e-3)
            assert sp["config"]["lr"] == float(label.split("lr ")[1].split()[0])


# -- dense vs MoE (docs/beyond.md) -------------------------------------------------------------------

MOE = ROOT / "docs" / "beyond" / "moe-cpu" / "runs.jsonl"
MODELS = {"dense_h256": "dense-active", "moe_e4k1_h256": "MoE", "dense_h1024": "dense-total"}
NAMES = {"adamw": "AdamW", "muon": "Muon"}


def moe_rows() -> dict:
    """Per (model, optimizer): the lr tuned on seed 0's sync scan, the mean loss of each mode and the
    per-seed gaps and EF gaps at that lr."""
    runs = R.load(MOE)
    out = {}
    for model in MODELS:
        for opt in NAMES:
            mine = [r for r in runs if r["model"] == model and r["optimizer"] == opt]
            scan = {r["lr"]: r["val_loss"] for r in mine if r["sweep_mode"] == "sync" and r["seed"] == 0}
            lr = min(scan, key=scan.get)
            loss = {m: {r["seed"]: r["val_loss"] for r in mine if r["sweep_mode"] == m and r["lr"] == lr}
                    for m in ("sync", "delayed", "ef")}
            assert sorted(loss["sync"]) == sorted(loss["delayed"]) == sorted(loss["ef"]) == [0, 1, 2, 3]
            assert {r["lr"] for r in mine if r["sweep_mode"] != "sync"} == {lr}  # the cells run at the tuned lr
            out[model, opt] = {"lr": lr, "scan": scan, "loss": loss, "params": (mine[0]["params"], mine[0]["active_params"]),
                               "gap": {s: loss["delayed"][s] - loss["sync"][s] for s in loss["sync"]},
                               "ef_gap": {s: loss["ef"][s] - loss["sync"][s] for s in loss["sync"]}}
    return out


def _gap(m, ci) -> str:
    return f"{m:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]"


def test_the_dense_vs_moe_tables_are_the_runs_recomputed():
    doc, sec = "docs/beyond.md", "Dense vs mixture of experts"
    rows = moe_rows()
    assert sum(1 for _ in R.load(MOE)) == 88
    for (model, opt), r in rows.items():
        total, active = r["params"]
        label = {"model (total / active params)": f"{MODELS[model]} ({total / 1e6:.2f}M / {active / 1e6:.2f}M)",
                 "optimizer": NAMES[opt]}
        cell = lambda column, label=label: _cell(doc, sec, label, column)  # noqa: E731
        assert cell("lr") == f"{r['lr']:g}"
        for mode, column in (("sync", "sync"), ("delayed", "delayed"), ("ef", "delayed + EF")):
            assert cell(column) == f"{R.mean(list(r['loss'][mode].values())):.3f}", (model, opt, mode)
        assert cell("gap [95% t]") == _gap(*R.t_interval(list(r["gap"].values())))
        share, ci = R.recovered(r["ef_gap"], r["gap"])
        assert cell("EF recovers [95% Fieller]") == f"{share:.0f}% " + (
            "[undetermined]" if ci is None else f"[{ci[0]:.0f}, {ci[1]:.0f}]"), (model, opt)
    for opt in NAMES:  # the differences of gaps, each stated in its claim's sentence
        for other in ("dense_h256", "dense_h1024"):
            moe, dense = (list(rows[m, opt]["gap"].values()) for m in ("moe_e4k1_h256", other))
            d, ci = R.welch(dense, moe)
            said = A.region(_page(doc), {"claim": f"moe-cpu.{opt}.moe-vs-{MODELS[other]}"})
            for value in (_gap(d, ci), f"MoE {R.mean(moe):+.3f} against {R.mean(dense):+.3f}, 4 and 4 seeds"):
                assert A.quotes(said, value), (opt, other, value, said)
    scan = rows["dense_h256", "adamw"]["scan"]
    lrs = (0.002, 0.004, 0.008)
    _says(doc, sec, "Protocol:", "dense-active: " + " / ".join(f"{scan[lr]:.2f}" for lr in lrs) + " at "
          + " / ".join(f"{lr:g}" for lr in lrs))


# -- the toy rate suites (docs/toy_results.md) ---------------------------------------------------------

TOY = ROOT / "docs" / "toy_results"
SUITES = {"rates_tau1.json": "Toy rate suite", "rates_tau48.json": "Longer delays"}


def _mode(r: dict) -> str:
    return "sync" if r["delay"] == 0 else f"tau={r['delay']}" + ("" if r["correction"] == "none" else "+EF")


def suite(name: str) -> list[dict]:
    """A suite's settings, each with its ratios, slopes and verdict computed again from its points."""
    out = []
    for r in json.loads((TOY / name).read_text())["results"]:
        pts = r["points"]
        ratios = [p["measured"] / p["bound"] for p in pts]
        assert ratios == pytest.approx([p["ratio"] for p in pts], rel=1e-12)  # the stored ratio is this one
        slope = R.loglog_slope([p["T"] for p in pts], [p["measured"] for p in pts])
        bound_slope = R.loglog_slope([p["T"] for p in pts], [p["bound"] for p in pts])
        assert (slope, bound_slope) == pytest.approx((r["slope"], r["bound_slope"]), rel=1e-9)
        assert all(p["ci"][0] <= p["measured"] <= p["ci"][1] for p in pts) and r["seeds"] == 16
        assert R.rate_holds(r) == r["holds"]
        out.append({**r, "mode": _mode(r), "ratios": dict(zip([p["T"] for p in pts], ratios)), "slope": slope,
                    "bound_slope": bound_slope})
    return out


@pytest.mark.parametrize("name", list(SUITES))
def test_the_toy_tables_are_their_suites_recomputed(name):
    """Every cell of the table: measured / bound at each T, the two slopes and whether it holds."""
    doc, sec = "docs/toy_results.md", SUITES[name]
    rows = suite(name)
    table = [b for b in A.blocks(A.section(_page(doc), sec)) if b.rows]
    assert len(table) == 1 and len(table[0].rows) == len(rows) + 1  # one row per setting, no other
    for r in rows:
        label = {"problem": r["problem"], "method": r["method"], "mode": r["mode"]}
        for t, ratio in r["ratios"].items():
            assert _cell(doc, sec, label, f"ratio T={t}") == f"{ratio:.2f}", (label, t)
        assert _cell(doc, sec, label, "slope") == f"{r['slope']:.3f}", label
        assert _cell(doc, sec, label, "bound slope") == f"{r['bound_slope']:.3f}", label
        assert _cell(doc, sec, label, "holds") == ("yes" if r["holds"] else "no"), label



def test_the_longer_delays_prose_is_its_suite_recomputed():
    doc, sec = "docs/toy_results.md", "Longer delays"
    rows, first = suite("rates_tau48.json"), suite("rates_tau1.json")
    delayed = [r for r in rows if r["delay"] > 0]
    sync = [{k: v for k, v in r.items() if k != "seconds"} for r in rows if r["delay"] == 0]
    assert sync == [{k: v for k, v in r.items() if k != "seconds"} for r in first if r["delay"] == 0]  # bit for bit

    def span(xs, fmt):
        return f"{min(xs):{fmt}}-{max(xs):{fmt}}"

    plain = [v for r in delayed if r["correction"] == "none" for v in r["ratios"].values()]
    ef = [v for r in delayed if r["correction"] == "ef" for v in r["ratios"].values()]
    slopes = [r["slope"] for r in delayed]
    _says(doc, sec, "The same check at tau = 4 and 8",
          f"all {len(rows)} settings hold ({len(delayed)} delayed ones plus sync",
          f"measured / bound is {span(plain, '.2f')} without EF and {span(ef, '.2f')} with EF",
          f"every fitted slope is between {max(slopes):.2f} and {min(slopes):.2f}")
    assert all(r["holds"] for r in rows)
    # EF's delay term against the plain one: 3 (tau + 1) delta_bar / 4 at the same (eta, beta)
    by = {(r["problem"], r["method"], r["delay"], r["correction"]): r for r in rows}
    for (problem, method, tau, corr), r in by.items():
        if corr == "ef":
            plain_run = by[problem, method, tau, "none"]
            for p, q in zip(r["points"], plain_run["points"]):
                assert p["eta"] == q["eta"] and p["beta"] == q["beta"]
                assert p["terms"]["delay"] / q["terms"]["delay"] == pytest.approx(0.75 * (tau + 1) * p["delta_bar"],
                                                                                   rel=1e-9)
    most = [(by[pb, "lmo-sign", 8, "ef"], by[pb, "lmo-sign", 8, "none"]) for pb in ("logdet", "matrix-sensing")]
    drift = [p["delta_bar"] for e, _ in most for p in e["points"]]
    term = [p["terms"]["delay"] / q["terms"]["delay"] for e, n in most for p, q in zip(e["points"], n["points"])]
    whole = [p["bound"] / q["bound"] for e, n in most for p, q in zip(e["points"], n["points"])]
    _says(doc, sec, "With EF the bound, taken at the gradient points",
          f"`delta_bar` {span(drift, '.2f')} at tau = 8) EF's delay term is {span(term, '.1f')} times the plain one, "
          f"its whole bound up to {max(whole):.1f} times, and the ratios fall to "
          f"{span([v for e, _ in most for v in e['ratios'].values()], '.2f')}")
    # the other sign rows at tau = 8 with EF: their drift is smaller, so are the bound's terms
    others = [p["delta_bar"] for pb in ("cauchy", "rastrigin", "cauchy-regression")
              for p in by[pb, "lmo-sign", 8, "ef"]["points"]]
    assert max(others) < min(drift)

# -- each test fails on a planted error -------------------------------------------------------------

_TESTS = {"nqm tables": lambda: test_the_nqm_tables_are_the_recount(_score()),
          "nqm prose": lambda: test_the_nqm_prose_quotes_the_recount(_score()),
          "nqm spectra": test_the_nqm_spectra_table_is_the_spectrum_files,
          "moe": test_the_dense_vs_moe_tables_are_the_runs_recomputed,
          "toy": lambda: test_the_toy_tables_are_their_suites_recomputed("rates_tau1.json"),
          "toy tau 4, 8": lambda: test_the_toy_tables_are_their_suites_recomputed("rates_tau48.json"),
          "toy prose": test_the_longer_delays_prose_is_its_suite_recomputed}


def _score():
    return json.loads((NQM / "score.json").read_text())


@pytest.mark.parametrize("test,doc,says,planted", [
    ("nqm tables", "docs/nqm.md", "| 193 | 31 | 71 | 12 | 99 |", "| 193 | 31 | 70 | 12 | 99 |"),
    ("nqm tables", "docs/nqm.md", "| 24 / 65 / 12 / 0; 0.41 | 24 / 65 / 12 / 0; 0.41 |",
     "| 24 / 65 / 12 / 0; 0.41 | 24 / 65 / 12 / 0; 0.42 |"),
    ("nqm prose", "docs/nqm.md", "gets the sign in 65 of 85 cells", "gets the sign in 66 of 85 cells"),
    ("nqm prose", "docs/nqm.md", "tiny lr 0.16 delay 1: 36.", "tiny lr 0.16 delay 1: 37."),
    ("nqm prose", "docs/nqm.md", "measured +0.447, predicted +0.713", "measured +0.447, predicted +0.731"),
    ("nqm spectra", "docs/nqm.md", "| 2.586, 48.6, 10.9 |", "| 2.586, 48.6, 10.8 |"),
    ("moe", "docs/beyond.md", "| +0.218 [+0.181, +0.256] |", "| +0.218 [+0.181, +0.265] |"),
    ("moe", "docs/beyond.md", "dense-total dense model's: +0.081 [+0.039, +0.122]",
     "dense-total dense model's: +0.081 [+0.039, +0.123]"),
    ("toy", "docs/toy_results.md", "| logdet | lmo-sign | tau=1+EF | 0.25 |", "| logdet | lmo-sign | tau=1+EF | 0.26 |"),
    ("toy tau 4, 8", "docs/toy_results.md", "| 0.05 | 0.08 | 0.12 | 0.15 | -0.244 |",
     "| 0.05 | 0.08 | 0.12 | 0.15 | -0.245 |"),
    ("toy tau 4, 8", "docs/toy_results.md", "| 0.64 | 0.19 | 0.15 | 0.14 | -0.374 | -0.029 | yes |",
     "| 0.64 | 0.19 | 0.15 | 0.14 | -0.374 | -0.029 | no |"),
    ("toy prose", "docs/toy_results.md", "0.05-0.64 with EF", "0.05-0.46 with EF"),
    ("toy prose", "docs/toy_results.md", "12.9-13.5 times", "8.6 times"),
])
def test_a_planted_error_in_a_page_fails(test, doc, says, planted, monkeypatch):
    real = _page(doc)
    assert real.count(says) == 1
    _TESTS[test]()  # passes on the page as committed
    monkeypatch.setattr(sys.modules[__name__], "_page", lambda d: real.replace(says, planted) if d == doc else
                        (ROOT / d).read_text())
    with pytest.raises(AssertionError):
        _TESTS[test]()


def test_a_planted_error_in_the_data_fails(tmp_path, monkeypatch):
    """The page is fine, the data is not: a stored NQM score that breaks the rule, an MoE run's loss."""
    score = _score()
    cell = next(c for c in score["cells"] if c["optimizer"] == "muon" and c["predicted"]["mc"]["score"]["factor2"])
    cell["predicted"]["mc"]["score"]["factor2"] = False
    with pytest.raises(AssertionError):
        test_every_nqm_cell_is_scored_by_the_rule(score)
    runs = R.load(MOE)
    hit = next(r for r in runs if r["model"] == "moe_e4k1_h256" and r["optimizer"] == "muon" and r["sweep_mode"] == "ef")
    hit["val_loss"] += 0.01
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    monkeypatch.setattr(sys.modules[__name__], "MOE", tmp_path / "runs.jsonl")
    with pytest.raises(AssertionError, match="moe_e4k1_h256"):
        test_the_dense_vs_moe_tables_are_the_runs_recomputed()
