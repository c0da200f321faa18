"""One rank of the pipeline engine, and the two ways to start a run's ranks.

Each rank runs :func:`run_rank`: stage ``s = r % P`` of data-parallel replica ``d = r // P``
(:mod:`delaylab.llm.distributed.mesh`), on the same start as the simulator
(:class:`~delaylab.llm.run.setup.Setup`) and with the stage's interpreter of its schedule
(:class:`~delaylab.llm.pipeline.executor.StageExecutor`). :func:`train_pipeline` starts the ``P x D``
ranks of one run through torch's elastic launcher, :func:`run_jobs` several runs back to back in one
start-up (tests, benchmarks); under ``torchrun``, ``delaylab llm pipeline`` runs the rank it is.

Failure handling: the process group's timeout is ``timeout`` (60 s by default, not torch's 30
minutes). A rank whose peer dies sees the broken connection at its next message and ends with one
line naming the rank that failed first (:mod:`delaylab.llm.distributed.launch`); its neighbours then
do the same, so the whole pipeline ends within seconds.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from delaylab._io import save_torch, write_json
from delaylab.errors import ConfigError, Preempted
from delaylab.llm import checkpoint, mfu
from delaylab.llm.checkpoint import rng_state, set_rng_state
from delaylab.llm.config import Config, lr_factor
from delaylab.llm.distributed.launch import launch
from delaylab.llm.distributed.preempt import StopGate, preemptible
from delaylab.llm.run.folder import TrainFolder, summary_base
from delaylab.llm.model import autocast, autocast_dtype, compile_blocks
from delaylab.llm.pipeline.executor import StageExecutor, TorchScheduleExecutor
from delaylab.llm.pipeline.p2p import P2P
from delaylab.llm.pipeline.schedules import Schedule
from delaylab.llm.pipeline.stages import Stage, optimizer_factory
from delaylab.llm.pipeline.timeline import Event, Timeline, plot_timeline
from delaylab.llm.run.setup import (Setup, check_folder, checkpoint_at, claim_folder, load_data, logs_at, open_run,
                                    resolve)


@preemptible
def run_rank(cfg: Config, out: str | os.PathLike, resume: bool = False,
             stop_at: int | None = None) -> dict | None:
    """Run this process's stage of ``cfg`` (its rank from torchrun's environment variables).

    ``resume``: continue from the newest complete checkpoint in ``out/ckpt``. ``stop_at=K``: end
    after update ``K`` with a checkpoint, as an interrupted run would (the LR schedule still spans
    ``steps``). Returns the summary on the writer (the last stage of replica 0), ``None`` elsewhere.
    """
    setup = Setup(cfg, "pipeline")
    cfg, mesh, device, out = setup.cfg, setup.mesh, setup.device, Path(out)
    P, M = cfg.parallel.stages, cfg.data.grad_accum
    writer = mesh.s == P - 1 and mesh.d == 0  # the one rank that writes the run folder
    run, ckpts, part = open_run(setup, out, writer=writer, resume=resume)
    start = part["step"] if part is not None else 0
    end = cfg.run.steps if stop_at is None else min(cfg.run.steps, stop_at)
    if start >= end:
        raise ConfigError(f"the checkpoint is at step {start}: nothing left to run (up to step {end})")
    stage = Stage(setup.seeded_model(), mesh.s, P).to(device=device, dtype=cfg.torch_dtype())
    gate = StopGate(start)  # a signal: the ranks agree on the update to stop after
    after = _AfterUpdate(setup, run, ckpts, end, gate)
    ex = _executor(setup, stage, Schedule(cfg.parallel.schedule.removeprefix("torch-"), P, M, end, start), after,
                   gate)
    if cfg.run.compile:
        for slot in ex.slots:  # each weight version's copy of the stage (copies made before compiling)
            compile_blocks(slot)
    if part is not None:
        ex.load_state_dict(part["executor"])
        set_rng_state(part["rng"], device)
    run.open(part["loop"] if part is not None else None, initial=start, desc=f"{cfg.parallel.schedule} P={P}"
             f"{f' D={mesh.D}' if mesh.D > 1 else ''} {cfg.optim.optimizer}")
    del part

    dist.barrier()  # every rank connected (and NCCL initialised) before the clock starts
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    usage = _Usage()
    after.t0 = time.perf_counter()
    try:
        ex.run()
        if gate.stop is not None and gate.stop < end:  # stopped: the state after update K-1 is the step-K part
            after.checkpoint(ex, gate.stop)
    finally:
        run.close()
    if gate.stop is not None and gate.stop < end:
        dist.barrier()  # every stage's part is in place before any rank leaves
        raise Preempted(f"{gate.cause()}: stopped after update {gate.stop} (a checkpoint in "
                        f"{checkpoint.step_dir(ckpts.root, gate.stop)}; --resume {out} continues)")
    wall = time.perf_counter() - after.t0
    val = [setup.rows(x, y) for x, y in setup.data.val_batches(cfg.run.eval_batches, cfg.data.batch_size,
                                                                setup.model_cfg.block_size)]
    val_loss = ex.evaluate(val)
    if mesh.d == 0:  # replica 0's stages hand the model to the writer (every replica holds the same)
        (out / "model").mkdir(parents=True, exist_ok=True)
        save_torch(ex.newest.state_dict(), out / "model" / f"stage_{mesh.s}.pt")
    gathered = [None] * (P * mesh.D) if writer else None
    dist.gather_object(usage.info(setup, ex, stage, wall), gathered, dst=int(mesh.device_mesh.mesh[0, -1]))
    summary = None
    if writer:
        summary = _finish(setup, run, gathered, start, end, run.state["train_time"] + wall, val_loss)
    dist.barrier()  # the merged model exists before any rank returns
    return summary


class _AfterUpdate:
    """What a rank does after each update of its stage: the writer's metrics line, and the checkpoint
    (the stage's part, written at its own update; ``t0``: when the loop started)."""

    def __init__(self, setup: Setup, run: TrainFolder, ckpts, end: int, gate: StopGate):
        self.setup, self.run, self.ckpts, self.end, self.gate, self.t0 = setup, run, ckpts, end, gate, 0.0
        self.saved: int | None = None

    def __call__(self, ex: StageExecutor, k: int, loss: float | None) -> None:
        cfg, run, step = self.setup.cfg, self.run, k + 1
        if run.writer:
            run.add_loss(loss)
            run.advance()
            if logs_at(step, cfg):
                run.record(step, tokens=self.setup.tokens(step), lr=ex.opt.param_groups[0]["lr"],
                           time=run.state["train_time"] + time.perf_counter() - self.t0)
        if checkpoint_at(step, min(self.end, self.gate.stop or self.end), cfg):  # a stop at K: its step too
            self.checkpoint(ex, step)

    def checkpoint(self, ex: StageExecutor, step: int) -> None:
        """The stage's part of ``step`` (once), good as soon as written: the pipeline stops before a
        diverged update."""
        if self.saved == step:
            return
        elapsed = time.perf_counter() - self.t0
        self.ckpts.save(step, {"config": self.setup.cfg.to_dict(), "executor": ex.state_dict(),
                               "rng": rng_state(self.setup.device),
                               "loop": self.run.loop_state(elapsed) if self.run.writer else None})
        self.ckpts.commit()
        self.saved = step


def wire_dtype(cfg: Config, device: torch.device) -> torch.dtype:
    """The dtype of the activations and gradients between stages: under bf16 autocast (CUDA, a
    float32 model) bf16, what the products that make them compute in, at half float32's bytes;
    the receiving stage computes on in the model's dtype. Otherwise the model's dtype (on the CPU
    the pipeline then equals the simulator bit for bit)."""
    amp = autocast_dtype(device)
    return amp if amp is not None and cfg.torch_dtype() == torch.float32 else cfg.torch_dtype()


def _executor(setup: Setup, stage: Stage, schedule: Schedule, on_update, gate=None) -> StageExecutor:
    cfg, mesh, device, d = setup.cfg, setup.mesh, setup.device, setup.cfg.data
    block, seed, rank = setup.model_cfg.block_size, cfg.run.seed, mesh.rank
    shape = (d.batch_size // mesh.D, block, setup.model_cfg.d_model)
    torch_runtime = cfg.parallel.schedule.startswith("torch-")
    extra = {"torch_schedule": cfg.parallel.schedule} if torch_runtime else {}
    return (TorchScheduleExecutor if torch_runtime else StageExecutor)(
        stage, schedule, P2P(shape, wire_dtype(cfg, device), device, group=mesh.pp_group, ranks=mesh.stage_ranks),
        **extra,
        make_optimizer=optimizer_factory(cfg), lr_lambda=lambda k: lr_factor(k, cfg),
        batch=lambda n: setup.rows(*setup.data.batch(n, d.batch_size, block, seed)),  # (seed, n) alone
        amp=lambda: autocast(device), on_update=on_update,
        seed_for=(lambda n: seed * 1_000_003 + n * 7919 + rank) if setup.model_cfg.dropout > 0 else None,
        sync_timing="step" if device.type == "cuda" else False,  # one fence per update (issue 39)
        # The tied matrix lives on the first and the last stage; their gradients meet before each
        # update (Megatron-LM's embedding group), in a group per replica.
        tied_group=mesh.tied_group if stage.first or stage.last else None,
        dp_group=mesh.dp_group if mesh.D > 1 else None, gate=gate,
    )


class _Usage:
    """CPU seconds of this rank and of the whole machine since the loop started."""

    def __init__(self):
        self.cpu0, self.busy0 = time.process_time(), machine_busy_seconds()

    def info(self, setup: Setup, ex: StageExecutor, stage: Stage, wall: float) -> dict:
        """What the writer gathers from every rank for the summary."""
        busy, device, mesh = machine_busy_seconds(), setup.device, setup.mesh
        return {
            "rank": mesh.rank, "stage": mesh.s, "replica": mesh.d, "digest": state_digest(ex.state_dict()),
            "events": [e.__dict__ for e in ex.events], "memory": ex.memory(),
            "corrector_bytes": ex.opt.corrector_bytes() if hasattr(ex.opt, "corrector_bytes") else 0,
            "cuda_peak_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
            "max_in_flight": ex.max_in_flight, "slots": len(ex.slots), "cpu_s": time.process_time() - self.cpu0,
            "wall_s": wall, "machine_busy_s": None if self.busy0 is None else busy - self.busy0,
            "params": sum(p.numel() for p in stage.parameters()),
        }


def _ranks(jobs: list[tuple[dict, str, bool, int | None]]) -> list[dict | None]:
    results = []
    for c, out, resume, stop in jobs:
        try:
            results.append(run_rank(Config.from_dict(c), out, resume, stop))
        except Preempted as err:  # every rank stops at the same update; the later jobs wait
            results.append({"status": "preempted", "message": str(err)})
            break
    return results


def _launch(jobs: list[tuple[Config, str | os.PathLike, bool, int | None]]) -> list[dict]:
    """Check every job's folder and data here, before any process starts; the writer's summaries."""
    P, D = jobs[0][0].parallel.stages, jobs[0][0].parallel.dp
    for cfg, out, resume, _ in jobs:
        check_folder(cfg, out, resume, stages=P)
        load_data(cfg)  # tokenized (and cached) once here, not in every rank
        claim_folder(cfg, out, resume, stages=P)  # config.json before any rank starts
    specs = [(cfg.to_dict(), str(out), resume, stop) for cfg, out, resume, stop in jobs]
    summaries = launch(_ranks, (specs,), stages=P, dp=D, what="pipeline")[P - 1]  # the last stage of replica 0
    if summaries and summaries[-1]["status"] == "preempted":
        raise Preempted(summaries[-1]["message"])
    return summaries


def run_jobs(jobs: list[tuple[Config, str | os.PathLike]]) -> list[dict]:
    """Run several pipeline runs back to back in one set of ranks (one start-up for all).

    Every job needs the same number of stages and replicas; returns their summaries in order.
    """
    jobs = [(resolve(cfg, "pipeline"), out) for cfg, out in jobs]
    shapes = {(cfg.parallel.stages, cfg.parallel.dp) for cfg, _ in jobs}
    if len(shapes) > 1:
        raise ConfigError(f"run_jobs needs one (stages, dp) for all jobs, got {sorted(shapes)}")
    return _launch([(cfg, out, False, None) for cfg, out in jobs]) if jobs else []


def train_pipeline(cfg: Config, out: str | os.PathLike, *, resume: bool = False,
                   stop_at: int | None = None) -> dict:
    """Spawn one process per stage and replica, run ``cfg``, return the summary (also in ``out/summary.json``).

    Bad configurations raise :class:`ConfigError` here, before any process starts; a failed rank
    raises :class:`~delaylab.llm.distributed.launch.RunFailed` naming it. ``resume`` and ``stop_at``:
    see :func:`run_rank`.
    """
    cfg = resolve(cfg, "pipeline")
    if stop_at is not None and stop_at < 1:
        raise ConfigError(f"stop_at must be >= 1, got {stop_at}")
    if resume:
        done = TrainFolder(cfg, out).finished_run()
        if done is not None:  # nothing to run: no rank is started
            return done
    return _launch([(cfg, out, resume, stop_at)])[0]


def machine_busy_seconds() -> float | None:
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


def _finish(setup: Setup, run: TrainFolder, gathered, start, end, train_time, val_loss) -> dict:
    """The writer (last stage of replica 0): merge the model, write timeline, figure and summary."""
    cfg, device, out = setup.cfg, str(setup.device), run.out
    P, M, D = cfg.parallel.stages, cfg.data.grad_accum, cfg.parallel.dp
    model_dir = out / "model"
    merged = {}
    for s in range(P):
        merged.update(torch.load(model_dir / f"stage_{s}.pt", map_location="cpu", weights_only=True))
    save_torch(merged, out / "model.pt")  # a GPT state dict
    for s in range(P):
        (model_dir / f"stage_{s}.pt").unlink()
    model_dir.rmdir()

    everyone = sorted(gathered, key=lambda g: g["rank"])
    ranks = [g for g in everyone if g["replica"] == 0]  # one per stage, in stage order
    events = [[Event(**e) for e in g["events"]] for g in ranks]
    timeline = Timeline(events)
    write_json(out / "timeline.json", {"stages": P, "events": timeline.to_list()})
    coarse = cfg.parallel.schedule.startswith("torch-")  # one event per batch: no per-action picture
    if not coarse:  # the first few batches are enough to see the schedule
        head = Timeline([[e for e in evs if (e.n if e.op == "U" else e.n // M) < start + 6] for evs in events])
        fig = plot_timeline(head, title=f"{cfg.parallel.schedule}, P={P}, M={M} (measured)", microbatches=M)
        fig.savefig(out / "timeline.png", dpi=120)

    steps_run = end - start
    try:
        steady = timeline.steady_state(skip=1)
    except ValueError:  # too short a run for a window away from warm-up and cool-down
        steady = {"seconds_per_batch": train_time / steps_run, "idle_fraction": None, "bubble": None}
    if coarse:
        steady["idle_fraction"] = steady["bubble"] = None
    tokens = setup.tokens(end)
    # MFU from the steady state's time per batch (fenced on CUDA: the executor synchronizes its timings)
    flops, peak = mfu.flops_per_token(setup.model_cfg), mfu.peak_tflops(setup.device, cfg.run.peak_tflops)
    steady_rate = setup.tokens(1) / steady["seconds_per_batch"] if steady["seconds_per_batch"] else None
    return run.finish({
        "status": "finished" if end == cfg.run.steps else "stopped",
        "val_loss": val_loss, "train_loss": run.state["train_loss"], "steps": end,
        "tokens": tokens, "tokens_per_s": setup.tokens(steps_run) / max(train_time, 1e-9),
        "train_time_s": train_time, **summary_base(cfg), "engine": "pipeline",
        "seconds_per_batch": steady["seconds_per_batch"], "bubble": steady["bubble"],
        "flops_per_token": flops, "peak_tflops": peak, "mfu": mfu.mfu(steady_rate, flops, P * D, peak),
        "idle_fraction": steady["idle_fraction"], "params": sum(g["params"] for g in ranks), "device": device,
        "backend": dist.get_backend(), "resumed_from": start or None,
        "memory_bytes": [g["memory"] for g in ranks],
        "corrector_bytes": [g["corrector_bytes"] for g in ranks],  # per stage: EF's buffer
        "cuda_peak_bytes": [g["cuda_peak_bytes"] for g in ranks] if device.startswith("cuda") else None,
        "max_in_flight": [g["max_in_flight"] for g in ranks],
        "foreign_cpu_cores": _foreign_cpu(everyone), "cpu_cores": os.cpu_count(),
        "dp": D,
        # Per stage, the digest of each replica's weights and optimizer state: all equal, or the
        # replicas drifted apart (which is why replica 0's checkpoint can stand for all of them).
        "state_digests": [[g["digest"] for g in everyone if g["stage"] == st] for st in range(P)],
    })


def state_digest(obj) -> str:
    """A SHA-256 of a state dict's tensors (bytes) and other values, for comparing replicas."""
    import hashlib

    h = hashlib.sha256()

    def walk(o):
        if isinstance(o, torch.Tensor):
            h.update(f"{o.dtype}{tuple(o.shape)}".encode())
            h.update(o.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(o, dict):
            for k in sorted(o, key=repr):
                h.update(repr(k).encode())
                walk(o[k])
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)
        else:
            h.update(repr(o).encode())

    walk(obj)
    return h.hexdigest()
