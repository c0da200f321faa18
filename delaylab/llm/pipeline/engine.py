"""The multi-process engine: its configuration and the body of one rank.

Each rank runs :func:`run_rank` (``launch.py`` spawns them through torch's elastic launcher;
under ``torchrun``, ``delaylab llm pipeline`` calls it directly). Backend: NCCL when CUDA is
available (one GPU per rank), else gloo.

Failure handling: the process group's timeout is ``cfg.timeout`` (60 s by default, not
torch's 30 minutes). A rank whose peer dies sees the broken connection at its next
message, names the first failed rank (``p2p.blame``) on stderr and exits with code 1;
its neighbours then do the same, so the whole pipeline ends within seconds.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from delaylab._io import save_torch, write_json
from delaylab.llm.data import load_dataset
from delaylab.llm.model import GPT, autocast
from delaylab.llm.pipeline import checkpoint
from delaylab.llm.pipeline.executor import StageExecutor, TorchScheduleExecutor
from delaylab.llm.pipeline.p2p import P2P, blame
from delaylab.llm.pipeline.schedules import Schedule, check_config
from delaylab.llm.pipeline.stages import Stage
from delaylab.llm.pipeline.timeline import Event, Timeline, plot_timeline
from delaylab.llm.train import RESUMABLE_CHANGES, TrainConfig, lr_factor

PIPELINE_FIELDS = ("pipeline", "stages", "microbatches", "timeout")
# torch.distributed.pipelining's own synchronous schedules on the same stages: the baseline.
TORCH_SCHEDULES = {"torch-1f1b": "1f1b", "torch-gpipe": "gpipe"}
FAILURE = "failure.json"  # written by the rank that reported the first failure


@dataclass
class PipelineConfig(TrainConfig):
    """A :class:`TrainConfig` run as a pipeline.

    ``batch_size`` is the microbatch size; an update takes ``microbatches`` of them (the
    trainer's ``grad_accum``), so microbatch ``n`` is the trainer's batch ``n``. ``mode``,
    ``delay`` and ``grad_accum`` follow from the pipeline schedule (:meth:`resolve`).
    ``pipeline`` names the pipeline schedule; ``schedule`` stays the trainer's LR schedule.
    """

    pipeline: str = "2bw"
    stages: int = 2
    microbatches: int = 4
    timeout: float = 60.0  # seconds; a hung message ends the run after this long

    def resolve(self) -> "PipelineConfig":
        """Fill the trainer fields the schedule determines; returns self."""
        self.grad_accum = self.microbatches
        if self.pipeline in TORCH_SCHEDULES:
            self.mode, self.delay = "sync", 0
        elif self.pipeline == "2bw":
            self.mode, self.delay = "delayed", 1
        elif self.pipeline == "pipedream":
            self.mode, self.delay = "delayed", [self.stages - 1 - s for s in range(self.stages)]
        else:
            self.mode, self.delay = "sync", 0
        if self.tie_embeddings is None:
            self.tie_embeddings = False
        return self

    def validate(self) -> "PipelineConfig":
        self.resolve()
        from delaylab.llm.model import PRESETS

        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r} (choose from {', '.join(PRESETS)})")
        check_config(TORCH_SCHEDULES.get(self.pipeline, self.pipeline), self.stages, self.microbatches,
                     PRESETS[self.preset].n_layer)
        if self.pipeline in TORCH_SCHEDULES and self.stages < 2:
            raise ValueError(f"{self.pipeline} needs at least 2 stages")
        if self.pipeline == "torch-1f1b" and self.microbatches < self.stages:
            raise ValueError(f"torch's Schedule1F1B needs microbatches >= stages = {self.stages}")
        if self.tie_embeddings and self.stages > 1:
            raise ValueError("a pipeline needs untied embeddings: the tied matrix would need a "
                             "cross-stage gradient sum at every update (use tie_embeddings=False)")
        if self.correction not in ("none", "ef"):
            raise ValueError(f"the pipeline supports correction none or ef, got {self.correction!r}")
        if self.correction != "none" and self.mode == "sync":
            raise ValueError(f"correction {self.correction!r} needs a delayed schedule (2bw or pipedream)")
        if self.sync_start or self.sync_cooldown:
            raise ValueError("sync_start / sync_cooldown are not supported by the pipeline engine")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"the pipeline places rank r on cuda:r; use device auto, cuda or cpu, not {self.device!r}")
        gpus = torch.cuda.device_count() if self.device != "cpu" else 0
        if self.device == "cuda" and gpus < self.stages or self.device == "auto" and 0 < gpus < self.stages:
            raise ValueError(f"{self.stages} stages need {self.stages} GPUs, found {gpus} (or use device cpu)")
        super().validate()
        return self

    def train_config(self) -> TrainConfig:
        """The single-process run with the same semantics (same data, init, optimizer, delays)."""
        d = {k: v for k, v in self.resolve().to_dict().items() if k not in PIPELINE_FIELDS}
        return TrainConfig.from_dict(d)


# ------------------------------------------------------------------------------------------------
# One rank


def _device(cfg: PipelineConfig, local_rank: int) -> torch.device:
    if cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", local_rank)


def optimizer_factory(cfg: PipelineConfig):
    """``make(module, tau)``: a stage's optimizer, with EF at the stage's lag ``tau`` if asked."""
    from delaylab.optim import Delayed, build_optimizer

    hp = dict(lr=cfg.resolved_lr(), momentum=cfg.momentum, weight_decay=cfg.weight_decay)

    def make(module, tau: int):
        inner = build_optimizer(cfg.optimizer, module, **hp)
        if cfg.correction == "ef":
            # The stage's gradients are stale already: EF with the stage's lag, no queue.
            return Delayed(inner, delay=0, correction="ef", ef_lag=tau)
        return inner

    return make


def run_rank(cfg: PipelineConfig, out: str | os.PathLike, resume: bool = False,
             stop_at: int | None = None) -> dict | None:
    """Run this process's stage (rank = stage, from torchrun's environment variables).

    ``resume``: continue from the newest complete checkpoint in ``out/ckpt``. ``stop_at=K``:
    end after update ``K`` with a checkpoint, as an interrupted run would (the LR schedule
    still spans ``cfg.steps``). Returns the summary on the last stage, ``None`` elsewhere. On
    any failure, prints one line naming the rank that failed first and exits with code 1.
    """
    rank = int(os.environ["RANK"])
    try:
        return _run_rank(cfg, Path(out), resume, stop_at, rank)
    except BaseException as err:  # noqa: BLE001 - every failure ends the process the same way
        if isinstance(err, KeyboardInterrupt) or not dist.is_initialized():
            raise
        who, why, ours = blame(rank, err)
        lead = f"rank {rank} (stage {rank}) stopped: " + ("it failed" if who == rank else f"rank {who} failed")
        print(f"delaylab pipeline: {lead} ({why})", file=sys.stderr, flush=True)
        if ours:  # the launcher repeats the first failure in its own one-line error
            try:
                (Path(out) / FAILURE).write_text(json.dumps({"rank": who, "reason": why}) + "\n")
            except OSError:
                pass
        if os.environ.get("DELAYLAB_DEBUG"):
            import traceback

            traceback.print_exc()
        os._exit(1)  # no atexit hooks: destroying a broken process group can hang


def _run_rank(cfg: PipelineConfig, out: Path, resume: bool, stop_at: int | None, rank: int) -> dict | None:
    cfg.validate()
    world = int(os.environ["WORLD_SIZE"])
    if world != cfg.stages:
        raise ValueError(f"{world} processes for {cfg.stages} stages: start exactly one rank per stage")
    torch.set_num_threads(cfg.threads or 1)
    device = _device(cfg, int(os.environ.get("LOCAL_RANK", rank)))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    own_group = not dist.is_initialized()  # run_jobs keeps one group for several runs
    if own_group:
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo", timeout=timedelta(seconds=cfg.timeout),
            **({"device_id": device} if device.type == "cuda" else {}),
        )
    P, M, last = cfg.stages, cfg.microbatches, rank == cfg.stages - 1
    ckpt_root = out / "ckpt"
    start, ckpt = 0, None
    if resume:
        step = checkpoint.latest_complete(ckpt_root, P)
        if step is None:
            raise FileNotFoundError(f"no complete pipeline checkpoint in {ckpt_root}")
        ckpt = checkpoint.load_stage(ckpt_root, step, rank)
        _check_same_run(cfg, ckpt["config"], ckpt_root)
        start = ckpt["step"]
    end = cfg.steps if stop_at is None else min(cfg.steps, stop_at)
    if start >= end:
        raise ValueError(f"the checkpoint is at step {start}: nothing left to run (up to step {end})")
    if last and not resume:
        write_json(out / "config.json", cfg.to_dict())  # after init: every rank checked the folder

    data = load_dataset(cfg.data, cfg.tokenizer, cfg.vocab_size, cfg.val_fraction, cfg.text_field)
    model_cfg = cfg.model_config(data.vocab_size)
    block = model_cfg.block_size
    torch.manual_seed(cfg.seed)  # every rank builds the same full model: the trainer's init
    stage = Stage(GPT(model_cfg), rank, P).to(device)
    schedule = Schedule(TORCH_SCHEDULES.get(cfg.pipeline, cfg.pipeline), P, M, end, start)

    def batch(n: int):
        x, y = data.batch(n, cfg.batch_size, block, cfg.seed)
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    tokens_per_update = M * cfg.batch_size * block
    loop = {"window": [0.0, 0], "train_loss": None, "metrics_bytes": 0, "train_time": 0.0}
    metrics = None
    if last:
        out.mkdir(parents=True, exist_ok=True)
        if ckpt is not None:
            loop.update(ckpt["loop"])
        path = out / "metrics.jsonl"
        metrics = open(path, "r+b" if ckpt is not None and path.is_file() else "wb")
        metrics.truncate(loop["metrics_bytes"])  # drop lines logged after the checkpoint
        metrics.seek(loop["metrics_bytes"])
    clock = {"t0": 0.0}
    bar = _progress(cfg, start) if last else None

    def on_update(k: int, loss: float | None) -> None:
        step = k + 1
        if last:
            loop["window"][0] += loss
            loop["window"][1] += 1
            if step % cfg.log_every == 0 or step == end:
                rec = {"step": step, "tokens": step * tokens_per_update, "lr": ex.opt.param_groups[0]["lr"],
                       "train_loss": loop["window"][0] / loop["window"][1],
                       "time": loop["train_time"] + time.perf_counter() - clock["t0"]}
                loop["train_loss"], loop["window"] = rec["train_loss"], [0.0, 0]
                metrics.write((json.dumps(rec) + "\n").encode())
                metrics.flush()
                loop["metrics_bytes"] = metrics.tell()
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}")
        if (cfg.ckpt_every and step % cfg.ckpt_every == 0) or step == end:
            state = {"config": cfg.to_dict(), "step": step, "stage": rank, "executor": ex.state_dict(),
                     "rng": torch.get_rng_state()}
            if last:
                loop_now = {**loop, "train_time": loop["train_time"] + time.perf_counter() - clock["t0"]}
                state["loop"] = loop_now
            checkpoint.save_stage(ckpt_root, step, rank, state)

    shape = (cfg.batch_size, block, model_cfg.d_model)
    extra = {"torch_schedule": cfg.pipeline} if cfg.pipeline in TORCH_SCHEDULES else {}
    ex = (TorchScheduleExecutor if extra else StageExecutor)(
        stage, schedule, P2P(shape, torch.float32, device), **extra,
        make_optimizer=optimizer_factory(cfg), lr_lambda=lambda k: lr_factor(k, cfg), batch=batch,
        amp=lambda: autocast(device), on_update=on_update,
        seed_for=(lambda n: cfg.seed * 1_000_003 + n * 7919 + rank) if model_cfg.dropout > 0 else None,
        sync_timing=device.type == "cuda",
    )
    if ckpt is not None:
        ex.load_state_dict(ckpt["executor"])
        torch.set_rng_state(ckpt["rng"])
    del ckpt

    dist.barrier()  # every rank connected (and NCCL initialised) before the clock starts
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    cpu0, busy0 = time.process_time(), _machine_busy_seconds()
    clock["t0"] = time.perf_counter()
    ex.run()
    wall = time.perf_counter() - clock["t0"]
    cpu1, busy1 = time.process_time(), _machine_busy_seconds()
    train_time = loop["train_time"] + wall
    if bar is not None:
        bar.close()
    val = [(x.to(device), y.to(device)) for x, y in data.val_batches(cfg.eval_batches, cfg.batch_size, block)]
    val_loss = ex.evaluate(val)

    model_dir = out / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    save_torch(ex.newest.state_dict(), model_dir / f"stage_{rank}.pt")
    info = {
        "rank": rank, "events": [e.__dict__ for e in ex.events], "memory": ex.memory(),
        "cuda_peak_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "max_in_flight": ex.max_in_flight, "slots": len(ex.slots), "cpu_s": cpu1 - cpu0, "wall_s": wall,
        "machine_busy_s": None if busy0 is None else busy1 - busy0,
        "params": sum(p.numel() for p in stage.parameters()),
    }
    gathered = [None] * P if last else None
    dist.gather_object(info, gathered, dst=P - 1)
    summary = None
    if last:
        metrics.close()
        summary = _finish(cfg, out, gathered, start, end, train_time, val_loss, loop, tokens_per_update, str(device))
    dist.barrier()  # the merged model exists before any rank returns
    if own_group:
        dist.destroy_process_group()
    return summary


def _check_same_run(cfg: PipelineConfig, saved: dict, where: Path) -> None:
    now = cfg.to_dict()
    diff = [f"{k}={now.get(k)!r} vs {saved.get(k)!r}" for k in now
            if k not in RESUMABLE_CHANGES and k != "timeout" and now.get(k) != saved.get(k)]
    if diff:
        raise ValueError(f"the checkpoint in {where} is from another config: {'; '.join(diff)}")


def _progress(cfg: PipelineConfig, start: int):
    from tqdm.auto import tqdm

    return tqdm(total=cfg.steps, initial=start, disable=None if cfg.progress is None else not cfg.progress,
                desc=f"{cfg.pipeline} P={cfg.stages} {cfg.optimizer}", unit="step", dynamic_ncols=True)


def _machine_busy_seconds() -> float | None:
    """CPU seconds all processes on this machine have used (Linux ``/proc/stat``), else ``None``."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    ticks = [int(v) for v in fields]
    busy = sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)  # all but idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def _foreign_cpu(ranks: list[dict]) -> float | None:
    """Cores that other processes kept busy while the ranks trained (a noisy-run indicator)."""
    busy = [r["machine_busy_s"] for r in ranks]
    if any(b is None for b in busy):
        return None
    wall = max(r["wall_s"] for r in ranks)
    return max(0.0, (max(busy) - sum(r["cpu_s"] for r in ranks)) / wall) if wall > 0 else None


