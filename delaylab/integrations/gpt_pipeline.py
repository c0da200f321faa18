"""This project's GPT on torch's ``PipelineStage``, under any ``torch.distributed.pipelining``
schedule: ``Schedule1F1B`` (synchronous) or ``Schedule2BW`` / ``SchedulePipeDream`` (this package).

The same configuration as ``delaylab.llm.run.trainer`` (the simulator) and the project's own pipeline
engine: the stage module (:class:`delaylab.llm.pipeline.stages.Stage`, built from the seeded full
model), the data (microbatch ``n`` is ``dataset.batch(n, ...)``), the optimizer (EF as the engine
applies it on a stage: ``Delayed(delay=0, corrections=[ErrorFeedback(lag=tau)])``), the LR of update ``k``
(``lr_factor(k)``) and the loss scaling (``loss / M``, ``scale_grads=False``). What differs is
only whose schedule runs the microbatches, which is what the equivalence tests and the
throughput benchmark compare.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist

from delaylab.llm.config import Config, lr_factor
from delaylab.llm.model import GPT, lm_loss

# How far behind each schedule's gradients are, per stage (the engine's optimizer needs it for EF).
DELAYS = {"1F1B": lambda s, P: 0, "2BW": lambda s, P: 1, "PipeDream": lambda s, P: P - 1 - s}


def schedule_class(name: str):
    from torch.distributed.pipelining import Schedule1F1B

    from delaylab.integrations.pipelining import SCHEDULES

    return {"1F1B": Schedule1F1B, **SCHEDULES}[name]


class StageRun:
    """One rank's stage under ``schedule``: ``batch(b)`` runs batch ``b`` (one ``step()`` and the
    update it allows), ``finish()`` drains the pipe and applies what is left. ``microbatches``:
    call ``step`` with the batch already split, as torchtitan 0.3.0's trainer does
    (``arg_mbs=``, ``kwarg_mbs=``, ``target_mbs=``), instead of ``step(x, target=y)``."""

    def __init__(self, cfg: Config, schedule: str, group=None, microbatches: bool = False):
        from torch.distributed.pipelining import PipelineStage

        from delaylab.llm.pipeline.stages import optimizer_factory
        from delaylab.llm.run.setup import load_data, resolve
        from delaylab.llm.pipeline.stages import Stage

        self.cfg = cfg = resolve(cfg, "pipeline")
        P, M = cfg.parallel.stages, cfg.data.grad_accum
        s = dist.get_rank(group)
        self.data = load_data(cfg)
        model_cfg = cfg.model_config(self.data.vocab_size)
        if model_cfg.tie_embeddings:
            raise ValueError("tied embeddings need a gradient exchange between the first and last stage; "
                             "use tie_embeddings=False")
        torch.manual_seed(cfg.run.seed)  # every rank builds the same full model: the trainer's init
        self.module = Stage(GPT(model_cfg, M), s, P).to(dtype=cfg.torch_dtype())
        self.stage_index, self.P, self.M, self.block = s, P, M, model_cfg.block_size
        self.pipeline = schedule_class(schedule)(
            PipelineStage(self.module, s, P, torch.device("cpu"), group=group), M,
            loss_fn=lambda out, y: lm_loss(out, y) / M, scale_grads=False)
        self.opt = optimizer_factory(cfg)(self.module, DELAYS[schedule](s, P))
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda k: lr_factor(k, cfg))
        self.updates, self.microbatches = 0, microbatches
        self.losses: list[float] = []  # mean loss per batch (last stage)

    def batch(self, b: int) -> None:
        d, M = self.cfg.data, self.M
        xs, ys = zip(*(self.data.batch(n, d.batch_size, self.block, self.cfg.run.seed)
                       for n in range(b * M, (b + 1) * M)))
        losses: list[torch.Tensor] = []
        first, last = self.stage_index == 0, self.stage_index == self.P - 1
        if self.microbatches:
            self.pipeline.step(arg_mbs=[(x,) for x in xs] if first else None, kwarg_mbs=[{}] * M,
                               target_mbs=list(ys) if last else None, losses=losses if last else None,
                               return_outputs=False)
        else:
            self.pipeline.step(*((torch.cat(xs),) if first else ()), target=torch.cat(ys) if last else None,
                               losses=losses if last else None)
        if last:
            self.losses.append(float(sum(loss.detach() for loss in losses)))  # sum of loss / M over the microbatches
        if getattr(self.pipeline, "released", True):  # the synchronous schedule: always
            self._update()

    def finish(self) -> None:
        flush = getattr(self.pipeline, "flush", None)
        while flush is not None and flush():
            self._update()

    def _update(self) -> None:
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.sched.step()  # the LR of the next update: indexed by updates, never by calls
        self.updates += 1


def _rank(jobs: list[tuple[dict, str, str, bool]], timeout: float) -> list[dict]:
    """The body of one rank: every job's stage trained to ``steps`` updates, its weights saved."""
    from delaylab.llm.distributed.world import start
    from delaylab.llm.run.rank import machine_busy_seconds

    torch.set_num_threads(1)
    start(torch.device("cpu"), timeout)
    out = []
    for cfg_dict, schedule, folder, microbatches in jobs:
        run = StageRun(Config.from_dict(cfg_dict), schedule, microbatches=microbatches)
        dist.barrier()
        busy0, cpu0, t0 = machine_busy_seconds(), time.process_time(), time.perf_counter()
        ends = []  # seconds from the start to the end of each batch's step() (and update)
        for b in range(run.cfg.run.steps):
            run.batch(b)
            ends.append(time.perf_counter() - t0)
        run.finish()
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        dist.barrier()
        busy1 = machine_busy_seconds()
        cpus = [None] * dist.get_world_size()
        dist.all_gather_object(cpus, cpu)
        torch.save(run.module.state_dict(), Path(folder) / f"stage_{run.stage_index}.pt")
        out.append({"updates": run.updates, "losses": run.losses, "wall_s": wall, "batch_ends": ends,
                    "cpu_s": cpus, "machine_busy_s": None if busy0 is None else busy1 - busy0})
    return out


def run_torch_schedule(jobs: list[tuple], timeout: float = 120) -> list[dict]:
    """Run ``(config, schedule, folder[, microbatches])`` jobs (one stage count for all) in one set
    of gloo ranks started by torch's elastic launcher; each folder gets ``model.pt`` (the merged GPT
    state dict). Returns the last stage's ``{"updates", "losses", "wall_s", "batch_ends", "cpu_s"
    (every rank's), "machine_busy_s"}`` per job."""
    from delaylab.llm.distributed.launch import launch
    from delaylab.llm.run.setup import load_data, resolve

    jobs = [(resolve(cfg, "pipeline"), name, Path(folder), bool(rest and rest[0])) for cfg, name, folder, *rest in jobs]
    stages = {cfg.parallel.stages for cfg, *_ in jobs}
    if len(stages) != 1:
        raise ValueError(f"one stage count for all jobs, got {sorted(stages)}")
    P = stages.pop()
    for cfg, _, folder, _ in jobs:
        load_data(cfg)  # tokenize once, here
        folder.mkdir(parents=True, exist_ok=True)
    results = launch(_rank, ([(c.to_dict(), n, str(f), m) for c, n, f, m in jobs], timeout), stages=P, dp=1,
                     what="torch pipelining run")
    for _, _, folder, _ in jobs:
        merged = {}
        for s in range(P):
            merged.update(torch.load(folder / f"stage_{s}.pt", map_location="cpu", weights_only=True))
            (folder / f"stage_{s}.pt").unlink()
        torch.save(merged, folder / "model.pt")
    return results[P - 1]
