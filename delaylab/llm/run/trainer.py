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

import contextlib
import math
import os
import time
from dataclasses import dataclass

import torch

from delaylab.errors import ConfigError, Diverged, Preempted, WriteFailed, cannot_write, overflow_is_divergence
from delaylab.llm.config import Config, lr_factor
from delaylab.llm.distributed.launch import launch
from delaylab.llm.distributed.preempt import StopGate, preemptible
from delaylab.llm.distributed.world import barrier, mean
from delaylab.llm.distributed.wrap import gradient_sync, wrap
from delaylab.llm.checkpoint import rng_state, set_rng_state
from delaylab.llm.run.folder import TrainFolder, summary_base
from delaylab.llm import mfu
from delaylab.llm.model import autocast, compile_blocks, eager_blocks, moe_load
from delaylab.llm.run.setup import (Setup, build_delayed_optimizer, checkpoint_at, claim_folder, load_data,
                                    logs_at, open_run, resolve)

WARMUP_UPDATES = 3  # a session's first updates (allocations, compilation) are left out of its tokens/s


@dataclass
class _Call:
    """A call whose loss may still be on its way to the host (the check one call late)."""

    index: int  # the call's number
    updates: int  # updates made before it
    loss: torch.Tensor  # the mean loss: a host copy being filled (CUDA) or the tensor itself
    event: object | None  # the CUDA event after which ``loss`` is filled
    value: float | None = None
    applied: bool | None = None  # whether the call made an update of the slowest group (set after it)
    queued: int = 0  # that group's queued gradients after the call


def _value(call: _Call) -> float:
    """The call's loss on the host: waits for its copy (recorded right after its backward), not for
    anything queued after it."""
    if call.event is not None:
        call.event.synchronize()
    return float(call.loss)


