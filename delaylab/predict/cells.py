"""The cells every gap predictor is scored on, read from the committed reports.

A *cell* is one delayed setting of one report (optimizer, lr, delay, correction, sync phases,
run length, model) with the sync runs of the same settings and seeds. Its measured gap is
delayed minus sync final val loss paired by seed, with the 95% Student-t interval of
:mod:`delaylab.stats`; its gap curve is the mean paired gap at every validation both runs of
every seed logged, by update.

The runs come from each report's ``runs.jsonl`` through :mod:`delaylab.reproduce.ledger`
(``docs/reproduce/<name>/``, and ``docs/beyond/moe-cpu/`` whose folder holds a runs.jsonl
without a report.json). A cell keeps its runs (``sync``, ``delayed``: per seed the final loss
and the val curve by update); the views a predictor may see of a held-out cell are
:func:`sync_view` (no delayed run) and :func:`pilot_view` (every run cut at a fraction of its
updates), so no predictor can read what it must not.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from delaylab import stats
from delaylab.errors import MissingFile

REPORTS = ("cpu-small", "cpu-quick", "cpu-delays", "cpu-tokens", "cpu-tokens-2")  # docs/reproduce/<name>
BEYOND = ("moe-cpu",)  # docs/beyond/<name>: a runs.jsonl of `delaylab llm sweep` runs
# What makes two runs the same training apart from the delay: a sync run pairs with a delayed
# run of the same values and seed (model: the MoE study's model names; lr_schedule: cosine where absent).
SETTINGS = ("preset", "model", "optimizer", "lr", "momentum", "steps", "batch_size", "block_size", "n_layer",
            "warmup", "lr_schedule")
# What else tells one delayed cell from another of the same settings.
DELAYED = ("variant", "mode", "correction", "delay", "delay_dist", "sync_start", "sync_cooldown", "dc_lambda")
CORRECTIONS = {"ef,predict": "ef+predict"}  # the runs' spelling -> the cells'
CONFIG = ("report", "variant", "mode", "optimizer", "correction", "delay", "delay_dist", "mean_delay", "sync_start",
          "sync_cooldown", "dc_lambda", "lr", "momentum", "steps", "batch_size", "block_size", "preset", "model",
          "n_layer", "warmup", "lr_schedule", "params", "tokens")


def mean_delay(delay, delay_dist: str | None = None) -> float:
    """The delay as one number: a per-stage list (PipeDream) by its mean, a random delay by the
    mean of its distribution (:class:`delaylab.optim.queue.DelayDistribution`)."""
    if delay_dist:
        from delaylab.optim.queue import DelayDistribution

        return float(DelayDistribution.parse(delay_dist).mean)
    if isinstance(delay, (list, tuple)):
        return sum(delay) / len(delay)
    return float(delay)


def report_runs(folder) -> list[dict]:
    """The GPT runs of a report folder, through the Ledger (:func:`delaylab.reproduce.ledger.read`
    where a report.json is there, :func:`delaylab.reproduce.ledger.runs` otherwise)."""
    from delaylab.reproduce import ledger

    folder = Path(folder)
    if not (folder / ledger.RUNS).is_file():
        raise MissingFile(f"{folder}: no {ledger.RUNS}")
    lines = ledger.read(folder).lines if (folder / "report.json").is_file() else ledger.runs(folder)
    return [x for x in lines if x.get("kind") == "gpt"]


def _key(run: dict, fields) -> tuple:
    return tuple(json.dumps(run.get(k)) if isinstance(run.get(k), list) else run.get(k) for k in fields)


def val_curve(run: dict) -> list[list]:
    """A runs.jsonl line's validations as [update, loss] (the line keeps them by tokens)."""
    tokens, steps = run["tokens"], run["steps"]
    return [[round(t / tokens * steps), v] for t, v in run.get("val_curve") or []]


def pilot_updates(steps: int, fraction: float) -> int:
    """The last update a pilot of ``fraction`` of ``steps`` updates holds."""
    return math.floor(fraction * steps + 1e-9)


def _run(run: dict, pilots: dict) -> dict:
    """A run as a cell keeps it: seed, folder, final val loss, the val curve as [update, loss] and,
    where its dense pilot was run (:mod:`delaylab.predict.pilots`), the pilot's binned train loss
    ``train`` as [update, loss] (None where not)."""
    dense = pilots.get(run.get("folder"))
    return {"seed": run["seed"], "folder": run.get("folder"), "val_loss": run["val_loss"], "curve": val_curve(run),
            "train": None if dense is None else dense["train"]}


