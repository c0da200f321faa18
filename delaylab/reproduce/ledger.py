"""The Ledger: every result the report reads, and the plan's decisions on them.

The runner plans on the run folders (:class:`Folders`) until nothing new appears; at that fixed
point :func:`settle` reads each run of the plan once into a line of ``runs.jsonl`` (a GPT run's
fields, final val loss, val and train curves and regime diagnostics; a toy run's result) and
checks that the plan, made again on those lines alone, lists the same runs. From then on the
Ledger is the only source: findings, protocol, delays, tokens, figures and report take it. Its
decisions (best lrs and censoring, seeds added by the power rule, the momentum and EF grids,
overhead lengths, axis tables) are :func:`delaylab.reproduce.plan.decide` on it, made once
(:attr:`Ledger.decided`) by the same functions the runner planned with, so the report cannot
decide otherwise and no part decides again.

``runs.jsonl`` and ``report.json`` are the Ledger written out; :func:`read` takes it back, and
refuses a ``runs.jsonl`` that lacks a run the report reads (the toy runs included). A report
written before the Ledger (report version 3) kept no train curve: the train-loss diagnostics of
the cells it shows are taken from its ``report.json`` (:func:`_carry`).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from delaylab.errors import MissingFile
from delaylab.llm import metrics
from delaylab.llm.sweep import read_metrics
from delaylab.reproduce import plan as P
from delaylab.reproduce.presets import Preset, get_preset
from delaylab.reproduce.runner import LLMRun, read_summary
from delaylab.reproduce.verdicts import protocol_issues
from delaylab.stats import sample

RUNS = "runs.jsonl"  # one line per run of the report, beside report.json
SESSIONS = "sessions.jsonl"  # one line per invocation: when, how long, how many runs computed / read
TOY_KEYS = ("kind", "task", "name", "folder")  # a toy line's own fields; the rest is the run's result


def validations(lines: list[dict]) -> list[dict]:
    """A run's metrics lines at its validations, as the report reads them: step, tokens, lr, val_loss."""
    return [{"step": m["step"], "tokens": m["tokens"], "lr": m.get("lr"), "val_loss": m["val_loss"]}
            for m in lines if m.get("val_loss") is not None]


class Folders:
    """The results in the run folders under ``out``: what the runner plans on until the fixed point."""

    def __init__(self, out):
        self.out = Path(out)

    def summary(self, run) -> dict | None:
        return read_summary(self.out, run)

    def val_records(self, run) -> list[dict]:
        return validations(read_metrics(self.out / run.folder))


