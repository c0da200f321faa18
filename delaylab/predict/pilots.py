"""Dense pilots: the first 10% of every run in the cells, rerun with its train loss logged at every update.

The committed runs validate 10 to 13 times each, so a 10% pilot cut from them holds one
validation of the gap (docs/predict.md counts it). A pilot that a user runs can log more: the
train loss of every update costs nothing (it is computed anyway), and the sync and delayed runs
of one seed draw the same batches from the same initial weights, so their paired train-loss gap
along the pilot's window is a denoised view of the pilot's gap and of where it is heading.

This module reruns the first :data:`FRACTION` of every run the cells hold (sync and delayed,
every seed) with the run's own configuration and schedule and ``log_every = 1``, stops it there,
and keeps per run: ``train`` (the mean train loss over each of :data:`BINS` equal bins of the
pilot's updates, at the bin's last update: what a run logging every ``stop / BINS`` updates
records) and ``val`` (the rerun's validations, which must equal the committed run's at the
same updates: tests/predict/test_pilots.py checks every one, bit for bit in every report but
cpu-tokens-2, whose committed runs these reruns match only to a relative 2.7e-2; :func:`agreement`
counts it for docs/predict.md).

Which configuration: a report's runs are listed by its plan on its Ledger
(:func:`delaylab.reproduce.plan.plan`); docs/beyond/moe-cpu's by the sweep commands of
docs/beyond.md (:data:`MOE_BASE`); the fresh grids' by :mod:`delaylab.predict.fresh`.

    python -m delaylab.predict.pilots --out DIR [--reports cpu-delays,...] [--jobs 2]

writes ``docs/predict/pilots/<report>.jsonl`` (resumable: a finished pilot is read, not rerun).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from pathlib import Path

from delaylab.predict.pilot import FRACTION

BINS = 20
PILOTS = "pilots"  # docs/predict/pilots/<report>.jsonl
DONE = "pilot.json"
FRESH = ("fresh", "fresh-2")  # the fresh grids: docs/predict/<name>/runs.jsonl
# docs/beyond.md's sweep commands for the dense / MoE runs: $COMMON and the three models.
MOE_BASE = dict(preset="small", batch_size=16, block_size=64, steps=200, eval_every=20, threads=1)
MOE_MODELS = {"dense_h256": dict(mlp_hidden=256), "moe_e4k1_h256": dict(mlp_hidden=256, moe_experts=4, moe_top_k=1),
              "dense_h1024": dict(mlp_hidden=1024)}


def stop_of(steps: int, fraction: float = FRACTION) -> int:
    """The pilot's last update: the cells' cut (:func:`delaylab.predict.cells.pilot_updates`), at least 1."""
    from delaylab.predict.cells import pilot_updates

    return max(1, pilot_updates(steps, fraction))


def binned(train: list, stop: int, bins: int = BINS) -> list[list]:
    """``[[last update of the bin, mean train loss over its updates], ...]`` of per-update losses
    ``[[update, loss], ...]`` over updates 1..stop cut into ``bins`` equal bins (fewer where
    ``stop < bins``: an empty bin is left out)."""
    at = dict((int(u), float(v)) for u, v in train)
    out = []
    for j in range(bins):
        lo, hi = math.floor(j * stop / bins), math.floor((j + 1) * stop / bins)
        vals = [at[u] for u in range(lo + 1, hi + 1) if u in at]
        if vals:
            out.append([hi, sum(vals) / len(vals)])
    return out


def run_one(report: str, folder: str, base: dict, cell: dict, out: str) -> dict:
    """Rerun one run's pilot under ``out/report/folder`` (read where finished); its record."""
    from delaylab.llm.config import Config
    from delaylab.llm.run.trainer import train
    from delaylab.llm.sweep import Cell, read_metrics

    d = Path(out) / report / folder
    if (d / DONE).is_file():
        return json.loads((d / DONE).read_text())
    stop = stop_of(base["steps"])
    cfg = Cell(**cell).config(Config.from_dict({**base, "log_every": 1}))
    if (d / "run").exists():
        shutil.rmtree(d / "run")  # an interrupted pilot starts again: it is short
    t0 = time.perf_counter()
    train(cfg, str(d / "run"), stop_at=stop)
    lines = read_metrics(d / "run")
    rec = {"report": report, "folder": folder, "stop": stop, "seconds": round(time.perf_counter() - t0, 2),
           "train": binned([[m["step"], m["train_loss"]] for m in lines if m.get("train_loss") is not None], stop),
           "val": [[m["step"], m["val_loss"]] for m in lines if m.get("val_loss") is not None]}
    (d / DONE).write_text(json.dumps(rec))
    shutil.rmtree(d / "run")
    return rec