def _finish(cfg, out, gathered, start, end, train_time, val_loss, loop, tokens_per_update, device) -> dict:
    """Last stage: merge the model, write timeline, figure and summary."""
    P = cfg.stages
    model_dir = out / "model"
    merged = {}
    for s in range(P):
        merged.update(torch.load(model_dir / f"stage_{s}.pt", map_location="cpu", weights_only=True))
    save_torch(merged, out / "model.pt")  # a GPT state dict (untied)
    for s in range(P):
        (model_dir / f"stage_{s}.pt").unlink()
    model_dir.rmdir()

    ranks = sorted(gathered, key=lambda g: g["rank"])
    events = [[Event(**e) for e in g["events"]] for g in ranks]
    timeline = Timeline(events)
    write_json(out / "timeline.json", {"stages": P, "events": timeline.to_list()})
    coarse = cfg.pipeline in TORCH_SCHEDULES  # one event per batch: no per-action picture
    if not coarse:  # the first few batches are enough to see the schedule
        head = Timeline([[e for e in evs if (e.n if e.op == "U" else e.n // cfg.microbatches) < start + 6]
                         for evs in events])
        fig = plot_timeline(head, title=f"{cfg.pipeline}, P={P}, M={cfg.microbatches} (measured)",
                            microbatches=cfg.microbatches)
        fig.savefig(out / "timeline.png", dpi=120)

    steps_run = end - start
    try:
        steady = timeline.steady_state(skip=1)
    except ValueError:  # too short a run for a window away from warm-up and cool-down
        steady = {"seconds_per_batch": train_time / steps_run, "idle_fraction": None, "bubble": None}
    if coarse:
        steady["idle_fraction"] = steady["bubble"] = None
    tokens = end * tokens_per_update
    summary = {
        "status": "finished" if end == cfg.steps else "stopped",
        "val_loss": val_loss, "train_loss": loop["train_loss"], "steps": end,
        "tokens": tokens, "tokens_per_s": steps_run * tokens_per_update / max(train_time, 1e-9),
        "train_time_s": train_time, "optimizer": cfg.optimizer, "mode": cfg.mode, "correction": cfg.correction,
        "delay": cfg.delay, "schedule": cfg.pipeline, "stages": P, "microbatches": cfg.microbatches,
        "seconds_per_batch": steady["seconds_per_batch"], "bubble": steady["bubble"],
        "idle_fraction": steady["idle_fraction"], "lr": cfg.resolved_lr(), "momentum": cfg.momentum,
        "seed": cfg.seed, "preset": cfg.preset, "params": sum(g["params"] for g in gathered), "device": device,
        "backend": dist.get_backend(), "resumed_from": start or None,
        "memory_bytes": [g["memory"] for g in ranks],
        "cuda_peak_bytes": [g["cuda_peak_bytes"] for g in ranks] if device.startswith("cuda") else None,
        "max_in_flight": [g["max_in_flight"] for g in ranks],
        "foreign_cpu_cores": _foreign_cpu(ranks), "cpu_cores": os.cpu_count(),
    }
    if summary["status"] == "finished":
        write_json(out / "summary.json", summary)
    return summary