@dataclass(eq=False)
class Ledger:
    """The report's runs as ``lines`` (runs.jsonl's), where they ran (``out``) and the sessions that
    ran them. A results source like :class:`Folders`; ``carried``: see :func:`_carry`."""

    preset: Preset
    out: str
    lines: list[dict]
    sessions: list[dict] = field(default_factory=list)
    carried: dict = field(default_factory=dict)

    def __post_init__(self):
        self._by = {x["folder"]: x for x in self.lines}

    # -- the results ---------------------------------------------------------------------------

    def summary_of(self, folder: str) -> dict:
        """The summary of the run in ``folder`` (see :meth:`summary`)."""
        x = self._by[folder]
        if x["kind"] == "toy":
            return {k: v for k, v in x.items() if k not in TOY_KEYS}
        return {k: x[k] for k in ("val_loss", "params", "tokens", "ns_dtype")}

    def summary(self, run) -> dict | None:
        """What a finished run's summary.json held that the report reads; None for a run not in the Ledger."""
        return self.summary_of(run.folder) if run.folder in self._by else None

    def val_records(self, run) -> list[dict]:
        """The run's validations (:func:`validations`): tokens and val_loss, and where the Ledger keeps
        them (``val_steps``; not in report version 3) the update and the lr at each."""
        x = self._by[run.folder]
        recs = [{"tokens": t, "val_loss": v} for t, v in x["val_curve"]]
        for rec, (step, lr) in zip(recs, x.get("val_steps") or ()):
            rec.update(step=step, lr=lr)
        return recs

    def train_curve(self, folder: str) -> tuple[list, list]:
        """(steps, train losses) of a GPT run; empty where the Ledger kept none (report version 3)."""
        pts = self._by[folder].get("train_curve") or []
        return [s for s, _ in pts], [v for _, v in pts]

    def diagnostics(self, folders: list[str]) -> dict | None:
        """The regime diagnostics of one mode's runs (a cell's seeds), over seeds: mean spike after
        warmup, each seed's spike step, mean plateau exit, whether each seed left the plateau."""
        key = tuple(folders)
        if key in self.carried:
            return self.carried[key]
        per = [d for d in (self._by[f].get("diagnostics") for f in folders) if d is not None]
        if not per:  # a run that logged nothing, or a version-3 report that did not show this cell's
            return None
        return {"spike": sample([d["spike"]["spike"] for d in per])["mean"],
                "spike_steps": [d["spike"]["step"] for d in per],
                "plateau_exit": sample([d["plateau"]["step"] for d in per])["mean"],
                "plateau_left": [d["plateau"]["left"] for d in per]}

    def records(self, runs: list[LLMRun], curves: bool = False) -> list[dict]:
        """One row per run (a run listed twice, once) for the findings: optimizer, mode (the run's
        label), lr, momentum, seed, val_loss, run (its folder), variant and ``issues`` (its breaches
        of the protocol, :func:`delaylab.reproduce.verdicts.protocol_issues`). ``curves``: each row
        also carries its validations as ``metrics`` (:meth:`val_records`)."""
        rows, seen = [], set()
        for r in runs:
            if r.folder in seen:  # the first listing's label counts, as in the plan's (plan._unique)
                continue
            seen.add(r.folder)
            c, x = r.cell, self._by[r.folder]
            rows.append({"optimizer": c.optimizer, "mode": r.label, "lr": c.lr, "momentum": c.momentum,
                         "seed": c.seed, "val_loss": x["val_loss"], "run": r.folder, "variant": r.variant,
                         "issues": protocol_issues(c.optimizer, c.momentum, r.base["steps"], r.base.get("warmup"))})
            if curves:
                rows[-1]["metrics"] = self.val_records(r)
        return rows

    def ns_dtypes(self) -> dict:
        """``{dtype: runs}`` of the Newton-Schulz iterations the report's Muon/LMO runs computed in."""
        out: dict = {}
        for x in self.lines:
            if x.get("ns_dtype"):
                out[x["ns_dtype"]] = out.get(x["ns_dtype"], 0) + 1
        return out

    # -- the decisions (plan.decide on the Ledger, once) ----------------------------------------------

    @functools.cached_property
    def decided(self) -> dict:
        """The plan's decisions and their runs (:func:`delaylab.reproduce.plan.decide`), made once."""
        return P.decide(self.preset, self)

    @property
    def gpt_runs(self) -> list[LLMRun]:
        return P.llm_runs(self.preset, self.decided)

    @property
    def best(self) -> dict | None:
        return self.decided.get("best")

    @property
    def overhead(self) -> dict:
        return self.decided.get("overhead", {})

    @property
    def axis(self) -> dict | None:
        return self.decided["axis"][1] if "axis" in self.decided else None

    @property
    def delay_axis(self) -> dict | None:
        return self.decided["delay_axis"][1] if "delay_axis" in self.decided else None

    @property
    def tokens_axis(self) -> dict | None:
        return self.decided["tokens_axis"][1] if "tokens_axis" in self.decided else None

    def decisions(self) -> dict:
        """Every decision the plan made on the results, with its reason, JSON-ready: per optimizer the
        best sync lr, its grid, how far it grew and where an optimum stayed at an edge (censored);
        the seeds the power rule gave each headline cell and the gap interval that stopped it; each
        momentum's and EF's lr grid; the run length that reached sync's loss per overhead run; the
        axes' tuned lrs and seeds."""
        out: dict = {}
        if self.best is not None:
            out["best_sync"] = {o: {"lr": b["lr"], "lrs": b["lrs"], "extended": b["grid"]["extended"],
                                    "censored": b["grid"]["censored"]} for o, b in self.best.items()}
            out["power"] = self.decided["power"]
            grid = ("lrs", "best", "extended", "censored")  # what an lr grid decided, and how it grew
            out["momentum_grid"] = {f"{o}/{m:g}": {k: g[k] for k in grid}
                                    for (o, m), g in self.decided["momentum_grid"].items()}
            out["ef_grid"] = {o: {k: g[k] for k in grid} for o, g in self.decided["ef_grid"].items()}
            out["overhead"] = {"/".join(map(str, k)): {"length": o["length"], "runs": [r.folder for r in o["runs"]],
                                                       "diverged": o.get("diverged", False)}
                               for k, o in self.overhead.items()}
        if self.axis is not None:
            out["axis"] = {f"{size}/{ratio:g}/{opt}": {"lr": c["lr"], "scan": {k: c["scan"][k] for k in
                                                                              ("lrs", "extended", "censored")},
                                                       "seeds": c["cell"]["power"]["seeds"],
                                                       "resolved": c["cell"]["power"]["resolved"]}
                           for (size, ratio, opt), c in self.axis.items()}
        if self.tokens_axis is not None:
            out["tokens_axis"] = {f"{size}/{ratio:g}/{kind}": {k: pt[k] for k in ("lrs", "best", "extended", "censored")}
                                  for (size, ratio, kind), pt in self.tokens_axis.items()}
        if self.delay_axis is not None:
            out["delay_lrs"] = {"/".join(k) if isinstance(k, tuple) else k:
                                ({o: g["best"]["sync"] for o, g in v.items()} if k == "sync"
                                 else {"lr": v["lr"], "tuned": v["tuned"]})
                                for k, v in self.delay_axis["lrs"].items()}
        return out

    # -- written out -------------------------------------------------------------------------------

    def write(self, out) -> None:
        """``out/runs.jsonl``, atomically (a reader never sees half a file)."""
        from delaylab._io import dumps

        tmp = Path(out) / (RUNS + ".tmp")
        tmp.write_text("".join(dumps(x) + "\n" for x in self.lines))
        os.replace(tmp, Path(out) / RUNS)


