"""Single-process GPT training with an exact gradient-delay simulator.

Every run goes through :class:`delaylab.optim.Delayed` (sync is ``delay=0``), so the delay,
EF and DC-ASGD live in one place. The loop is indexed by *updates*: in a delayed phase the
first ``tau`` calls only fill the queue, so ``steps`` updates take ``steps + tau`` calls (and
batches); each param group's LR follows its own update count (the pipeline engine's
per-stage schedulers do the same). Batch ``c`` is the pure function ``dataset.batch(c, ...)``
of the run's seed, which is what makes resume exact: a checkpoint holds the model, the whole
optimizer (inner state, delay queue, EF buffer, LRs), the RNG, the call counter and the losses
of the batches whose gradients are still queued, and nothing else is needed to continue. What a
run reports (tokens, steps, train_loss) is the one accounting of :mod:`delaylab.llm.run.setup`.

With ``parallel.dp = D`` it runs as ``D`` data-parallel replicas (DDP or FSDP2,
:mod:`delaylab.llm.distributed.wrap`): :func:`train_replicas` starts them, or torchrun does.

Python API: ``train(Config.from_dict(...), out) -> summary``; ``Trainer`` for step-level control.
"""

from __future__ import annotations

import math
import os
import time

import torch

from delaylab.errors import ConfigError, Diverged, Preempted, WriteFailed, cannot_write
from delaylab.llm.config import Config, lr_factor
from delaylab.llm.distributed.launch import launch
from delaylab.llm.distributed.preempt import StopGate, preemptible
from delaylab.llm.distributed.world import barrier, mean
from delaylab.llm.distributed.wrap import gradient_sync, wrap
from delaylab.llm.checkpoint import rng_state, set_rng_state
from delaylab.llm.run.folder import summary_base
from delaylab.llm.model import autocast, moe_load
from delaylab.llm.run.setup import Setup, build_delayed_optimizer, check_folder, load_data, logs_at, open_run


