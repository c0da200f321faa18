"""Runs of the report, and a resumable pool that runs them two at a time.

A run is a folder under ``DIR``: ``llm/<variant>/cells/<cell>/`` (a GPT training run, laid out
as ``delaylab llm sweep`` lays out its cells, so the sweep commands in the report find and reuse
them) or ``toy/<name>/`` (one call of :mod:`delaylab.toy.rates`). A run is finished when its
``summary.json`` exists; finished runs are read, never rerun, and an interrupted GPT run
resumes from its checkpoint (:func:`delaylab.llm.sweep.run_cell`), so a killed report resumed
gives the same numbers.

:func:`run` takes a *plan*: a function of ``DIR`` that lists every run it can decide on from
the finished ones (the mitigation and momentum runs need the best sync lr, known only once
the lr grid has finished). It is called again after every finished run until nothing new
appears.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from delaylab._io import write_json
from delaylab.errors import ConfigError, DelaylabError, Preempted
from delaylab.llm.sweep import Cell

SUMMARY = "summary.json"


class RunFailed(DelaylabError, RuntimeError):
    """A run of the report raised; the message names its folder (exit code 1; rerun to resume)."""

    exit_code = 1


@dataclass(frozen=True, eq=False)
class LLMRun:
    """``cell`` (optimizer, sweep mode, lr, momentum, seed) on top of the TrainConfig fields ``base``.

    ``variant`` names the base (one folder per base, like one sweep folder per base config);
    ``label`` is the row the run stands for in the report (e.g. ``sync-start`` for a delayed
    run whose base has ``sync_start=K``).
    """

    variant: str
    base: dict
    cell: Cell
    label: str

    @property
    def folder(self) -> str:
        return f"llm/{self.variant}/cells/{self.cell.name}"


@dataclass(frozen=True, eq=False)
class ToyRun:
    """``task`` (``rates``, ``cost`` or ``compare`` of :mod:`delaylab.toy.rates`) with ``kwargs``."""

    name: str
    task: str
    kwargs: dict

    @property
    def folder(self) -> str:
        return f"toy/{self.name}"


def read_summary(out: Path, run) -> dict | None:
    """The finished run's summary, or None while it is not finished."""
    path = Path(out) / run.folder / SUMMARY
    return json.loads(path.read_text()) if path.is_file() else None


def toy_result(task: str, kwargs: dict) -> dict:
    from delaylab.toy.problems import make_problem
    from delaylab.toy.rates import compare, delay_cost, rate_check

    kw = dict(kwargs)
    problem = make_problem(kw.pop("problem"))
    if task == "rates":
        return rate_check(problem, kw.pop("method"), **kw)
    if task == "cost":
        return delay_cost(problem, kw.pop("method"), **kw)
    if task == "compare":
        return compare(problem, **kw)
    raise ConfigError(f"unknown toy task {task!r}")


def execute(run, out: str) -> bool:
    """Make sure ``run`` is finished in ``out``; True when it had to compute (not only read)."""
    folder = Path(out) / run.folder
    if (folder / SUMMARY).is_file():
        return False
    if isinstance(run, LLMRun):
        from delaylab.llm.sweep import run_cell

        run_cell(run.base, run.cell, str(folder))  # resumes from a checkpoint; a divergence is a result
        return True
    import torch

    torch.set_num_threads(1)
    write_json(folder / "config.json", {"task": run.task, **run.kwargs})
    start = time.perf_counter()
    result = toy_result(run.task, run.kwargs)
    result["seconds"] = time.perf_counter() - start
    write_json(folder / SUMMARY, result)
    return True


def _work(run, out: str) -> bool:
    """:func:`execute` in a pool worker. Stopped by a signal, the worker leaves at once (its run keeps
    its last checkpoint) instead of returning the stop as a result and taking the next queued run."""
    try:
        return execute(run, out)
    except KeyboardInterrupt:
        os._exit(130)
    except Preempted:
        os._exit(Preempted.exit_code)


def _interrupt_workers() -> None:
    """Forward an interrupt to the pool's processes, which a signal sent to this process alone misses."""
    import multiprocessing as mp
    import signal

    for child in mp.active_children():
        try:
            os.kill(child.pid, signal.SIGINT)
        except (ProcessLookupError, PermissionError):
            pass


def run(out: Path, plan: Callable[[Path], list], workers: int = 2, progress: bool | None = None,
        counts: dict | None = None) -> dict:
    """Finish every run ``plan(out)`` lists (replanning after each one); returns counts and time.

    ``workers`` runs at a time, each in its own process with one thread; ``workers=1`` runs
    them here, one after the other. ``counts`` (updated as runs finish, also when this raises):
    ``computed``, ``read``, ``runs`` and ``seconds``.
    """
    from delaylab._progress import Progress

    if workers < 1:
        raise ConfigError(f"jobs must be >= 1, got {workers}")
    start = time.perf_counter()
    seen: set[str] = set()
    counts = counts if counts is not None else {}
    counts.update(computed=0, read=0, runs=0, seconds=0.0)
    bar = Progress("reproduce", 0, progress)

    def new_runs() -> list:
        fresh = [r for r in plan(out) if r.folder not in seen]
        seen.update(r.folder for r in fresh)
        bar.set_total(len(seen))
        return fresh

    def done(computed: bool, r) -> None:
        counts["computed" if computed else "read"] += 1
        counts["seconds"] = time.perf_counter() - start
        seconds = (read_summary(out, r) or {}).get("train_time_s") if computed else None
        bar.update(r.folder, seconds, read=not computed)

    try:
        queue = new_runs()
        if workers == 1:
            while queue:
                for r in queue:
                    done(_checked(execute, r, out), r)
                queue = new_runs()
        else:
            import multiprocessing as mp

            # One thread per run: two single-threaded runs use two cores better than one with two.
            os.environ.setdefault("OMP_NUM_THREADS", "1")
            # A worker that leaves on Ctrl-C makes the tracker warn about a semaphore it cleans up anyway.
            os.environ.setdefault("PYTHONWARNINGS", "ignore::UserWarning:multiprocessing.resource_tracker")
            pool, pending, interrupted = None, {}, False
            try:
                while queue or pending:
                    for r in queue:
                        if (Path(out) / r.folder / SUMMARY).is_file():
                            done(False, r)  # finished earlier: read, no process needed
                            continue
                        if pool is None:
                            pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
                        pending[pool.submit(_work, r, str(out))] = r
                    if pending:
                        finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                        for fut in finished:
                            r = pending.pop(fut)
                            done(_checked(fut.result, folder=r.folder), r)
                    queue = new_runs()
            except (KeyboardInterrupt, Preempted):
                interrupted = True
                _interrupt_workers()  # they stop within a step; their checkpoints stay for the resume
                raise
            finally:
                if pool is not None:  # after a failed run, let the running ones finish and save
                    pool.shutdown(wait=not interrupted, cancel_futures=True)
    finally:
        bar.close()
        counts.update(runs=len(seen), seconds=time.perf_counter() - start)
    return counts


def _checked(fn, *args, folder: str | None = None):
    """Call ``fn``; a failure names the run it came from (one line)."""
    try:
        return fn(*args)
    except (KeyboardInterrupt, SystemExit, Preempted):  # a stop, not a failure of the run
        raise
    except Exception as err:
        where = folder or getattr(args[0], "folder", "?")
        msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise RunFailed(f"run {where} failed: {msg}") from err
