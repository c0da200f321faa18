"""The NQM's predicted delay gap against every delayed cell of three committed reports.

``python -m delaylab.predict.nqm_score --out docs/nqm`` reads docs/reproduce/{cpu-small,
cpu-tokens,cpu-delays}/runs.jsonl and the spectrum files in docs/nqm/ (``delaylab llm spectrum``
on four committed-style runs: tiny and small GPT, AdamW and Muon, sync), and for each cell that
is delayed (any delay, any correction) and has sync runs of the same seeds and settings
(:mod:`delaylab.predict.cells`, which also measures its gap):

* measured: the end gap, delayed - sync val loss paired by seed, mean and 95% Student-t
  interval; and the gap along the run at each logged eval;
* predicted: :func:`delaylab.theory.nqm.predict_gap` with the cell's optimizer, lr, momentum,
  steps, batch, schedule, delay (per stage, random) and correction, by up to three models:
  ``diag`` (AdamW & co. exact, fixed diagonal preconditioner), ``diag-eos`` (the same with
  each curve's curvature capped at its own stability limit), ``mc`` (Monte Carlo of the real
  update: AdamW, Muon on a d_model x d_model matrix, sign descent for Lion);
* scored: inside the interval, the right sign, within a factor 2 (same sign, ratio in [1/2, 2];
  :func:`delaylab.predict.metrics.per_cell`).

Writes score.json (every cell), table.md and predicted_vs_measured.png under --out. The scoring
harness (:mod:`delaylab.predict.harness`) reads score.json for its NQM baseline and the calibrated
NQM candidate.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from delaylab._io import dumps, write_json

REPORTS = ("cpu-small", "cpu-tokens", "cpu-delays")
CORRECTION = {"none": "none", "ef": "ef", "predict": "predict", "ef+predict": "ef+predict"}
# A cell's fields in score.json (besides measured and predicted), and its measured gap's.
FIELDS = ("report", "variant", "mode", "correction", "delay", "delay_dist", "sync_start", "sync_cooldown",
          "dc_lambda", "preset", "optimizer", "lr", "momentum", "steps", "batch_size", "block_size", "n_layer",
          "warmup")
MEASURED = ("seeds", "gap", "ci", "curve")


def cells(reports_dir: Path) -> list[dict]:
    """Delayed cells with their paired sync runs (same report, settings and seeds) of REPORTS
    under ``reports_dir`` (:func:`delaylab.predict.cells.cells_of`)."""
    from delaylab.predict.cells import cells_of, report_runs

    return [c for report in REPORTS for c in cells_of(report, report_runs(Path(reports_dir) / report))]


def _delay(cell):
    if cell["delay_dist"]:
        lo, hi = (int(t) for t in cell["delay_dist"].split(":", 1)[1].split("-"))
        return {t: 1.0 / (hi - lo + 1) for t in range(lo, hi + 1)}
    return cell["delay"]


def spectrum_for(cell: dict, spectra: dict) -> dict:
    family = "muon" if cell["optimizer"] == "muon" else "adamw"
    return spectra[(cell["preset"], family)]


def models_for(optimizer: str) -> list[str]:
    if optimizer == "muon":
        return ["mc"]
    if optimizer == "lion":
        return ["mc"]
    return ["diag", "diag-eos", "mc"]


def predict(cell: dict, spectrum: dict, model: str) -> dict:
    from delaylab.theory import nqm

    note = None
    correction = CORRECTION.get(cell["correction"])
    if correction is None:  # DC-ASGD: no NQM model of it; predicted as the plain delayed run
        correction, note = "none", f"{cell['correction']} not modelled: predicted as plain delay"
    kind = {"diag": "exact", "diag-eos": "exact", "mc": {"muon": "muon", "lion": "sign"}.get(cell["optimizer"], "adamw")}
    steps = cell["steps"]
    runs = {"muon": 2, "sign": 200, "adamw": 400}.get(kind[model], 0)  # muon: 2 runs of a d x d matrix (cost)
    r = nqm.predict_gap(spectrum, cell["optimizer"], cell["lr"], steps, cell["batch_size"], delay=_delay(cell),
                        correction=correction, momentum=cell["momentum"], warmup=cell["warmup"], model=kind[model],
                        runs=max(runs, 2), eos=model == "diag-eos", sync_start=cell["sync_start"],
                        sync_cooldown=cell["sync_cooldown"])
    return {"end_gap": r["end_gap"], "se": float(r["se"][-1]), "diverged": r["diverged"], "gap": r["gap"],
            "note": note, "sync_end": float(r["sync"][-1]) if np.isfinite(r["sync"][-1]) else None}


def score(pred: float | None, meas: dict) -> dict:
    from delaylab.predict.metrics import per_cell

    s = per_cell(pred, meas)
    return {"inside": s["inside"], "sign": s["sign"], "factor2": s["within_x2"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reports", default="docs/reproduce", help="folder of the committed reports")
    ap.add_argument("--out", default="docs/nqm", help="where the spectra are and the score goes")
    ap.add_argument("--limit", type=int, help="only the first N cells (a quick look)")
    ap.add_argument("--resummarize", action="store_true", help="recount, table and figure from --out/score.json")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.resummarize:
        old = json.loads((out / "score.json").read_text())
        results, summary = old["cells"], summarize(old["cells"])
        summary["seconds"] = old["summary"]["seconds"]
        write_json(out / "score.json", {"summary": summary, "cells": results})
        (out / "table.md").write_text(table(results, summary))
        figure(results, out / "predicted_vs_measured.png")
        print(dumps(summary, indent=1))
        return 0
    spectra = {(p, f): json.loads((out / f"spectrum_{p}_{f}.json").read_text())
               for p in ("tiny", "small") for f in ("adamw", "muon")}
    t0 = time.perf_counter()
    results = []
    todo = cells(Path(args.reports))[: args.limit]
    for i, cell in enumerate(todo):
        meas = {k: cell["measured"][k] for k in MEASURED}
        row = {k: cell[k] for k in FIELDS}
        row["measured"] = meas
        row["predicted"] = {}
        for model in models_for(cell["optimizer"]):
            p = predict(cell, spectrum_for(cell, spectra), model)
            along = [[s, g, float(p["gap"][s]) if np.isfinite(p["gap"][s]) else None] for s, g in meas["curve"]]
            row["predicted"][model] = {**{k: p[k] for k in ("end_gap", "se", "diverged", "note", "sync_end")},
                                       "score": score(p["end_gap"], meas), "along": along}
        results.append(row)
        print(f"[{i + 1}/{len(todo)}] {cell['report']} {cell['variant']} {cell['optimizer']} lr {cell['lr']} "
              f"{cell['mode']}: measured {meas['gap']:+.3f}, predicted "
              + ", ".join(f"{m} {_f(v['end_gap'])}" for m, v in row["predicted"].items()), flush=True)
    summary = summarize(results)
    summary["seconds"] = time.perf_counter() - t0
    write_json(out / "score.json", {"summary": summary, "cells": results})
    (out / "table.md").write_text(table(results, summary))
    figure(results, out / "predicted_vs_measured.png")
    print(dumps(summary, indent=1))
    return 0


def _f(v, fmt="+.3g"):
    return "diverged" if v is None else format(v, fmt)


def summarize(results: list[dict]) -> dict:
    """The three counts per model family: 'primary' = diag for Adam-type, mc for Muon and Lion."""
    out = {"cells": len(results)}
    views = {"primary": {"diag": True, "mc_nonadam": True}, "diag-eos": {}, "mc": {}}
    for view in views:
        rows = []
        for r in results:
            p = r["predicted"]
            m = ("diag" if "diag" in p else "mc") if view == "primary" else (view if view in p else "mc")
            rows.append((r, p[m]))
        n = len(rows)
        counts = {k: sum(x["score"][k] for _, x in rows) for k in ("inside", "sign", "factor2")}
        div = sum(x["end_gap"] is None for _, x in rows)
        def ratios(keep=lambda r: True):  # predicted / measured, plain delay (no correction)
            return [x["end_gap"] / r["measured"]["gap"] for r, x in rows if x["end_gap"] is not None
                    and r["measured"]["gap"] and r["mode"] in ("delayed", "2bw") and keep(r)]

        def median(v):
            return float(np.median(v)) if v else None

        out[view] = {"cells": n, **counts, "diverged": div,
                     "median_ratio_plain_delay": median(ratios()),
                     "by_optimizer": {o: {k: sum(x["score"][k] for r, x in rows if r["optimizer"] == o)
                                          for k in ("inside", "sign", "factor2")} | {
                         "cells": sum(r["optimizer"] == o for r, _ in rows),
                         "median_ratio_plain_delay": median(ratios(lambda r, o=o: r["optimizer"] == o)),
                         "diverged": sum(x["end_gap"] is None for r, x in rows if r["optimizer"] == o)}
                         for o in sorted({r["optimizer"] for r, _ in rows})}}
        along = [(g, q) for r, x in rows if x["end_gap"] is not None  # a diverged curve: no gap along it either
                 for _, g, q in x["along"] if q is not None and g]
        out[view]["along"] = {"points": len(along), "sign": sum(np.sign(g) == np.sign(q) for g, q in along),
                              "factor2": sum(0.5 <= q / g <= 2 for g, q in along)}
    return out


def table(results: list[dict], summary: dict) -> str:
    lines = ["| report | variant | optimizer | lr | mode | delay | seeds | measured gap (95% t) | diag | diag-eos | mc |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        m = r["measured"]
        ci = "n/a" if m["ci"] is None else f"[{m['ci'][0]:+.3f}, {m['ci'][1]:+.3f}]"
        cols = []
        for model in ("diag", "diag-eos", "mc"):
            p = r["predicted"].get(model)
            if p is None:
                cols.append("")
                continue
            s = p["score"]
            mark = ("I" if s["inside"] else "") + ("S" if s["sign"] else "") + ("2" if s["factor2"] else "")
            cols.append(f"{_f(p['end_gap'])}{' ' + mark if mark else ''}" + (" *" if p["note"] else ""))
        delay = r["delay_dist"] or r["delay"]
        lines.append(f"| {r['report']} | {r['variant']} | {r['optimizer']} | {r['lr']:g} | {r['mode']} | {delay} | "
                     f"{m['seeds']} | {m['gap']:+.3f} {ci} | " + " | ".join(cols) + " |")
    lines.append("")
    lines.append("I: inside the measured 95% interval; S: right sign; 2: within a factor 2; * DC-ASGD, not modelled "
                 "(predicted as the plain delay); diverged: the model's expected loss grew 100x above its start.")
    return "\n".join(lines) + "\n"


def figure(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 5), sharex=True, sharey=True)
    colors = {"adamw": "C0", "muon": "C1", "lion": "C2", "soap": "C3", "adan": "C4", "mars": "C5"}
    lim = 1e-4
    for ax, model in zip(axes, ("diag", "diag-eos", "mc")):
        for r in results:
            p = r["predicted"].get(model if model in r["predicted"] else "mc")
            if model != "mc" and model not in r["predicted"]:
                continue
            m = r["measured"]
            y = p["end_gap"]
            marker = "x" if y is None else "o"
            y = 1.0 if y is None else y
            err = None if m["ci"] is None else [[m["gap"] - m["ci"][0]], [m["ci"][1] - m["gap"]]]
            ax.errorbar(m["gap"], y, xerr=err, fmt=marker, color=colors.get(r["optimizer"], "k"), ms=4, alpha=0.6,
                        elinewidth=0.5)
        t = np.geomspace(lim, 2, 50)
        for sgn in (1, -1):
            ax.plot(sgn * t, sgn * t, "k-", lw=0.7)
            ax.fill_between(sgn * t, sgn * t / 2, sgn * t * 2, color="k", alpha=0.08)
        ax.set_xscale("symlog", linthresh=lim)
        ax.set_yscale("symlog", linthresh=lim)
        ax.axhline(0, color="k", lw=0.3)
        ax.axvline(0, color="k", lw=0.3)
        ax.set_xlabel("measured gap (val loss, delayed - sync; 95% t)")
        ax.set_title({"diag": "diagonal (exact), Adam-type only", "diag-eos": "diagonal + EoS cap, Adam-type only",
                      "mc": "Monte Carlo of the real update"}[model])
    axes[0].set_ylabel("NQM predicted gap (x at 1: diverged)")
    for o, c in colors.items():
        axes[2].plot([], [], "o", color=c, label=o)
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
