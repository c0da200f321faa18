"""``delaylab reproduce``: the paper's six findings at small scale, each beside the theory's prediction.

``reproduce(preset, out)`` runs (or reads) every run the report needs under ``out`` and writes
``out/report.json``, ``out/report.md``, ``out/repro_*.png`` and ``out/runs.jsonl`` (one line per
GPT run: enough to recompute every number without delaylab):

1. sync vs one-step-delayed final val loss per optimizer (AdamW, Muon, Lion, SOAP, Adan, MARS);
2. the share of the gap EF, DC-ASGD, sync start and sync cooldown recover;
3. the gap against momentum; 4. sync and delayed loss against the peak lr;
5. 2BW's constant delay against PipeDream's per-stage delays (simulator, per-group tau);
6. the toy rate checks of :mod:`delaylab.toy.rates` (measured vs bound, slopes);
7. the protocol's ablations (warmup, run length, DC-ASGD's lambda) and 8. the tokens-per-parameter
   and model-size axes, where the preset has them (:mod:`~delaylab.reproduce.protocol`); 9. the
   delay axis (tau = 1..8, per-stage and random delays, correctors; :mod:`~delaylab.reproduce.delays`); and a
   theory column of every number the theory gives against the measured one. Verdicts are
   three-valued, by one rule (:mod:`~delaylab.reproduce.verdicts`).

Modules: :mod:`~delaylab.reproduce.presets` (the grids), :mod:`~delaylab.reproduce.plan`
(which runs each finding needs), :mod:`~delaylab.reproduce.runner` (the resumable pool),
:mod:`~delaylab.reproduce.ledger` (the runs read once at the plan's fixed point, and the
decisions on them: all the report reads),
:mod:`~delaylab.reproduce.predict` (the theory side), :mod:`~delaylab.reproduce.findings`
(tables and verdicts), :mod:`~delaylab.reproduce.figures` and :mod:`~delaylab.reproduce.report`.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

from delaylab.errors import ConfigError, Preempted
from delaylab._io import jsonable, write_json
from delaylab.reproduce.presets import PRESETS, Preset, get_preset

SPEC = "reproduce.json"
GRID_FIELDS = ("llm", "schedules", "toy", "scale", "delays", "field")  # what decides the runs (names and notes may change)

__all__ = ["PRESETS", "Preset", "get_preset", "reproduce"]


def _check_folder(p: Preset, out: Path) -> None:
    """A folder belongs to one grid: resuming it with another preset would mix two reports."""
    path = out / SPEC
    spec = jsonable({k: v for k, v in p.to_dict().items() if k in GRID_FIELDS})
    if path.is_file():
        try:
            saved = json.loads(path.read_text())
        except json.JSONDecodeError:
            raise ConfigError(f"{path} is not valid JSON; use another --out") from None
        if {k: saved.get(k) for k in GRID_FIELDS} != {k: spec[k] for k in GRID_FIELDS}:
            raise ConfigError(f"{out} holds a report of another grid (preset {saved.get('name')!r}); use another --out")
    else:
        write_json(path, {"name": p.name, **spec})


def reproduce(preset: str | Preset, out, jobs: int = 2, progress: bool | None = None) -> dict:
    """Run every finding of ``preset`` in ``out`` (resumable) and return the report (also on disk)."""
    from delaylab.llm.data import load_dataset
    from delaylab.llm.distributed import preempt
    from delaylab.reproduce import ledger, markdown, plan, report, runner

    p = get_preset(preset) if isinstance(preset, str) else preset
    plan.check_protocol(p)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _check_folder(p, out)
    if p.estimate:
        print(f"reproduce {p.name}: {p.estimate}", file=sys.stderr, flush=True)
    base = p.base
    load_dataset(base.get("data", "shakespeare"), base.get("tokenizer", "byte"))  # tokenize once, not per worker
    start = datetime.datetime.now().astimezone()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    counts: dict = {}
    status, stopped = "interrupted", None
    with preempt.raising():  # SIGTERM / SIGUSR1 / SIGINT: workers stop at a checkpoint, exit 75
        try:
            runner.run(out, lambda o: plan.plan(p, ledger.Folders(o)), workers=jobs, progress=progress,
                       counts=counts)
            status = "finished"
        except runner.RunFailed:
            status = "failed"
            raise
        except Preempted as err:
            stopped = str(err).split(":")[0]  # the signal (or what asked for the stop)
            raise
        finally:  # every session is kept, so a report resumed after a kill shows all the time it took
            end = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
            session = {"date": start.isoformat(timespec="seconds"), "status": status, "jobs": jobs,
                       "cpus": os.cpu_count(), "load_start": None if load is None else round(load, 2),
                       "load_end": None if end is None else round(end, 2), **counts}
            if stopped:
                session["stopped_by"] = stopped
            with open(out / ledger.SESSIONS, "a") as f:
                f.write(json.dumps(session) + "\n")
    sessions = [json.loads(line) for line in (out / ledger.SESSIONS).read_text().splitlines() if line.strip()]
    book = ledger.settle(p, out, sessions)  # the last read of a run folder
    rep = report.build(book, draw=out)
    write_json(out / "report.json", rep)
    (out / "report.md").write_text(markdown.markdown(rep))
    book.write(out)
    return rep
