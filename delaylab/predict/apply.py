"""The named predictors on a user's run folders (``delaylab llm train`` output): ``predict gap`` and
``predict pilot``.

A run folder holds config.json, metrics.jsonl (the val loss at each validation, the train loss
at each line) and, once
finished, summary.json. :func:`run_view` turns one into what a predictor sees of a cell; the
fitted models are the ones ``delaylab predict score`` saved (:data:`delaylab.predict.publish.FITTED`),
fitted on every committed cell, and each answer quotes the held-out score that backs it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from delaylab.errors import ConfigError, MissingFile
from delaylab.predict import cells as C

# What must agree between a sync pilot and a delayed one (the delay and corrector aside).
SAME = ("optimizer", "lr", "momentum", "steps", "batch_size", "block_size", "preset", "n_layer", "warmup",
        "lr_schedule", "seed")
CORRECTIONS = ("none", "ef", "predict", "ef+predict", "dc-asgd", "dc-asgd-a")


def _params(cfg) -> int:
    from delaylab.llm.data import load_dataset
    from delaylab.llm.model import GPT

    d = cfg.data
    vocab = 256 if d.tokenizer == "byte" else load_dataset(d.data, d.tokenizer, d.vocab_size).vocab_size
    return sum(x.numel() for x in GPT(cfg.model_config(vocab)).parameters())


def read_run(folder) -> dict:
    """A run folder as a cell's run and settings: ``{"settings": {...}, "run": {"seed", "val_loss",
    "curve"}, "finished": bool}``. One-line errors for a folder that is not a run or has no val curve."""
    from delaylab.llm.config import Config
    from delaylab.llm.run.folder import require_folder
    from delaylab.llm.sweep import read_metrics

    folder = Path(folder)
    if not folder.is_dir():
        raise MissingFile(f"{folder}: no such run folder")
    cfg = Config.from_dict(require_folder(folder))
    lines = read_metrics(folder)
    curve = [[m["step"], float(m["val_loss"])] for m in lines
             if m.get("val_loss") is not None and math.isfinite(m["val_loss"])]
    if not curve:
        raise ConfigError(f"{folder}: no validation in metrics.jsonl (a val curve is needed: run with --eval-every)")
    summary_path = folder / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    finished = summary.get("status") == "finished"
    correction = cfg.delay.correction.replace(",", "+")
    settings = {"optimizer": cfg.optim.optimizer, "lr": cfg.resolved_lr(), "momentum": cfg.optim.momentum,
                "steps": cfg.run.steps, "batch_size": cfg.data.batch_size, "block_size": cfg.model.block_size,
                "preset": cfg.model.preset, "model": None, "n_layer": cfg.model.n_layer,
                "warmup": cfg.lr_schedule.warmup, "lr_schedule": cfg.lr_schedule.lr_schedule, "seed": cfg.run.seed,
                "delay": list(cfg.delay.delay) if isinstance(cfg.delay.delay, (list, tuple)) else cfg.delay.delay,
                "delay_dist": cfg.delay.delay_dist, "correction": correction,
                "sync_start": cfg.delay.sync_start, "sync_cooldown": cfg.delay.sync_cooldown,
                "params": summary.get("params") or _params(cfg)}
    settings["tokens"] = settings["steps"] * settings["batch_size"] * (cfg.model.block_size or 0)
    val_loss = curve[-1][1] if finished and curve[-1][0] == cfg.run.steps else None
    # the train loss lines (each the mean since the line before): the dense pilot's series
    train = [[m["step"], float(m["train_loss"])] for m in lines if m.get("train_loss") is not None]
    return {"settings": settings, "run": {"seed": cfg.run.seed, "val_loss": val_loss, "curve": curve, "train": train},
            "finished": finished, "folder": str(folder)}


def _delay(text) -> tuple:
    """``2`` or ``3,2,1,0`` (per stage): the delay and its mean."""
    try:
        vals = [int(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise ConfigError(f"--delay: expected an integer or a comma-separated list of them, got {text!r}") from None
    if not vals or min(vals) < 0 or max(vals) == 0:
        raise ConfigError(f"--delay: needs a delay of 1 or more (per stage: at least one), got {text!r}")
    return (vals[0] if len(vals) == 1 else vals), sum(vals) / len(vals)


def _view(settings: dict, delay, mean: float, correction: str) -> dict:
    return {**{k: settings[k] for k in C.CONFIG if k in settings}, "report": "user", "variant": "user",
            "mode": "delayed", "delay": delay, "delay_dist": None, "mean_delay": mean, "correction": correction,
            "dc_lambda": None}


def _backing(entry: dict) -> dict:
    h = entry["held_out"]
    return {"within_x2": h["within_x2"], "cells": h["cells"], "share_within_x2": h["within_x2"] / h["cells"],
            "spearman": h["spearman"], "fold": "leave one report out"}


def gap(sync_dir, delay="1", correction: str = "none", fitted=None) -> dict:
    """The sync-only predictor's end gap for running the sync run in ``sync_dir`` with ``delay``."""
    from delaylab.predict import publish
    from delaylab.predict.regression import Ridge

    if correction not in CORRECTIONS:
        raise ConfigError(f"--correction: choose from {', '.join(CORRECTIONS)}, got {correction!r}")
    d, mean = _delay(delay)
    r = read_run(sync_dir)
    s = r["settings"]
    if s["delay"] not in (0, None) or s["delay_dist"] or s["correction"] != "none":
        raise ConfigError(f"{sync_dir}: not a sync run (delay {s['delay']}, correction {s['correction']})")
    if not r["finished"]:
        raise ConfigError(f"{sync_dir}: the sync run has not finished (the predictor reads its whole val curve)")
    models = publish.load_fitted(fitted or publish.FITTED)
    entry = models["sync_only"]
    p = publish.by_name(entry["name"])
    view = {**_view(s, d, mean, correction), "sync": [r["run"]]}
    out = p.predict(Ridge.from_dict(entry["model"]), view)
    return {"predictor": entry["name"], "sync": str(sync_dir), "delay": d, "mean_delay": mean,
            "correction": correction, "gap": out["gap"], "interval": out["interval"], "held_out": _backing(entry)}


