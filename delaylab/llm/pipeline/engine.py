"""The multi-process engine: the body of one rank.

Each rank runs :func:`run_rank` (``launch.py`` spawns them through torch's elastic launcher;
under ``torchrun``, ``delaylab llm pipeline`` calls it directly). Backend: NCCL when CUDA is
available (one GPU per rank), else gloo. With ``D`` data-parallel replicas the ``P * D`` ranks
sit on a ``(D, P)`` device mesh (``mesh.py``: rank ``r`` is stage ``r % P`` of replica ``r // P``).

Failure handling: the process group's timeout is ``timeout`` (60 s by default, not
torch's 30 minutes). A rank whose peer dies sees the broken connection at its next
message, names the first failed rank (``p2p.blame``) on stderr and exits with code 1;
its neighbours then do the same, so the whole pipeline ends within seconds.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from delaylab._io import save_torch, write_json
from delaylab.errors import ConfigError, MissingFile
from delaylab.llm.config import Config, lr_factor
from delaylab.llm.data import load_dataset
from delaylab.llm.harness import RunFolder, summary_base
from delaylab.llm.model import GPT, autocast
from delaylab.llm.pipeline import checkpoint
from delaylab.llm.pipeline.executor import StageExecutor, TorchScheduleExecutor
from delaylab.llm.pipeline.mesh import build_mesh
from delaylab.llm.pipeline.p2p import P2P, blame
from delaylab.llm.pipeline.schedules import Schedule
from delaylab.llm.pipeline.stages import Stage
from delaylab.llm.pipeline.timeline import Event, Timeline, plot_timeline

FAILURE = "failure.json"  # written by the rank that reported the first failure


def optimizer_factory(cfg: Config):
    """``make(module, tau)``: a stage's optimizer, with EF at the stage's lag ``tau`` if asked."""
    from delaylab.optim import Delayed, build_optimizer
    from delaylab.optim.corrections import for_stage

    hp = cfg.optimizer_kwargs()

    def make(module, tau: int):
        inner = build_optimizer(cfg.optim.optimizer, module, **hp)
        if cfg.delay.correction != "none":
            # The stage's gradients are stale already: its correctors at the stage's lag, no queue.
            return Delayed(inner, delay=0, corrections=for_stage(cfg.delay.correction, tau))
        return inner

    return make


def run_rank(cfg: Config, out: str | os.PathLike, resume: bool = False,
             stop_at: int | None = None) -> dict | None:
    """Run this process's stage (rank = stage, from torchrun's environment variables).

    ``resume``: continue from the newest complete checkpoint in ``out/ckpt``. ``stop_at=K``:
    end after update ``K`` with a checkpoint, as an interrupted run would (the LR schedule
    still spans ``steps``). Returns the summary on the last stage, ``None`` elsewhere. On
    any failure, prints one line naming the rank that failed first and exits with code 1.
    """
    rank = int(os.environ["RANK"])
    try:
        return _run_rank(cfg, Path(out), resume, stop_at, rank)
    except BaseException as err:  # noqa: BLE001 - every failure ends the process the same way
        if isinstance(err, KeyboardInterrupt) or not dist.is_initialized():
            raise
        who, why, ours = blame(rank, err)
        par = cfg.resolved("pipeline").parallel  # it resolved before the process group existed
        where = f"stage {rank % par.stages}" + (f", replica {rank // par.stages}" if par.dp > 1 else "")
        culprit = "it failed" if who == rank else ("a rank failed" if who is None else f"rank {who} failed")
        lead = f"rank {rank} ({where}) stopped: {culprit}"
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


def check_parallel(cfg: Config, world: int) -> None:
    """A world of exactly ``P x D`` ranks (under torchrun or the launcher); one-line error otherwise.
    The rest (D divides the batch, one GPU per rank, no FSDP2) is the config's resolution."""
    P, D = cfg.parallel.stages, cfg.parallel.dp
    if world != P * D:
        raise ConfigError(f"{world} processes for {P} stages x {D} data-parallel replicas: start exactly "
                          f"P x D = {P * D} ranks" + ("" if world % P else f" (or give --dp {world // P})"))