def _cell(run) -> dict:
    c = run.cell
    return dict(optimizer=c.optimizer, mode=c.mode, lr=c.lr, momentum=c.momentum, seed=c.seed)


def folder_of(root, report: str) -> Path:
    """Where a report's runs.jsonl lies under the docs folder ``root``."""
    from delaylab.predict import cells as C

    return Path(root) / ("beyond" if report in C.BEYOND else "predict" if report in FRESH else "reproduce") / report


def jobs(report: str, root="docs") -> list[tuple]:
    """``(report, folder, base, cell)`` for every run the cells of ``report`` hold."""
    from delaylab.predict import cells as C
    from delaylab.reproduce import ledger as L
    from delaylab.reproduce import plan as P

    folder = folder_of(root, report)
    used = _used(report, C.report_runs(folder))
    if report in C.BEYOND:
        return [(report, x["folder"], {**MOE_BASE, **MOE_MODELS[x["model"]]},
                 dict(optimizer=x["optimizer"], mode=x["sweep_mode"], lr=x["lr"], momentum=x["momentum"],
                      seed=x["seed"])) for x in L.runs(folder) if x["folder"] in used]
    if report in FRESH:
        from delaylab.predict import fresh

        return [(report, r.folder, r.base, _cell(r)) for r in fresh.grid_runs(report) if r.folder in used]
    book = L.read(folder)
    return [(report, r.folder, r.base, _cell(r)) for r in P.plan(book.preset, book)
            if hasattr(r, "cell") and r.folder in used]


def _used(report: str, runs: list[dict]) -> set[str]:
    from delaylab.predict import cells as C

    return {r["folder"] for c in C.cells_of(report, runs) for r in c["sync"] + c["delayed"]}


def run(out, reports, root="docs", workers: int = 2, write=None) -> dict[str, int]:
    """Every pilot of ``reports`` under ``out`` (two at a time), then ``write/<report>.jsonl``."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from delaylab._progress import Progress

    todo = [j for rep in reports for j in jobs(rep, root)]
    recs = []
    bar = Progress("pilots", len(todo), unit="pilot")
    try:
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
            for f in as_completed([ex.submit(run_one, *j, str(out)) for j in todo]):
                recs.append(f.result())
                bar.advance()
    finally:
        bar.close()
    write = Path(write or Path(root) / "predict" / PILOTS)
    write.mkdir(parents=True, exist_ok=True)
    counts = {}
    for rep in reports:
        mine = sorted((r for r in recs if r["report"] == rep), key=lambda r: r["folder"])
        (write / f"{rep}.jsonl").write_text("".join(json.dumps({k: r[k] for k in ("folder", "stop", "train", "val")})
                                                    + "\n" for r in mine))
        counts[rep] = len(mine)
    return counts


def read(root, report: str) -> dict[str, dict]:
    """``{folder: {"stop", "train", "val"}}`` of a report's dense pilots ({} where none were run)."""
    path = Path(root) / "predict" / PILOTS / f"{report}.jsonl"
    if not path.is_file():
        return {}
    return {x["folder"]: x for x in map(json.loads, path.read_text().splitlines()) if x}


def agreement(root, reports) -> dict[str, dict]:
    """Per report, how the dense pilots' validations compare with the committed runs' at the same
    updates: ``compared``, ``equal`` (bit for bit) and ``max_rel`` (the largest relative difference)."""
    from delaylab.predict import cells as C

    out = {}
    for rep in reports:
        pilots = read(root, rep)
        if not pilots:
            continue
        n = equal = 0
        worst = 0.0
        for x in C.report_runs(folder_of(root, rep)):
            p = pilots.get(x["folder"])
            if p is None:
                continue
            committed = dict(map(tuple, C.val_curve(x)))
            for u, v in p["val"]:
                if u in committed:
                    n, equal = n + 1, equal + (v == committed[u])
                    worst = max(worst, abs(v - committed[u]) / abs(committed[u]))
        out[rep] = {"compared": n, "equal": equal, "max_rel": worst}
    return out


def main(argv=None) -> int:
    from delaylab.predict import cells as C

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="scratch folder for the pilots (rerun to resume)")
    ap.add_argument("--reports", default=",".join(C.REPORTS + C.BEYOND), help="comma-separated report names")
    ap.add_argument("--root", default="docs")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    counts = run(args.out, [r for r in args.reports.split(",") if r], args.root, args.jobs)
    print(", ".join(f"{k}: {v} pilots" for k, v in counts.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