def pilot(sync_dir, delayed_dir, steps: int, fitted=None) -> dict:
    """The pilot predictor's end gap from a sync and a delayed pilot of an ``steps``-update run."""
    from delaylab.predict import publish
    from delaylab.predict.regression import Ridge

    models = publish.load_fitted(fitted or publish.FITTED)
    entry = models["pilot"]
    s, d = read_run(sync_dir), read_run(delayed_dir)
    for name, r in (("--sync", s), ("--delayed", d)):
        if r["run"]["curve"][-1][0] > steps:
            raise ConfigError(f"{name} {r['folder']}: the pilot is longer than the run (it validated at update "
                              f"{r['run']['curve'][-1][0]}, --steps {steps})")
        if r["settings"]["steps"] != steps:
            raise ConfigError(f"{name} {r['folder']}: its schedule runs {r['settings']['steps']} updates, "
                              f"not --steps {steps} (a pilot is the first updates of the run it predicts)")
    ss, ds = s["settings"], d["settings"]
    if ss["delay"] not in (0, None) or ss["delay_dist"] or ss["correction"] != "none":
        raise ConfigError(f"--sync {sync_dir}: not a sync run (delay {ss['delay']}, correction {ss['correction']})")
    if ds["delay"] in (0, None) and not ds["delay_dist"]:
        raise ConfigError(f"--delayed {delayed_dir}: not a delayed run (delay 0)")
    diff = [k for k in SAME if ss[k] != ds[k]]
    if diff:
        raise ConfigError("mismatched sync and delayed runs: " + "; ".join(f"{k} {ss[k]} vs {ds[k]}" for k in diff))
    fraction = entry["fraction"]
    last = C.pilot_updates(steps, fraction)
    mean = C.mean_delay(ds["delay"], ds["delay_dist"])
    cell = {**_view(ds, ds["delay"], mean, ds["correction"]), "delay_dist": ds["delay_dist"],
            "sync": [s["run"]], "delayed": [d["run"]]}
    view = C.pilot_view(cell, fraction)
    if not C.pilot_curve(view):
        raise ConfigError(f"the two pilots have no validation at the same update within the first {fraction:.0%} "
                          f"of {steps} updates: give them the same --eval-every")
    p = publish.by_name(entry["name"])
    out = p.predict(Ridge.from_dict(entry["model"]), view)
    return {"predictor": entry["name"], "sync": str(sync_dir), "delayed": str(delayed_dir), "steps": steps,
            "pilot_updates": last, "pilot_gap": C.pilot_curve(view)[-1][1], "gap": out["gap"],
            "interval": out["interval"], "held_out": _backing(entry)}
