"""Single-process GPT training with an exact gradient-delay simulator.

Every run goes through :class:`delaylab.optim.Delayed` (sync is ``delay=0``), so the delay,
EF and DC-ASGD live in one place. The loop is indexed by *updates*: in a delayed phase the
first ``tau`` calls only fill the queue, so ``steps`` updates take ``steps + tau`` calls (and
batches); each param group's LR follows its own update count (the pipeline engine's
per-stage schedulers do the same). Batch ``c`` is the pure function ``dataset.batch(c, ...)``
of the run's seed, which is what makes resume exact: a checkpoint holds the model, the whole
optimizer (inner state, delay queue, EF buffer, LRs), the RNG and the call counter, and
nothing else is needed to continue. The run folder (guard, metrics, summary, divergence stop)
is :class:`delaylab.llm.harness.RunFolder`'s.

Python API: ``train(Config.from_dict(...), out) -> summary``; ``Trainer`` for step-level control.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path

import torch

from delaylab._io import save_torch
from delaylab.errors import ConfigError, Diverged, MissingFile
from delaylab.llm import parallel
from delaylab.llm.config import Config, lr_factor
from delaylab.llm.data import load_dataset
from delaylab.llm.harness import RunFolder, summary_base
from delaylab.llm.model import GPT, autocast

CHECKPOINT = "ckpt.pt"  # one process
CHECKPOINT_DIR = "ckpt"  # data-parallel replicas: a torch.distributed.checkpoint folder


def build_delayed_optimizer(model: GPT, cfg: Config):
    """``Delayed(build_optimizer(...))`` for the config's delay; one inner optimizer per stage
    (with that stage's tau on each of its param groups) when ``delay`` is a list."""
    from delaylab.llm.pipeline.stages import Stage
    from delaylab.optim import CombinedOptimizer, Delayed, build_optimizer

    hp, name, delays = cfg.optimizer_kwargs(), cfg.optim.optimizer, cfg.delays
    if len(delays) == 1:
        inner, per_group = build_optimizer(name, model, **hp), delays[0]
    else:
        parts, per_group = [], []
        for s, tau in enumerate(delays):  # the pipeline's stages: same names, same routing
            opt = build_optimizer(name, Stage(model, s, len(delays)), **hp)
            parts.append(opt)
            per_group += [tau] * len(opt.param_groups)
        inner = CombinedOptimizer(parts)
    d = cfg.delay
    return Delayed(
        inner, delay=per_group, corrections=d.correction, dc_lambda=d.dc_lambda, dc_lambda0=d.dc_lambda0,
        dc_ms_decay=d.dc_ms_decay, lookahead_momentum=d.lookahead_momentum, damping=d.damping, ef_dtype=d.ef_dtype,
        sync_start=d.sync_start, sync_cooldown=d.sync_cooldown, total_steps=cfg.run.steps,
    )


class Trainer:
    """Model, data, optimizer and counters of one run. ``step()`` is one call of the loop."""

    def __init__(self, cfg: Config, dataset=None):
        self.cfg = cfg = cfg.resolved("simulator")
        r, d = cfg.run, cfg.data
        if r.threads:
            torch.set_num_threads(r.threads)
        self.dp = cfg.parallel.dp
        self.device = cfg.torch_device(int(os.environ.get("LOCAL_RANK", 0)) if self.dp > 1 else None)
        self.mesh = parallel.start(cfg, self.device) if self.dp > 1 else None
        self.rank = parallel.world()[0]
        self.data = dataset if dataset is not None else load_dataset(
            d.data, d.tokenizer, d.vocab_size, d.val_fraction, d.text_field
        )
        self.model_cfg = cfg.model_config(self.data.vocab_size)
        torch.manual_seed(r.seed)  # every replica builds the same initial weights
        self.model = GPT(self.model_cfg).to(device=self.device, dtype=cfg.torch_dtype())
        # What the forward calls: the model, or its DDP / FSDP2 form (the same parameters).
        self.net = parallel.wrap(self.model, cfg, self.mesh) if self.mesh is not None else self.model
        self.opt = build_delayed_optimizer(self.model, cfg)
        for g in self.opt.param_groups:
            g.setdefault("initial_lr", g["lr"])  # the peak lr (the key torch's schedulers use)
        self._set_lrs()
        self.block = self.model_cfg.block_size
        self.tokens_per_call = d.batch_size * self.block * d.grad_accum
        self.calls = 0
        self.val = self.data.val_batches(r.eval_batches, d.batch_size, self.block)

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
                x, y = self._rows(*self.data.batch(self.calls * M + j, B, self.block, seed))
                # replicas reduce their gradients once per call, on the last microbatch
                with parallel.gradient_sync(self.net, j == M - 1):
                    with autocast(self.device):
                        _, loss = self.net(x, y)
                    loss = loss / M
                    loss.backward()
                total = total + loss.detach()
        total = float(parallel.mean_over_replicas(total))  # one sync per call; every replica agrees
        if not math.isfinite(total):
            raise Diverged(f"loss is {total} at update {self.updates} (call {self.calls})")
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.calls += 1
        self._set_lrs()
        return total

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
        if self.dp == 1:
            return bool(local)
        return bool(parallel.mean_over_replicas(torch.tensor(float(local))) == 1.0)

    def _rows(self, x: torch.Tensor, y: torch.Tensor):
        """This replica's rows of a batch, on the device."""
        if self.dp > 1:
            x, y = parallel.my_rows(x, self.rank, self.dp), parallel.my_rows(y, self.rank, self.dp)
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    @torch.no_grad()
    def evaluate(self) -> float:
        self.model.eval()
        losses = []
        for x, y in self.val:
            with autocast(self.device):
                losses.append(self.net(*self._rows(x, y))[1].item())
        self.model.train()
        mean = sum(losses) / len(losses)
        return mean if self.dp == 1 else float(parallel.mean_over_replicas(torch.tensor(mean, dtype=torch.float64)))

    def state_dict(self) -> dict:
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return {
            "config": self.cfg.to_dict(), "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "calls": self.calls, "rng": rng,
        }

    def load_state_dict(self, sd: dict) -> None:
        try:
            self.model.load_state_dict(sd["model"])
            self.opt.load_state_dict(sd["optimizer"])
        except (RuntimeError, KeyError) as err:
            raise ConfigError(f"checkpoint does not fit this model/optimizer: {str(err).splitlines()[0]}") from None
        self.calls = sd["calls"]
        self._set_lrs()
        torch.set_rng_state(sd["rng"]["torch"])
        if "cuda" in sd["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(sd["rng"]["cuda"])


def load_checkpoint(path: Path) -> dict:
    """A simulator checkpoint, or a one-line error for a missing, truncated or foreign file."""
    if not path.is_file():
        raise MissingFile(f"no checkpoint to resume: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a truncated or foreign file
        raise ConfigError(f"{path}: not a delaylab checkpoint ({type(err).__name__})") from None
    if not isinstance(ckpt, dict) or "config" not in ckpt:
        raise ConfigError(f"{path}: not a delaylab checkpoint")
    return ckpt


class Checkpoints:
    """The run's checkpoint: ``ckpt.pt`` in one process, a ``torch.distributed.checkpoint`` folder
    ``ckpt/`` for data-parallel replicas (every rank saves and loads; rank 0 moves files).

    A checkpoint is "good" once a finite loss has been computed at its weights: it waits as
    ``<name>.pending`` until the next call (or the final evaluation) says so, then replaces the
    good one, which therefore always exists once written and is never a diverged state.
    """

    def __init__(self, out: Path | None, dp: int, rank: int):
        self.dp, self.moves = dp, rank == 0
        name = CHECKPOINT if dp == 1 else CHECKPOINT_DIR
        self.good = out / name if out is not None else None
        self.pending = out / (name + ".pending") if out is not None else None

    def save(self, state: dict) -> None:
        if self.pending is None:
            return
        if self.dp == 1:
            save_torch(state, self.pending)
            return
        if self.moves and self.pending.exists():  # dcp's first step waits for every rank
            shutil.rmtree(self.pending)
        parallel.save_state(state, self.pending)

    def promote(self) -> None:
        if not self.moves or self.pending is None or not self.pending.exists():
            return
        if self.dp == 1:
            os.replace(self.pending, self.good)
            return
        old = self.good.with_name(self.good.name + ".old")
        if self.good.exists():
            os.replace(self.good, old)
        os.replace(self.pending, self.good)
        shutil.rmtree(old, ignore_errors=True)

    def discard(self) -> None:
        if self.moves and self.pending is not None and self.pending.exists():
            (self.pending.unlink if self.dp == 1 else lambda: shutil.rmtree(self.pending))()

    def load(self, mesh=None) -> dict:
        if self.dp == 1:
            return load_checkpoint(self.good)
        if not self.good.is_dir():
            raise MissingFile(f"no checkpoint to resume: {self.good}")
        return parallel.load_state(self.good, mesh)


def train(cfg: Config, out: str | os.PathLike | None = None, *, resume: bool = False,
          stop_at: int | None = None, dataset=None) -> dict:
    """Run ``cfg`` and return the summary (also written to ``out/summary.json``).

    ``out=None`` keeps everything in memory. ``resume=True`` continues the checkpoint in
    ``out`` (which must come from the same config). ``stop_at=K`` ends after update ``K`` with a
    checkpoint, as an interrupted run would. Raises :class:`Diverged` on a NaN/inf loss.
    """
    cfg = cfg.resolved("simulator")
    trainer = Trainer(cfg, dataset)  # loads the data: bad data fails before anything is written
    run = RunFolder(cfg, out, writer=trainer.rank == 0, marks=(CHECKPOINT, CHECKPOINT_DIR))
    ckpts = Checkpoints(run.out, trainer.dp, trainer.rank)
    ckpt = None
    if resume:
        ckpt = ckpts.load(trainer.mesh)
        run.check_same_run(ckpt["config"])
        trainer.load_state_dict(ckpt)
        done = run.finished_summary() if trainer.updates >= cfg.run.steps else None
        if done is not None:
            return done
    elif run.writer:  # the writer checks; the others wait for it before anything is written
        run.check_new()
    parallel.barrier()

    r, steps = cfg.run, cfg.run.steps
    end = min(steps, stop_at) if stop_at is not None else steps
    run.open(ckpt["loop"] if ckpt is not None else None, initial=trainer.updates,
             desc=f"{cfg.optim.optimizer} delay {cfg.delay.delay}")
    loop_start, eval_time = time.perf_counter(), 0.0
    try:
        while trainer.updates < end:
            t0 = time.perf_counter()
            try:
                loss = trainer.step()
            except Diverged as err:
                ckpts.discard()
                raise run.diverged(err, trainer.updates, ckpts.good) from None
            run.state["train_time"] += time.perf_counter() - t0
            ckpts.promote()
            run.add_loss(loss)
            k = trainer.updates
            if not trainer.opt.updated:
                continue
            run.advance()
            final = k == steps
            if k % r.log_every == 0 or final or k % r.eval_every == 0:
                values = {"calls": trainer.calls, "tokens": trainer.calls * trainer.tokens_per_call,
                          "lr": trainer.opt.param_groups[0]["lr"], "time": run.state["train_time"]}
                if k % r.eval_every == 0 or final:
                    t_eval = time.perf_counter()
                    values["val_loss"] = trainer.evaluate()
                    eval_time += time.perf_counter() - t_eval
                    if not math.isfinite(values["val_loss"]):
                        ckpts.discard()
                        raise run.diverged(f"validation loss is {values['val_loss']} at update {k}", k, ckpts.good)
                run.record(k, **values)
            if final or k == end or (r.ckpt_every and k % r.ckpt_every == 0):
                ckpts.save({**trainer.state_dict(), "loop": run.loop_state()})
        # The last checkpoint's weights were checked by the final evaluation or, at a stop, are finite.
        if trainer.weights_finite():
            ckpts.promote()
    finally:
        run.close()
    # Wall time of this session's loop minus validation: every bit of the trainer's own work
    # (logging, checkpoints, the progress bar) counts, unlike in train_time_s.
    loop_time = time.perf_counter() - loop_start - eval_time
    tokens = trainer.calls * trainer.tokens_per_call
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
        except BaseException as err:  # noqa: BLE001 - one line from the replica that failed, then exit 1
            parallel.report_failure("replica", err)
    parallel.stop()
    return summaries


def train_replicas(jobs: list[tuple[Config, str | os.PathLike | None]] | Config, out=None, *,
                   resume: bool = False, stop_at: int | None = None):
    """Start ``parallel.dp`` processes (torch's elastic launcher, as torchrun would) and run
    :func:`train` in each: one config (``train_replicas(cfg, out, resume=..., stop_at=...)``,
    returns replica 0's summary) or several back to back in one start-up (a list of
    ``(cfg, out)``, returns their summaries; every job needs the same D). A failed replica
    raises :class:`~delaylab.llm.pipeline.launch.PipelineFailed` naming it."""
    from delaylab.llm.pipeline.launch import launch

    single = isinstance(jobs, Config)
    jobs = [(jobs, out)] if single else jobs
    jobs = [(cfg.resolved("simulator"), out) for cfg, out in jobs]
    sizes = {cfg.parallel.dp for cfg, _ in jobs}
    if len(sizes) != 1:
        raise ConfigError(f"train_replicas needs one replica count for all jobs, got {sorted(sizes)}")
    for cfg, folder in jobs:
        d = cfg.data
        load_dataset(d.data, d.tokenizer, d.vocab_size, d.val_fraction, d.text_field)  # bad data: here, once
        if folder is not None and not resume:
            RunFolder(cfg, folder, marks=(CHECKPOINT, CHECKPOINT_DIR)).check_new()
    specs = [(cfg.to_dict(), None if folder is None else str(folder), resume, stop_at) for cfg, folder in jobs]
    summaries = launch(_replicas, sizes.pop(), specs, what="data-parallel run")[0]
    if single and summaries[0]["status"] == "diverged":
        raise Diverged(summaries[0]["message"])
    return summaries[0] if single else summaries