class Trainer:
    """Model, data, optimizer and counters of one run. ``step()`` is one call of the loop."""

    def __init__(self, cfg: Config, dataset=None):
        self.setup = s = Setup(cfg, "simulator", dataset)
        self.cfg, self.device, self.data, self.model_cfg = s.cfg, s.device, s.data, s.model_cfg
        self.dp, self.rank = self.cfg.parallel.dp, s.replica
        self.model = s.seeded_model().to(device=self.device, dtype=self.cfg.torch_dtype())
        # What the forward calls: the model, or its DDP / FSDP2 form (the same parameters).
        self.net = wrap(self.model, self.cfg, s.mesh) if s.mesh is not None else self.model
        self.opt = build_delayed_optimizer(self.model, self.cfg)
        for g in self.opt.param_groups:
            g.setdefault("initial_lr", g["lr"])  # the peak lr (the key torch's schedulers use)
        self._set_lrs()
        self.block = self.model_cfg.block_size
        self.tokens_per_update = s.tokens(1)
        self.calls = 0
        # The losses of the batches whose gradients the slowest param group still queues (the
        # group whose updates count as steps), so that each loss is reported when it is applied.
        self._slowest = max(range(len(self.opt.delays)), key=lambda g: self.opt.delays[g])
        self.waiting: list[float] = []
        self.applied_loss: float | None = None  # the loss of the batch whose gradient the last call applied
        self.val = self.data.val_batches(self.cfg.run.eval_batches, self.cfg.data.batch_size, self.block)

    @property
    def updates(self) -> int:
        return self.opt.num_updates

    def step(self) -> float:
        """Forward/backward on batch ``calls`` at the current weights, then one ``opt.step()``.

        Returns the batch's loss; raises :class:`Diverged` (before stepping) if it is not finite.
        """
        M, B, seed, total = self.cfg.data.grad_accum, self.cfg.data.batch_size, self.cfg.run.seed, 0.0
        with self.opt.predicted_weights():  # weight prediction / look-ahead: shifted, then restored
            for j in range(M):
                x, y = self.setup.rows(*self.data.batch(self.calls * M + j, B, self.block, seed))
                # replicas reduce their gradients once per call, on the last microbatch
                with gradient_sync(self.net, j == M - 1):
                    with autocast(self.device):
                        _, loss = self.net(x, y)
                    loss = loss / M
                    loss.backward()
                total = total + loss.detach()
        total = float(self._mean(total, "averaging the loss"))  # one sync per call; every replica agrees
        if not math.isfinite(total):
            raise Diverged(f"loss is {total} at update {self.updates} (call {self.calls})")
        g, before = self._slowest, self.opt.group_updates[self._slowest]
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.calls += 1
        self._set_lrs()
        # The queue applied its oldest gradient (or, undelayed, this one) and dropped any older.
        self.waiting.append(total)
        queued = self.opt.queue.queued[g]
        self.applied_loss = self.waiting[-queued - 1] if self.opt.group_updates[g] > before else None
        self.waiting = self.waiting[len(self.waiting) - queued:]
        return total

    def _mean(self, value: torch.Tensor, what: str) -> torch.Tensor:
        return value if self.dp == 1 else mean(value, self.setup.mesh.dp_group, what)

    def _set_lrs(self) -> None:
        """Each param group's lr for its next update, indexed by that group's own update count.

        With one delay all groups agree (update k gets ``lr_factor(k)``); with per-stage delays a
        stage's k-th update gets ``lr_factor(k)`` too, as each stage's own scheduler does in the
        pipeline engine, rather than the factor of the call it happens on.
        """
        for g, k in zip(self.opt.param_groups, self.opt.group_updates):
            g["lr"] = g["initial_lr"] * lr_factor(k, self.cfg)

    def weights_finite(self) -> bool:
        """Whether every weight is finite, on every replica (FSDP2 holds shards)."""
        local = all(torch.isfinite(getattr(p, "_local_tensor", p)).all() for p in self.model.parameters())
        flag = torch.tensor(float(local), device=self.device)
        return bool(self._mean(flag, "checking the weights") == 1.0)

    @torch.no_grad()
    def evaluate(self) -> float:
        self.model.eval()
        losses = []
        for x, y in self.val:
            with autocast(self.device):
                losses.append(self.net(*self.setup.rows(x, y))[1].item())
        self.model.train()
        total = torch.tensor(sum(losses) / len(losses), dtype=torch.float64, device=self.device)
        return float(self._mean(total, "averaging the validation loss"))

    def state_dict(self) -> dict:
        return {"config": self.cfg.to_dict(), "model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                "calls": self.calls, "waiting": list(self.waiting), "rng": rng_state(self.device)}

    def load_state_dict(self, sd: dict) -> None:
        try:
            self.model.load_state_dict(sd["model"])
            self.opt.load_state_dict(sd["optimizer"])
        except (RuntimeError, KeyError) as err:
            raise ConfigError(f"checkpoint does not fit this model/optimizer: {str(err).splitlines()[0]}") from None
        self.calls, self.waiting = sd["calls"], list(sd["waiting"])
        self._set_lrs()
        set_rng_state(sd["rng"], self.device)


@preemptible
def train(cfg: Config, out: str | os.PathLike | None = None, *, resume: bool = False,
          stop_at: int | None = None, dataset=None) -> dict:
    """Run ``cfg`` and return the summary (also written to ``out/summary.json``).

    ``out=None`` keeps everything in memory. ``resume=True`` continues the checkpoint in
    ``out`` (which must come from the same config). ``stop_at=K`` ends after update ``K`` with a
    checkpoint, as an interrupted run would. Raises :class:`Diverged` on a NaN/inf loss.
    """
    trainer = Trainer(cfg, dataset)  # loads the data: bad data fails before anything is written
    cfg, r, steps = trainer.cfg, trainer.cfg.run, trainer.cfg.run.steps
    run, ckpts, part = open_run(trainer.setup, out, writer=trainer.rank == 0, resume=resume)
    if part is not None:
        trainer.load_state_dict(part)
        done = run.finished_summary() if trainer.updates >= steps else None
        if done is not None:
            return done
    end = min(steps, stop_at) if stop_at is not None else steps
    run.open(part["loop"] if part is not None else None, initial=trainer.updates,
             desc=f"{cfg.optim.optimizer} delay {cfg.delay.delay}")
    loop_start, eval_time = time.perf_counter(), 0.0
    gate, saved = StopGate(trainer.updates), None  # a signal: the replicas agree on the update to stop after
    try:
        while trainer.updates < end:
            if not gate(trainer.updates):  # stopped: every update before gate.stop is done
                break
            t0, before = time.perf_counter(), trainer.updates
            try:
                trainer.step()
            except Diverged as err:
                ckpts.discard()
                raise run.diverged(err, trainer.updates, ckpts.latest()) from None
            run.state["train_time"] += time.perf_counter() - t0
            ckpts.commit()  # a finite loss at the weights of the written checkpoint: it is good
            if trainer.applied_loss is not None:
                run.add_loss(trainer.applied_loss)
            k = trainer.updates
            if k == before:  # a queue-fill call
                continue
            run.advance()
            if logs_at(k, cfg):
                values = {"calls": trainer.calls, "tokens": trainer.setup.tokens(k),
                          "lr": trainer.opt.param_groups[0]["lr"], "time": run.state["train_time"],
                          **moe_load(trainer.model)}  # the router's load at the last microbatch ({} if dense)
                if k % r.eval_every == 0 or k == steps:
                    t_eval = time.perf_counter()
                    values["val_loss"] = trainer.evaluate()
                    eval_time += time.perf_counter() - t_eval
                    if not math.isfinite(values["val_loss"]):
                        ckpts.discard()
                        raise run.diverged(f"validation loss is {values['val_loss']} at update {k}", k,
                                           ckpts.latest())
                run.record(k, **values)
            if k == end or (r.ckpt_every and k % r.ckpt_every == 0):
                ckpts.save(k, {**trainer.state_dict(), "loop": run.loop_state()})
                saved = k
        preempted = trainer.updates < end
        if preempted and saved != trainer.updates:
            ckpts.save(trainer.updates, {**trainer.state_dict(), "loop": run.loop_state()})
        # The last checkpoint's weights were checked by the final evaluation or, at a stop, are finite.
        if trainer.weights_finite():
            ckpts.commit()
    except OSError as err:  # a full disk, a file-size limit: the run stops, its last good checkpoint kept
        if isinstance(err, WriteFailed):
            raise
        kept = ckpts.latest()
        raise WriteFailed(f"{cannot_write(run.out, err)}; "
                          + (f"the last good checkpoint {kept} is kept" if kept else "no checkpoint was written"),
                          started=True) from None
    finally:
        run.close()
    if preempted:
        barrier()  # every replica's part is in place before any of them leaves
        where = f"a checkpoint in {ckpts.latest()}; --resume {run.out} continues" if run.out else "no --out: nothing kept"
        raise Preempted(f"{gate.cause()}: stopped after update {trainer.updates} ({where})")
    # Wall time of this session's loop minus validation: every bit of the trainer's own work
    # (logging, checkpoints, the progress bar) counts, unlike in train_time_s.
    loop_time = time.perf_counter() - loop_start - eval_time
    tokens = trainer.setup.tokens(trainer.updates)
    return run.finish({
        "status": "finished" if trainer.updates >= steps else "stopped",
        "val_loss": run.state["val_loss"], "train_loss": run.state["train_loss"], "steps": trainer.updates,
        "calls": trainer.calls, "tokens": tokens, "tokens_per_s": tokens / max(run.state["train_time"], 1e-9),
        "train_time_s": run.state["train_time"], "loop_time_s": loop_time, **summary_base(cfg),
        "engine": "simulator", "params": trainer.model.num_params(), "device": str(trainer.device),
        "corrector_bytes": trainer.opt.corrector_bytes(),  # per replica; the delay queue not counted
    })


def _replicas(jobs: list[tuple[dict, str | None, bool, int | None]]) -> list[dict]:
    summaries = []
    for c, out, resume, stop in jobs:
        try:
            summaries.append(train(Config.from_dict(c), out, resume=resume, stop_at=stop))
        except Diverged as err:  # every replica sees the same mean loss: they all stop here
            summaries.append({"status": "diverged", "message": str(err)})
        except Preempted as err:  # every replica stops at the same update; the later jobs wait
            summaries.append({"status": "preempted", "message": str(err)})
            break
    return summaries


def train_replicas(jobs: list[tuple[Config, str | os.PathLike | None]] | Config, out=None, *,
                   resume: bool = False, stop_at: int | None = None):
    """Start ``parallel.dp`` processes (torch's elastic launcher, as torchrun would) and run
    :func:`train` in each: one config (``train_replicas(cfg, out, resume=..., stop_at=...)``,
    returns replica 0's summary) or several back to back in one start-up (a list of
    ``(cfg, out)``, returns their summaries; every job needs the same D). A failed replica
    raises :class:`~delaylab.llm.distributed.launch.RunFailed` naming it."""
    single = isinstance(jobs, Config)
    jobs = [(jobs, out)] if single else jobs
    jobs = [(cfg.resolved("simulator"), out) for cfg, out in jobs]
    sizes = {cfg.parallel.dp for cfg, _ in jobs}
    if len(sizes) != 1:
        raise ConfigError(f"train_replicas needs one replica count for all jobs, got {sorted(sizes)}")
    for cfg, folder in jobs:  # what a replica would refuse, refused here, once (the config: by resolved)
        load_data(cfg)
        if folder is not None:
            check_folder(cfg, folder, resume, stages=1)
    specs = [(cfg.to_dict(), None if folder is None else str(folder), resume, stop_at) for cfg, folder in jobs]
    summaries = launch(_replicas, (specs,), dp=sizes.pop(), what="data-parallel run")[0]
    if summaries[-1]["status"] == "preempted":
        raise Preempted(summaries[-1]["message"])
    if single and summaries[0]["status"] == "diverged":
        raise Diverged(summaries[0]["message"])
    return summaries[0] if single else summaries