class Trainer:
    """Model, data, optimizer and counters of one run. ``step()`` is one call of the loop."""

    def __init__(self, cfg: Config, dataset=None):
        self.setup = s = Setup(cfg, "simulator", dataset)
        self.cfg, self.device, self.data, self.model_cfg = s.cfg, s.device, s.data, s.model_cfg
        self.dp, self.rank = self.cfg.parallel.dp, s.replica
        self.model = s.seeded_model().to(device=self.device, dtype=self.cfg.torch_dtype())
        if self.cfg.run.compile:
            compile_blocks(self.model)  # before DDP / FSDP2, as torchtitan orders them
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
        self.applied_loss: float | None = None  # the loss of the batch whose gradient the last settled call applied
        self.applied: list[float] = []  # the applied losses settled since take_applied()
        self.inflight: list[_Call] = []  # calls whose loss is not yet checked, oldest first
        self.checked = 0  # calls whose loss is known finite
        self.failed_update: int | None = None  # the update count at the call whose loss was not finite
        self.val = self.data.val_batches(self.cfg.run.eval_batches, self.cfg.data.batch_size, self.block)

    @property
    def updates(self) -> int:
        return self.opt.num_updates

    def step(self, wait: bool = True) -> float | None:
        """Forward/backward on batch ``calls`` at the current weights, then one ``opt.step()``.

        ``wait=True``: returns the batch's loss, and raises :class:`Diverged` before stepping if it
        is not finite. ``wait=False`` (the training loop's hot path): no host sync in the call; its
        loss is copied to the host as it becomes ready and checked at the next call, before that
        call's update, or at :meth:`settle` (so a NaN is found one call late). Returns None.
        """
        M, B, seed, total = self.cfg.data.grad_accum, self.cfg.data.batch_size, self.cfg.run.seed, 0.0
        with self.opt.predicted_weights(), self._overflow(f"call {self.calls}"):
            for j in range(M):  # (weight prediction / look-ahead: shifted, then restored)
                x, y = self.setup.rows(*self.data.batch(self.calls * M + j, B, self.block, seed))
                # replicas reduce their gradients once per call, on the last microbatch
                with gradient_sync(self.net, j == M - 1):
                    with autocast(self.device):
                        _, loss = self.net(x, y)
                    loss = loss / M
                    loss.backward()
                total = total + loss.detach()
        total = self._mean(total, "averaging the loss")  # every replica gets the same value
        call = _Call(self.calls, self.updates, *_to_host(total))
        self.inflight.append(call)
        self.settle(keep=0 if wait else 1)  # the previous call's loss (this one's too with wait)
        g, before = self._slowest, self.opt.group_updates[self._slowest]
        with self._overflow(f"update {self.updates} (call {self.calls})"):
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.calls += 1
        self._set_lrs()
        # The queue applied its oldest gradient (or, undelayed, this one) and dropped any older.
        call.applied, call.queued = self.opt.group_updates[g] > before, self.opt.queue.queued[g]
        self._book()
        return call.value if wait else None

    @contextlib.contextmanager
    def _overflow(self, what: str):
        """A scalar beyond the dtype (an lr of 1e38 in float32) is a divergence at this update."""
        try:
            with overflow_is_divergence(what):
                yield
        except Diverged:
            self.failed_update = self.updates
            raise

    def settle(self, keep: int = 0) -> None:
        """Check the losses of the calls in flight but the newest ``keep``; raises :class:`Diverged`
        at the first that is not finite (:attr:`failed_update`: the update count it was taken at)."""
        for call in self.inflight[:len(self.inflight) - keep]:
            if call.value is None:
                call.value = _value(call)
                if not math.isfinite(call.value):
                    self.failed_update = call.updates
                    raise Diverged(f"loss is {call.value} at update {call.updates} (call {call.index})")
                self.checked = call.index + 1
        self._book()

    def _book(self) -> None:
        """The settled calls, in order: each loss is reported with the update that applies its gradient."""
        while self.inflight and self.inflight[0].value is not None and self.inflight[0].applied is not None:
            call = self.inflight.pop(0)
            self.waiting.append(call.value)
            self.applied_loss = self.waiting[-call.queued - 1] if call.applied else None
            if call.applied:
                self.applied.append(self.applied_loss)
            self.waiting = self.waiting[len(self.waiting) - call.queued:]

    def take_applied(self) -> list[float]:
        """The losses of the applied batches settled since the last call, in order."""
        taken, self.applied = self.applied, []
        return taken

    def synchronize(self) -> None:
        """Wait for the device (a timing fence; a no-op on the CPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _mean(self, value: torch.Tensor, what: str) -> torch.Tensor:
        """``value`` (on the run's device) averaged over the replicas: a collective, no host sync."""
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
        """Whether every weight is finite, on every replica (FSDP2 holds shards): one host sync."""
        local = torch.stack([torch.isfinite(getattr(p, "_local_tensor", p)).all() for p in self.model.parameters()])
        flag = local.all().to(device=self.device, dtype=torch.float32)
        return bool(self._mean(flag, "checking the weights") == 1.0)

    @torch.no_grad()
    def evaluate(self) -> float:
        self.model.eval()
        losses = []
        for x, y in self.val:
            with autocast(self.device), eager_blocks(self.model):  # no second compilation (issue 39)
                losses.append(self.net(*self.setup.rows(x, y))[1])
        self.model.train()
        losses = torch.stack(losses).tolist()  # one host sync for all batches
        total = torch.tensor(sum(losses) / len(losses), dtype=torch.float64, device=self.device)
        return float(self._mean(total, "averaging the validation loss"))

    def state_dict(self) -> dict:
        self.settle()  # every loss of the calls so far is in ``waiting``
        return {"config": self.cfg.to_dict(), "model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                "calls": self.calls, "waiting": list(self.waiting), "rng": rng_state(self.device)}

    def load_state_dict(self, sd: dict) -> None:
        try:
            self.model.load_state_dict(sd["model"])
            self.opt.load_state_dict(sd["optimizer"])
        except (RuntimeError, KeyError) as err:
            raise ConfigError(f"checkpoint does not fit this model/optimizer: {str(err).splitlines()[0]}") from None
        self.calls, self.waiting, self.checked = sd["calls"], list(sd["waiting"]), sd["calls"]
        self.inflight, self.applied = [], []
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
    clock = _SteadyClock(trainer, trainer.updates, end)
    loop_start, eval_time = time.perf_counter(), 0.0
    gate, saved = StopGate(trainer.updates), None  # a signal: the replicas agree on the update to stop after
    # The written checkpoint is good once the loss at its weights is known finite: that is the
    # loss of the call made right after it was written (number ``unchecked``), known one call late.
    unchecked: int | None = None
    try:
        while trainer.updates < end:
            if not gate(trainer.updates):  # stopped: every update before gate.stop is done
                break
            t0, before = time.perf_counter(), trainer.updates
            try:
                trainer.step(wait=False)  # no host sync: the previous call's loss is checked here
                k = trainer.updates
                if k != before and (logs_at(k, cfg) or checkpoint_at(k, end, cfg)):
                    trainer.settle()  # the line's losses, the checkpoint's state: up to this call
            except Diverged as err:
                ckpts.discard()
                raise run.diverged(err, trainer.failed_update, ckpts.latest()) from None
            run.state["train_time"] += time.perf_counter() - t0
            if unchecked is not None and trainer.checked > unchecked:
                ckpts.commit()
                unchecked = None
            for loss in trainer.take_applied():
                run.add_loss(loss)
            if k == before:  # a queue-fill call
                continue
            run.advance()
            clock.after_update(k)
            if logs_at(k, cfg):
                values = {"calls": trainer.calls, "tokens": trainer.setup.tokens(k),
                          "lr": trainer.opt.param_groups[0]["lr"], "time": run.state["train_time"],
                          **moe_load(trainer.model)}  # the router's load at the last microbatch ({} if dense)
                if k % r.eval_every == 0 or k == steps:
                    t_eval = clock.pause()
                    values["val_loss"] = trainer.evaluate()
                    clock.resume(t_eval)
                    eval_time += time.perf_counter() - t_eval
                    if not math.isfinite(values["val_loss"]):
                        ckpts.discard()
                        raise run.diverged(f"validation loss is {values['val_loss']} at update {k}", k,
                                           ckpts.latest())
                run.record(k, **values)
            if checkpoint_at(k, end, cfg):
                t_save = clock.pause()
                ckpts.save(k, {**trainer.state_dict(), "loop": run.loop_state()})
                clock.resume(t_save)
                unchecked, saved = trainer.calls, k
        preempted = trainer.updates < end
        if preempted:  # the step-K part, after the losses of every call made are known finite
            try:
                trainer.settle()
            except Diverged as err:
                ckpts.discard()
                raise run.diverged(err, trainer.failed_update, ckpts.latest()) from None
            for loss in trainer.take_applied():
                run.add_loss(loss)
            if saved != trainer.updates:
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
    timed_updates, timed_s = clock.stop(trainer.updates)
    # Wall time of this session's loop minus validation: every bit of the trainer's own work
    # (logging, checkpoints, the progress bar) counts, unlike in train_time_s.
    loop_time = time.perf_counter() - loop_start - eval_time
    tokens = trainer.setup.tokens(trainer.updates)
    tokens_per_s = trainer.setup.tokens(timed_updates) / timed_s if timed_s else None
    flops, peak = mfu.flops_per_token(trainer.model_cfg), mfu.peak_tflops(trainer.device, r.peak_tflops)
    return run.finish({
        "status": "finished" if trainer.updates >= steps else "stopped",
        "val_loss": run.state["val_loss"], "train_loss": run.state["train_loss"], "steps": trainer.updates,
        "calls": trainer.calls, "tokens": tokens,
        # this session's steady state: fenced, after its first updates, validation and checkpoints left out
        "tokens_per_s": tokens_per_s, "timed_updates": timed_updates,
        "flops_per_token": flops, "peak_tflops": peak, "mfu": mfu.mfu(tokens_per_s, flops, trainer.dp, peak),
        "train_time_s": run.state["train_time"], "loop_time_s": loop_time, **summary_base(cfg),
        "engine": "simulator", "params": trainer.model.num_params(), "device": str(trainer.device),
        "corrector_bytes": trainer.opt.corrector_bytes(),  # per replica; the delay queue not counted
    })


def _to_host(loss: torch.Tensor) -> tuple[torch.Tensor, object | None]:
    """Start copying a CUDA loss to (pinned) host memory and mark when it is there; elsewhere the
    tensor itself."""
    if loss.device.type != "cuda":
        return loss, None
    host = loss.to("cpu", non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


class _SteadyClock:
    """Fenced wall time of a session's updates after its first :data:`WARMUP_UPDATES`, minus the
    pauses (validation, checkpoints): what tokens/s and MFU are computed from."""

    def __init__(self, trainer: Trainer, first: int, end: int):
        self.trainer = trainer
        self.warmup = min(WARMUP_UPDATES, (end - first) // 2)  # a short session still gets a window
        self.start_update = first + self.warmup
        self.t0: float | None = None
        self.paused = 0.0
        self.elapsed: float | None = None
        if self.warmup == 0:
            self._start()

    def _start(self) -> None:
        self.trainer.synchronize()
        self.t0 = time.perf_counter()

    def after_update(self, k: int) -> None:
        if self.t0 is None and k == self.start_update:
            self._start()

    def pause(self) -> float:
        self.trainer.synchronize()
        return time.perf_counter()

    def resume(self, since: float) -> None:
        self.trainer.synchronize()
        if self.t0 is not None:
            self.paused += time.perf_counter() - since

    def stop(self, k: int) -> tuple[int, float | None]:
        """``(updates timed, seconds)``."""
        if self.t0 is None:
            return 0, None
        self.trainer.synchronize()
        return k - self.start_update, time.perf_counter() - self.t0 - self.paused


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
    jobs = [(resolve(cfg, "simulator"), out) for cfg, out in jobs]
    sizes = {cfg.parallel.dp for cfg, _ in jobs}
    if len(sizes) != 1:
        raise ConfigError(f"train_replicas needs one replica count for all jobs, got {sorted(sizes)}")
    if single and resume and out is not None:
        done = TrainFolder(jobs[0][0], out).finished_run()
        if done is not None:  # nothing to run: no replica is started
            return done
    for cfg, folder in jobs:  # what a replica would refuse, refused here, once (the config: by resolved)
        load_data(cfg)
        if folder is not None:
            claim_folder(cfg, folder, resume, stages=1)  # config.json before any replica starts
    specs = [(cfg.to_dict(), None if folder is None else str(folder), resume, stop_at) for cfg, folder in jobs]
    summaries = launch(_replicas, (specs,), dp=sizes.pop(), what="data-parallel run")[0]
    if summaries[-1]["status"] == "preempted":
        raise Preempted(summaries[-1]["message"])
    if single and summaries[0]["status"] == "diverged":
        raise Diverged(summaries[0]["message"])
    return summaries[0] if single else summaries