def _run_rank(cfg: Config, out: Path, resume: bool, stop_at: int | None, rank: int) -> dict | None:
    cfg = cfg.resolved("pipeline")
    P, M, steps, D = cfg.parallel.stages, cfg.data.grad_accum, cfg.run.steps, cfg.parallel.dp
    check_parallel(cfg, int(os.environ["WORLD_SIZE"]))
    torch.set_num_threads(cfg.run.threads or 1)
    device = cfg.torch_device(int(os.environ.get("LOCAL_RANK", rank)))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    own_group = not dist.is_initialized()  # run_jobs keeps one group for several runs
    if own_group:
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo", timeout=timedelta(seconds=cfg.parallel.timeout),
            **({"device_id": device} if device.type == "cuda" else {}),
        )
    d = cfg.data
    data = load_dataset(d.data, d.tokenizer, d.vocab_size, d.val_fraction, d.text_field)
    model_cfg = cfg.model_config(data.vocab_size)
    mesh = build_mesh(device.type, D, P, cfg.parallel.timeout, tied=model_cfg.tie_embeddings)
    s, replica = mesh.s, mesh.d  # this rank is stage s of data-parallel replica `replica`
    last = s == P - 1
    lead = replica == 0  # replica 0 saves checkpoints and the model (every replica holds the same state)
    writer = last and lead  # the one rank that writes the run folder
    run = RunFolder(cfg, out, writer=writer, marks=("ckpt",))
    ckpt_root = out / "ckpt"
    start, ckpt = 0, None
    if resume:
        step = checkpoint.latest_complete(ckpt_root, P)
        if step is None:
            raise MissingFile(f"no complete pipeline checkpoint in {ckpt_root}")
        ckpt = checkpoint.load_stage(ckpt_root, step, s)
        run.check_same_run(ckpt["config"], ckpt_root)
        start = ckpt["step"]
    end = steps if stop_at is None else min(steps, stop_at)
    if start >= end:
        raise ConfigError(f"the checkpoint is at step {start}: nothing left to run (up to step {end})")

    block = model_cfg.block_size
    torch.manual_seed(cfg.run.seed)  # every rank builds the same full model: the trainer's init
    stage = Stage(GPT(model_cfg), s, P).to(device=device, dtype=cfg.torch_dtype())
    # The tied matrix lives on the first and the last stage; their gradients meet before each
    # update (Megatron-LM's embedding group), in a group per replica.
    tied = mesh.tied_group if s in (0, P - 1) else None
    schedule = Schedule(cfg.parallel.schedule.removeprefix("torch-"), P, M, end, start)
    rows = slice(replica * d.batch_size // D, (replica + 1) * d.batch_size // D)  # this replica's 1/D

    def batch(n: int):
        x, y = data.batch(n, d.batch_size, block, cfg.run.seed)  # the whole microbatch: (seed, n) alone
        return x[rows].to(device, non_blocking=True), y[rows].to(device, non_blocking=True)

    tokens_per_update = M * d.batch_size * block
    run.open(ckpt.get("loop") if ckpt is not None else None, initial=start,
             desc=f"{cfg.parallel.schedule} P={P}{f' D={D}' if D > 1 else ''} {cfg.optim.optimizer}")
    clock = {"t0": 0.0}

    def on_update(k: int, loss: float | None) -> None:
        step = k + 1
        if writer:
            run.add_loss(loss)
            run.advance()
            if step % cfg.run.log_every == 0 or step == end:
                run.record(step, tokens=step * tokens_per_update, lr=ex.opt.param_groups[0]["lr"],
                           time=run.state["train_time"] + time.perf_counter() - clock["t0"])
        if lead and ((cfg.run.ckpt_every and step % cfg.run.ckpt_every == 0) or step == end):
            state = {"config": cfg.to_dict(), "step": step, "stage": s, "executor": ex.state_dict(),
                     "rng": torch.get_rng_state()}
            if writer:
                state["loop"] = run.loop_state(time.perf_counter() - clock["t0"])
            checkpoint.save_stage(ckpt_root, step, s, state)

    shape = (d.batch_size // D, block, model_cfg.d_model)
    torch_runtime = cfg.parallel.schedule.startswith("torch-")
    extra = {"torch_schedule": cfg.parallel.schedule} if torch_runtime else {}
    ex = (TorchScheduleExecutor if torch_runtime else StageExecutor)(
        stage, schedule, P2P(shape, cfg.torch_dtype(), device, group=mesh.pp_group, ranks=mesh.stage_ranks), **extra,
        make_optimizer=optimizer_factory(cfg), lr_lambda=lambda k: lr_factor(k, cfg), batch=batch,
        amp=lambda: autocast(device), on_update=on_update,
        seed_for=(lambda n: cfg.run.seed * 1_000_003 + n * 7919 + rank) if model_cfg.dropout > 0 else None,
        sync_timing=device.type == "cuda", tied_group=tied, dp_group=mesh.dp_group if D > 1 else None,
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
    try:
        ex.run()
    finally:
        run.close()
    wall = time.perf_counter() - clock["t0"]
    cpu1, busy1 = time.process_time(), _machine_busy_seconds()
    train_time = run.state["train_time"] + wall
    val = [(x[rows].to(device), y[rows].to(device))
           for x, y in data.val_batches(cfg.run.eval_batches, d.batch_size, block)]
    val_loss = ex.evaluate(val)

    model_dir = out / "model"
    if lead:
        model_dir.mkdir(parents=True, exist_ok=True)
        save_torch(ex.newest.state_dict(), model_dir / f"stage_{s}.pt")
    info = {
        "rank": rank, "stage": s, "replica": replica, "digest": state_digest(ex.state_dict()),
        "events": [e.__dict__ for e in ex.events], "memory": ex.memory(),
        "corrector_bytes": ex.opt.corrector_bytes() if hasattr(ex.opt, "corrector_bytes") else 0,
        "cuda_peak_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "max_in_flight": ex.max_in_flight, "slots": len(ex.slots), "cpu_s": cpu1 - cpu0, "wall_s": wall,
        "machine_busy_s": None if busy0 is None else busy1 - busy0,
        "params": sum(p.numel() for p in stage.parameters()),
    }
    gathered = [None] * (P * D) if writer else None
    dist.gather_object(info, gathered, dst=int(mesh.device_mesh.mesh[0, -1]))  # to the writer
    summary = None
    if writer:
        summary = _finish(cfg, run, gathered, start, end, train_time, val_loss, tokens_per_update, str(device))
    dist.barrier()  # the merged model exists before any rank returns
    if own_group:
        dist.destroy_process_group()
    return summary


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


def _finish(cfg: Config, run: RunFolder, gathered, start, end, train_time, val_loss, tokens_per_update,
            device) -> dict:
    """The writer (last stage of replica 0): merge the model, write timeline, figure and summary."""
    P, M, D, out = cfg.parallel.stages, cfg.data.grad_accum, cfg.parallel.dp, run.out
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
    tokens = end * tokens_per_update
    return run.finish({
        "status": "finished" if end == cfg.run.steps else "stopped",
        "val_loss": val_loss, "train_loss": run.state["train_loss"], "steps": end,
        "tokens": tokens, "tokens_per_s": steps_run * tokens_per_update / max(train_time, 1e-9),
        "train_time_s": train_time, **summary_base(cfg), "engine": "pipeline",
        "seconds_per_batch": steady["seconds_per_batch"], "bubble": steady["bubble"],
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