def _gpt_line(report: str, r: LLMRun, summary: dict, lines: list[dict]) -> dict:
    """A GPT run as a line of runs.jsonl: enough to recompute every number of the report without
    delaylab: what the run was (optimizer, mode, correction, delay, lr, momentum, seed, the model
    preset and the report's, the run's variant and label), its size (params, steps, tokens,
    tokens_per_param), its result (final ``val_loss``, None where it diverged, ``val_curve``:
    [tokens, val_loss] at every validation, ``val_steps``: [update, lr] at each) and, for the figures
    and the regime columns,
    ``train_curve`` ([step, train_loss]) and ``diagnostics`` (:func:`delaylab.llm.metrics.diagnostics`)."""
    from delaylab.llm.config import Config

    cfg = r.cell.config(Config.from_dict(r.base))
    vals = validations(lines)
    curve = [[m["tokens"], m["val_loss"]] for m in vals]
    params = summary.get("params")
    tokens = summary.get("tokens") if summary.get("tokens") is not None else (curve[-1][0] if curve else None)
    return {
        "kind": "gpt", "optimizer": r.cell.optimizer, "mode": r.label, "sweep_mode": r.cell.mode,
        "correction": cfg.delay.correction, "delay": cfg.delay.delay, "delay_dist": cfg.delay.delay_dist,
        "n_layer": r.base.get("n_layer"), "lr": r.cell.lr,
        "momentum": r.cell.momentum, "seed": r.cell.seed, "preset": cfg.model.preset, "report_preset": report,
        "variant": r.variant, "folder": r.folder, "params": params, "steps": cfg.run.steps,
        "batch_size": cfg.data.batch_size, "block_size": cfg.model.block_size,
        "warmup": r.base.get("warmup"), "lr_schedule": cfg.lr_schedule.lr_schedule, "sync_start": r.base.get("sync_start", 0),
        "sync_cooldown": r.base.get("sync_cooldown", 0), "dc_lambda": r.base.get("dc_lambda"),
        "tokens": tokens, "tokens_per_param": None if not (tokens and params) else tokens / params,
        "calls": summary.get("calls"),  # batches whose gradient was computed (> steps: a fill, or discards)
        "val_loss": summary.get("val_loss"), "diverged": summary.get("val_loss") is None,
        "ns_dtype": summary.get("ns_dtype"), "val_curve": curve,
        "val_steps": [[m["step"], m["lr"]] for m in vals],
        "train_curve": [[m["step"], m["train_loss"]] for m in lines if m.get("train_loss") is not None],
        "diagnostics": metrics.diagnostics(lines) if any("train_loss" in m for m in lines) else None}


