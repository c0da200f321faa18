"""Starting the ranks: torch's elastic launcher (the API behind ``torchrun``), one process per stage
and data-parallel replica (``P x D``; rank ``r`` is stage ``r % P`` of replica ``r // P``).

``train_pipeline(cfg, out)`` runs one configuration and returns the last stage's summary;
``run_jobs`` runs several back to back in the same ranks (one start-up for all: tests and
benchmarks). Bad configurations fail here, before any process starts.
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from delaylab.errors import ConfigError, DelaylabError, MissingFile
from delaylab.llm.config import Config
from delaylab.llm.data import load_dataset
from delaylab.llm.run.folder import TrainFolder as RunFolder
from delaylab.run_folder import CONFIG
from delaylab.llm.pipeline import checkpoint
from delaylab.llm.pipeline.engine import FAILURE, run_rank


class PipelineFailed(DelaylabError, RuntimeError):
    """A rank of the pipeline failed; the message names it (exit code 1)."""

    exit_code = 1


def _entry(cfg_dict: dict, out: str, resume: bool, stop_at: int | None):
    return run_rank(Config.from_dict(cfg_dict), out, resume, stop_at)


def _entry_jobs(jobs: list[tuple[dict, str, bool]]):
    first = Config.from_dict(jobs[0][0]).resolved("pipeline")
    device = first.torch_device(int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            timeout=timedelta(seconds=first.parallel.timeout))
    results = [run_rank(Config.from_dict(c), out, resume) for c, out, resume in jobs]
    dist.destroy_process_group()
    return results


def _load_data(cfg: Config) -> None:
    """Tokenize (and cache) the data once here, not in every rank; bad data fails here."""
    d = cfg.data
    load_dataset(d.data, d.tokenizer, d.vocab_size, d.val_fraction, d.text_field)


def run_jobs(jobs: list[tuple[Config, str | os.PathLike]]) -> list[dict]:
    """Run several pipeline runs back to back in one set of ranks (one start-up for all).

    Every job needs the same number of stages and replicas; returns their summaries in order.
    """
    if not jobs:
        return []
    jobs = [(cfg.resolved("pipeline"), out) for cfg, out in jobs]
    shapes = {(cfg.parallel.stages, cfg.parallel.dp) for cfg, _ in jobs}
    if len(shapes) != 1:
        raise ConfigError(f"run_jobs needs one (stages, dp) for all jobs, got {sorted(shapes)}")
    for cfg, out in jobs:
        check_folder(cfg, out, resume=False)
        _load_data(cfg)
        Path(out).mkdir(parents=True, exist_ok=True)
    P, D = shapes.pop()
    results = launch(_entry_jobs, P * D, [(cfg.to_dict(), str(out), False) for cfg, out in jobs])
    return results[P - 1]  # the writer: the last stage of replica 0


def check_folder(cfg: Config, out: str | os.PathLike, resume: bool) -> None:
    """Raise (one line) unless ``out`` can take a new run, or holds a resumable run of ``cfg``."""
    cfg, out = cfg.resolved("pipeline"), Path(out)
    run = RunFolder(cfg, out, marks=("ckpt",))
    if not resume:
        run.check_new()
        return
    if checkpoint.latest_complete(out / "ckpt", cfg.parallel.stages) is None:
        raise MissingFile(f"no complete pipeline checkpoint to resume in {out / 'ckpt'}")
    if (out / CONFIG).is_file():
        run.check_same_run(json.loads((out / CONFIG).read_text()))


def train_pipeline(cfg: Config, out: str | os.PathLike, *, resume: bool = False,
                   stop_at: int | None = None) -> dict:
    """Spawn one process per stage and replica, run ``cfg``, return the summary (also in ``out/summary.json``).

    Bad configurations raise :class:`ConfigError` here, before any process starts; a failed rank
    raises :class:`PipelineFailed` naming it. ``resume`` and ``stop_at``: see :func:`run_rank`.
    """
    cfg = cfg.resolved("pipeline")
    if stop_at is not None and stop_at < 1:
        raise ConfigError(f"stop_at must be >= 1, got {stop_at}")
    check_folder(cfg, out, resume)
    _load_data(cfg)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / FAILURE).unlink(missing_ok=True)
    try:
        results = launch(_entry, cfg.parallel.stages * cfg.parallel.dp, cfg.to_dict(), str(out), resume, stop_at)
    except PipelineFailed as err:
        if (out / FAILURE).is_file():
            first = json.loads((out / FAILURE).read_text())
            who = "a rank" if first["rank"] is None else f"rank {first['rank']}"
            raise PipelineFailed(f"pipeline stopped: {who} failed ({first['reason']})") from None
        raise err from None
    return results[cfg.parallel.stages - 1]  # the writer: the last stage of replica 0


def launch(fn, nprocs: int, *args, what: str = "pipeline") -> dict:
    """Run ``fn(*args)`` in ``nprocs`` ranks through torch's elastic launcher; ``{rank: result}``.
    A rank that fails raises :class:`PipelineFailed` ("``what`` stopped: rank r ...")."""
    import logging

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # The ranks report failures themselves (one line each); the agent's tracebacks add nothing.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the ranks inherit it; one thread each
    # A rank that fails leaves with os._exit; multiprocessing's tracker then warns about a
    # semaphore it cleans up anyway.
    os.environ.setdefault("PYTHONWARNINGS", "ignore::UserWarning:multiprocessing.resource_tracker")
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nprocs, run_id=uuid.uuid4().hex[:12],
        rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.2,
        start_method="spawn",
    )
    try:
        return elastic_launch(config, fn)(*args)
    except ChildFailedError as err:
        rank, failure = err.get_first_failure()
        # A rank killed by a signal is the cause; the ranks that then lost their peer exit 1 and
        # can be seen first (the agent's SIGTERM to the rest, -15, is a consequence too).
        killed = sorted((r, f) for r, f in err.failures.items() if f.exitcode < 0 and f.exitcode != -15)
        if killed and failure.exitcode >= 0:
            rank, failure = killed[0]
        code = failure.exitcode
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        raise PipelineFailed(f"{what} stopped: rank {rank} ended first ({how})") from None