def cells_of(report: str, runs: list[dict], pilots: dict | None = None) -> list[dict]:
    """Every delayed cell of one report's runs that has sync runs of the same settings and seeds;
    ``pilots``: the report's dense pilots by folder (:func:`delaylab.predict.pilots.read`)."""
    pilots = pilots or {}
    sync: dict = {}
    for r in runs:
        if r["mode"] == "sync" and not r.get("sync_start") and not r.get("sync_cooldown"):
            sync.setdefault(_key(r, SETTINGS), {}).setdefault(r["seed"], r)
    groups: dict = {}
    for r in runs:
        if r["mode"] != "sync":
            groups.setdefault(_key(r, SETTINGS + DELAYED), {}).setdefault(r["seed"], r)
    out = []
    for by_seed in groups.values():
        first = next(iter(by_seed.values()))
        base = sync.get(_key(first, SETTINGS), {})
        seeds = sorted(set(base) & set(by_seed))
        if not seeds:
            continue
        cell = {k: first.get(k) for k in CONFIG if k != "report"}
        cell["correction"] = CORRECTIONS.get(first["correction"], first["correction"])
        cell.update(report=report, variant=first.get("variant") or first.get("model"),
                    lr_schedule=first.get("lr_schedule") or "cosine", sync_start=first.get("sync_start") or 0,
                    sync_cooldown=first.get("sync_cooldown") or 0,
                    mean_delay=mean_delay(first["delay"], first.get("delay_dist")),
                    sync=[_run(base[s], pilots) for s in seeds], delayed=[_run(by_seed[s], pilots) for s in seeds])
        cell["measured"] = measured(cell)
        out.append(cell)
    return out


def measured(cell: dict) -> dict:
    """The cell's end gap (delayed - sync, paired by seed) with its 95% t interval, the per-seed
    gaps, and the mean gap at every update where every seed's two runs both logged a validation."""
    seeds = [r["seed"] for r in cell["sync"]]
    sync = {r["seed"]: r["val_loss"] for r in cell["sync"]}
    delayed = {r["seed"]: r["val_loss"] for r in cell["delayed"]}
    _, gaps = stats.paired(sync, delayed)
    s = stats.sample(gaps)
    return {"gap": s["mean"], "ci": s["ci"], "seeds": s["n"], "per_seed": dict(zip(seeds, gaps)),
            "curve": gap_curve(cell["sync"], cell["delayed"])}


def gap_curve(sync: list[dict], delayed: list[dict]) -> list[list]:
    """``[[update, mean gap], ...]``: delayed - sync paired by seed (the lists are in the same seed
    order), at each update where every seed's two runs both logged a validation."""
    along: dict = {}
    for a, b in zip(sync, delayed):
        at = dict((u, v) for u, v in a["curve"])
        for u, v in b["curve"]:
            if u in at:
                along.setdefault(u, []).append(v - at[u])
    return [[u, sum(g) / len(g)] for u, g in sorted(along.items()) if len(g) == len(sync)]


def load(root="docs", reports=REPORTS, beyond=BEYOND, extra=()) -> list[dict]:
    """Every cell of the committed reports under ``root`` (``extra``: more report folders, by path)."""
    root = Path(root)
    out = []
    folders = [(name, root / "reproduce" / name) for name in reports] + [(name, root / "beyond" / name)
                                                                         for name in beyond]
    folders += [(Path(f).name, Path(f)) for f in extra]
    from delaylab.predict.pilots import read

    for name, folder in folders:
        out.extend(cells_of(name, report_runs(folder), read(root, name)))
    return [c for c in out if c["measured"]["gap"] is not None]


def cell_id(cell: dict) -> str:
    """A readable name, unique within the cells: report, variant, optimizer, lr, momentum, mode,
    correction, delay."""
    delay = cell["delay_dist"] or cell["delay"]
    mom = "" if cell["momentum"] is None else f"/m{cell['momentum']:g}"
    return (f"{cell['report']}/{cell['variant']}/{cell['optimizer']}/lr{cell['lr']:g}{mom}/{cell['mode']}/"
            f"{cell['correction']}/d{delay}")


# -- what a predictor may see of a held-out cell --------------------------------------------------------


def config(cell: dict) -> dict:
    """The cell's settings alone: what a user states before running anything."""
    return {k: cell[k] for k in CONFIG}


def sync_view(cell: dict) -> dict:
    """The held-out cell as a sync-only predictor sees it: its settings and its sync runs whole;
    no delayed run, no measured gap."""
    return {**config(cell), "sync": [dict(r, curve=list(r["curve"])) for r in cell["sync"]]}


def pilot_view(cell: dict, fraction: float) -> dict:
    """The held-out cell as a pilot sees it: its settings (the schedule to the end is known) and every
    run, sync and delayed, cut after ``fraction`` of the updates: the validations and the dense
    pilot's train losses up to there, no final loss."""
    last = pilot_updates(cell["steps"], fraction)

    def cut(r):
        train = r.get("train")
        return {"seed": r["seed"], "curve": [[u, v] for u, v in r["curve"] if u <= last],
                "train": None if train is None else [[u, v] for u, v in train if u <= last]}

    return {**config(cell), "pilot_updates": last, "sync": [cut(r) for r in cell["sync"]],
            "delayed": [cut(r) for r in cell["delayed"]]}


def pilot_curve(view: dict) -> list[list]:
    """The gap curve (:func:`gap_curve`) a pilot view holds."""
    return gap_curve(view["sync"], view["delayed"])