def _toy_line(run, result: dict) -> dict:
    """A toy run as a line: its task and folder, then its result (without the wall time)."""
    return {"kind": "toy", "task": run.task, "name": run.name, "folder": run.folder,
            **{k: v for k, v in result.items() if k != "seconds"}}


def settle(p: Preset, out, sessions: list[dict] | None = None) -> Ledger:
    """The Ledger of the finished runs in ``out``: every run the plan lists at its fixed point, read
    once. Raises where a run is unfinished or where the plan on the Ledger alone lists other runs
    (a decision that read something the Ledger does not keep)."""
    src = Folders(out)
    runs = P.plan(p, src)
    lines = []
    for r in runs:
        s = src.summary(r)
        if s is None:
            raise RuntimeError(f"settle: {r.folder} is not finished (the plan is not at its fixed point)")
        lines.append(_gpt_line(p.name, r, s, read_metrics(src.out / r.folder)) if isinstance(r, LLMRun)
                     else _toy_line(r, s))
    ledger = Ledger(p, str(out), lines, list(sessions or []))
    if [r.folder for r in P.plan(p, ledger)] != [r.folder for r in runs]:
        raise AssertionError("settle: the plan on the Ledger lists other runs than on the folders")
    return ledger


def gpt_lines(report: str, out, runs: list[LLMRun]) -> list[dict]:
    """The lines of ``runs`` (finished GPT runs under ``out``) for a grid that no preset plans (the
    fresh cells of delaylab.predict): the same line a report's Ledger writes, ``report`` as its
    ``report_preset``."""
    src = Folders(out)
    out_lines = []
    for r in runs:
        s = src.summary(r)
        if s is None:
            raise RuntimeError(f"gpt_lines: {r.folder} is not finished")
        out_lines.append(_gpt_line(report, r, s, read_metrics(src.out / r.folder)))
    return out_lines


def runs(folder) -> list[dict]:
    """The lines of ``folder/runs.jsonl``, one dict per run: the one reader of that file (a folder
    with a runs.jsonl and no report.json, such as docs/beyond/moe-cpu, is read by this alone)."""
    return [json.loads(x) for x in (Path(folder) / RUNS).read_text().splitlines() if x.strip()]


def read(folder) -> Ledger:
    """The Ledger a report folder holds: ``runs.jsonl``, ``sessions.jsonl`` and, from ``report.json``,
    the preset, where it ran, and what a version-3 runs.jsonl lacks (:func:`_carry`). Raises where
    ``runs.jsonl`` lacks a run the plan lists on it (every run the report reads is a line)."""
    folder = Path(folder)
    rep = json.loads((folder / "report.json").read_text())
    p = get_preset(rep["preset"])
    lines = runs(folder)
    path = folder / SESSIONS
    sessions = ([json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file()
                else rep.get("sessions", []))
    book = Ledger(p, rep["out"], lines, sessions, _carry(rep, lines))
    missing = [r.folder for r in P.plan(p, book) if r.folder not in book._by]
    if missing:
        raise MissingFile(f"{folder / RUNS} lacks {len(missing)} of the report's runs (first: {missing[0]})")
    return book


def _carry(rep: dict, lines: list[dict]) -> dict:
    """What a runs.jsonl written before the Ledger (report version 3) lacks, from its report.json:
    the train-loss diagnostics, kept per cell (``{folders of one mode's seeds: diagnostics}``) for
    every row of the report that shows them (the per-run values and curves were not kept).
    Returns them ({} for a runs.jsonl that has them)."""
    carried: dict = {}
    if any(x["kind"] == "gpt" and "diagnostics" not in x for x in lines):
        def walk(x):
            if isinstance(x, dict):
                if isinstance(x.get("diagnostics"), dict) and isinstance(x.get("runs"), dict):
                    renamed = {("ef" if m == x.get("fix") else m): f for m, f in x["runs"].items()}
                    for m, d in x["diagnostics"].items():
                        if m in renamed:  # a mode the row shows (finding 1's rows keep EF's too, without its runs)
                            carried[tuple(renamed[m])] = d
                for v in x.values():
                    walk(v)
            elif isinstance(x, list):
                for v in x:
                    walk(v)

        walk(rep["parts"])
    return carried
