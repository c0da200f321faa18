"""Fresh cells: a grid no predictor has seen, run once after the predictors were frozen.

The committed reports were read while the predictors were designed and chosen (the choice rule
reads their held-out scores), so their scores there are not a clean test. This grid differs from
every committed one in three ways at once: delays of 3 and 6 (the reports have 1, 2, 4, 8 and
per-stage / random delays of mean 0.5 to 3.5), lrs between the reports' factor-2 lattices (a
factor sqrt 2 off: AdamW 7e-4 and 1.4e-3, Muon 0.014 and 0.028) and a batch of 12 sequences (the
reports use 4, 8, 16 and 40). The model and length are cpu-delays' (the ``small`` GPT, context
64, 220 updates); sync, delayed at tau 3 and 6, and EF at tau 3; 4 seeds.

``python -m delaylab.predict.fresh --out DIR`` runs it (resumable, through
:func:`delaylab.reproduce.runner.run`) and writes ``DIR/runs.jsonl`` through the Ledger's line
writer (:func:`delaylab.reproduce.ledger.gpt_lines`); ``delaylab predict score --fresh DIR`` scores
the frozen predictors on it once (fitted on every committed cell).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from delaylab.llm.sweep import Cell
from delaylab.reproduce.presets import get_preset
from delaylab.reproduce.runner import LLMRun

NAME = "fresh"
FROZEN = "af31e9d1d3f5c77b04b919c4b258ceb72b7dc5a5"  # the commit whose predictors the fresh cells score
# Candidates written after the grid had run and been scored: listed in its table, not a clean test of them.
LATER = ("pilot law (dense), 10%", "pilot ratio law, 10%")
LRS = {"adamw": (7e-4, 1.4e-3), "muon": (0.014, 0.028)}
MOMENTUM = {"adamw": 0.9, "muon": 0.95}
DELAYS = {3: ("delayed", "ef"), 6: ("delayed",)}  # tau: its modes
SEEDS = 4
BATCH = 12


# The second grid, run after the pilot ratio law was named (frozen at FROZEN_2): new again in its
# delays (5 and 7), lrs (a factor 2^(1/4) below the reports' lattice points), batch (10 sequences)
# and length (260 updates); the same model, 4 seeds.
NAME_2 = "fresh-2"
FROZEN_2 = "550676d684449333b3e586d932dfafbacbcc503a"
GRID_2 = dict(lrs={"adamw": (8.4e-4, 1.68e-3), "muon": (0.0168, 0.0336)}, delays={5: ("delayed", "ef"), 7: ("delayed",)},
              batch=10, steps=260, prefix="fresh2")


def base(batch: int = BATCH, steps: int | None = None) -> dict:
    """cpu-delays' base config with the fresh batch size (and length)."""
    from delaylab.reproduce.plan import length_base

    b = {**get_preset("cpu-delays").delays.base, "batch_size": batch}
    return b if steps is None else length_base(b, steps / b["steps"])


def runs(seeds: int = SEEDS, lrs=None, delays=None, batch: int = BATCH, steps: int | None = None,
         prefix: str = "fresh") -> list[LLMRun]:
    """Every run of the grid: sync once per (optimizer, lr, seed), each delay's modes beside it."""
    b = base(batch, steps)
    out = []
    for opt, grid in (lrs or LRS).items():
        for lr in grid:
            for s in range(seeds):
                out.append(LLMRun(f"{prefix}-sync", b, Cell(opt, "sync", float(lr), MOMENTUM[opt], s), "sync"))
            for tau, modes in (delays or DELAYS).items():
                for mode in modes:
                    for s in range(seeds):
                        out.append(LLMRun(f"{prefix}-tau-{tau}", {**b, "delay": tau},
                                          Cell(opt, mode, float(lr), MOMENTUM[opt], s), mode))
    return out


def grid_runs(name: str, seeds: int = SEEDS) -> list[LLMRun]:
    """The runs of the grid ``name`` (``fresh`` or ``fresh-2``)."""
    return runs(seeds) if name == NAME else runs(seeds, **GRID_2)


def run(out, jobs: int = 2, seeds: int = SEEDS, name: str = NAME) -> list[dict]:
    """Run the grid ``name`` under ``out`` (finished runs are read) and write ``out/runs.jsonl``."""
    from delaylab._io import dumps
    from delaylab.reproduce import ledger, runner

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    todo = grid_runs(name, seeds)
    start = time.perf_counter()
    counts = runner.run(out, lambda o: todo, workers=jobs)
    lines = ledger.gpt_lines(name, out, todo)
    (out / ledger.RUNS).write_text("".join(dumps(x) + "\n" for x in lines))
    with open(out / ledger.SESSIONS, "a") as f:
        f.write(json.dumps({**counts, "jobs": jobs, "wall_s": round(time.perf_counter() - start, 1)}) + "\n")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="run folder (rerun to resume); runs.jsonl is written there")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=SEEDS)
    ap.add_argument("--grid", choices=(NAME, NAME_2), default=NAME, help="which grid (default: the first)")
    args = ap.parse_args(argv)
    lines = run(args.out, args.jobs, args.seeds, args.grid)
    print(f"{len(lines)} runs in {args.out}/runs.jsonl")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
