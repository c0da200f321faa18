"""Single-process GPT training with an exact gradient-delay simulator.

Every mode goes through :class:`delaylab.optim.Delayed` (sync is ``delay=0``), so the delay,
EF and DC-ASGD live in one place. The loop is indexed by *updates*: in a delayed phase the
first ``tau`` calls only fill the queue, so ``steps`` updates take ``steps + tau`` calls (and
batches); each param group's LR follows its own update count (the pipeline engine's
per-stage schedulers do the same). Batch ``c`` is the pure function ``dataset.batch(c, ...)``
of the run's seed, which is what makes resume exact: a checkpoint holds the model, the whole
optimizer (inner state, delay queue, EF buffer, LRs), the RNG and the call counter, and
nothing else is needed to continue.

Python API: ``train(TrainConfig(...), out) -> summary``; ``Trainer`` for step-level control.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from delaylab._io import save_torch, write_json
from delaylab.llm.data import TOKENIZERS, load_dataset
from delaylab.llm.model import GPT, PRESETS, autocast, default_device, preset

MODES = ("sync", "delayed")
SCHEDULES = ("cosine", "wsd", "constant")
CHECKPOINT = "ckpt.pt"
# Fields that may differ between a checkpoint and the run that resumes it: none of them
# changes the trajectory of the weights.
RESUMABLE_CHANGES = ("threads", "ckpt_every", "progress")


class Diverged(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


@dataclass
class TrainConfig:
    # model
    preset: str = "tiny"
    n_layer: int | None = None  # None: the preset's (deeper models for the pipeline-depth runs)
    mlp: str | None = None  # None: the preset's
    tie_embeddings: bool | None = None
    dropout: float = 0.0
    # data
    data: str | list[str] = "shakespeare"
    tokenizer: str = "byte"
    vocab_size: int = 4096  # BPE only; the byte tokenizer has 256
    text_field: str = "text"
    val_fraction: float = 0.1
    batch_size: int = 32
    block_size: int | None = None  # None: the preset's context
    grad_accum: int = 1
    # optimizer and schedule
    optimizer: str = "adamw"
    lr: float | None = None  # None: delaylab.optim's default for the optimizer
    momentum: float | None = None
    weight_decay: float | None = None
    schedule: str = "cosine"
    warmup: int | None = None  # None: 5% of steps
    min_lr_ratio: float = 0.1  # cosine / WSD end at this fraction of the peak lr
    wsd_decay: float = 0.2  # WSD: fraction of steps in the final linear decay
    # delay
    mode: str = "sync"
    delay: int | list[int] = 1  # tau; a list gives one tau per pipeline stage (PipeDream-style)
    correction: str = "none"
    dc_lambda: float = 0.04
    sync_start: int = 0
    sync_cooldown: int = 0
    # run
    steps: int = 200
    seed: int = 0
    eval_every: int = 50
    eval_batches: int = 16
    log_every: int = 10
    ckpt_every: int = 100
    device: str = "auto"
    threads: int | None = None
    progress: bool | None = None  # None: a bar only on a terminal

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown TrainConfig fields: {', '.join(sorted(unknown))}")
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def delays(self) -> list[int]:
        return [self.delay] if isinstance(self.delay, int) else list(self.delay)

    def validate(self) -> "TrainConfig":
        """Raise ``ValueError`` (one line) on any bad field; return self."""
        from delaylab.optim import CORRECTIONS, OPTIMIZERS

        def choice(name, options):
            if getattr(self, name) not in options:
                raise ValueError(f"unknown {name} {getattr(self, name)!r} (choose from {', '.join(options)})")

        choice("preset", tuple(PRESETS))
        choice("optimizer", OPTIMIZERS)
        choice("mode", MODES)
        choice("correction", CORRECTIONS)
        choice("schedule", SCHEDULES)
        choice("tokenizer", TOKENIZERS)
        if self.lr is not None and not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.momentum is not None and not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        for name in ("steps", "batch_size", "grad_accum", "eval_batches", "log_every", "eval_every"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("seed", "sync_start", "sync_cooldown", "ckpt_every"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if any(not isinstance(t, int) or t < 0 for t in self.delays) or not self.delays:
            raise ValueError(f"delay must be an integer >= 0 or a list of them, got {self.delay}")
        if self.mode == "sync" and self.correction != "none":
            raise ValueError(f"correction {self.correction!r} needs --mode delayed")
        if self.sync_start + self.sync_cooldown > self.steps:
            raise ValueError("sync_start + sync_cooldown exceed steps")
        if self.n_layer is not None and int(self.n_layer) < 1:
            raise ValueError(f"n_layer must be >= 1, got {self.n_layer}")
        if len(self.delays) > 1:
            model = self.model_config(256)
            if len(self.delays) > model.n_layer:
                raise ValueError(f"{len(self.delays)} stage delays but the model has {model.n_layer} layers")
            if model.tie_embeddings:
                raise ValueError("per-stage delays need untied embeddings (tie_embeddings=False)")
        if self.warmup is not None and not 0 <= self.warmup <= self.steps:
            raise ValueError(f"warmup must be in [0, steps], got {self.warmup}")
        if not 0 <= self.min_lr_ratio <= 1 or not 0 < self.wsd_decay <= 1:
            raise ValueError("min_lr_ratio must be in [0, 1] and wsd_decay in (0, 1]")
        return self

    def model_config(self, vocab_size: int):
        over = {"vocab_size": vocab_size, "dropout": self.dropout}
        if self.n_layer is not None:
            over["n_layer"] = self.n_layer
        if self.mlp is not None:
            over["mlp"] = self.mlp
        if self.tie_embeddings is not None:
            over["tie_embeddings"] = self.tie_embeddings
        if self.block_size is not None:
            over["block_size"] = self.block_size
        return preset(self.preset, **over)

    def resolved_lr(self) -> float:
        from delaylab.optim.registry import DEFAULTS

        return self.lr if self.lr is not None else DEFAULTS[self.optimizer]["lr"]


def lr_factor(k: int, cfg: TrainConfig) -> float:
    """Multiplier of the peak lr at update ``k`` (0-based): linear warmup, then the schedule."""
    warmup = cfg.steps // 20 if cfg.warmup is None else cfg.warmup
    if k < warmup:
        return (k + 1) / warmup
    lo = cfg.min_lr_ratio
    if cfg.schedule == "constant":
        return 1.0
    if cfg.schedule == "cosine":
        progress = (k - warmup) / max(1, cfg.steps - 1 - warmup)
        return lo + (1 - lo) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    decay = max(1, round(cfg.wsd_decay * cfg.steps))  # WSD: warmup, stable, linear decay
    start = cfg.steps - decay
    return 1.0 if k < start else 1.0 - (1 - lo) * (k - start + 1) / decay


def stage_ranges(n_layer: int, n_stages: int) -> list[range]:
    """Contiguous block ranges, as even as possible; earlier stages take the remainder."""
    q, r = divmod(n_layer, n_stages)
    sizes = [q + (i < r) for i in range(n_stages)]
    starts = [sum(sizes[:i]) for i in range(n_stages)]
    return [range(s, s + n) for s, n in zip(starts, sizes)]


def build_delayed_optimizer(model: GPT, cfg: TrainConfig):
    """``Delayed(build_optimizer(...))`` for the config's mode; one inner optimizer per stage
    (with that stage's tau on each of its param groups) when ``delay`` is a list."""
    from delaylab.optim import CombinedOptimizer, Delayed, build_optimizer

    hp = dict(lr=cfg.resolved_lr(), momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    delays = cfg.delays if cfg.mode == "delayed" else [0]
    if len(delays) == 1:
        inner, per_group = build_optimizer(cfg.optimizer, model, **hp), delays[0]
    else:
        parts, per_group = [], []
        for s, (tau, layers) in enumerate(zip(delays, stage_ranges(len(model.blocks), len(delays)))):
            stage = torch.nn.Module()  # same parameter names as in the model: same routing
            stage.blocks = torch.nn.ModuleDict({str(i): model.blocks[i] for i in layers})
            if s == 0:
                stage.embed = model.embed
            if s == len(delays) - 1:
                stage.head = model.head
            opt = build_optimizer(cfg.optimizer, stage, **hp)
            parts.append(opt)
            per_group += [tau] * len(opt.param_groups)
        inner = CombinedOptimizer(parts)
    return Delayed(
        inner, delay=per_group, correction=cfg.correction, dc_lambda=cfg.dc_lambda,
        sync_start=cfg.sync_start, sync_cooldown=cfg.sync_cooldown, total_steps=cfg.steps,
    )


class Trainer:
    """Model, data, optimizer and counters of one run. ``step()`` is one call of the loop."""

    def __init__(self, cfg: TrainConfig, dataset=None):
        self.cfg = cfg.validate()
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.device = default_device() if cfg.device == "auto" else torch.device(cfg.device)
        self.data = dataset if dataset is not None else load_dataset(
            cfg.data, cfg.tokenizer, cfg.vocab_size, cfg.val_fraction, cfg.text_field
        )
        self.model_cfg = cfg.model_config(self.data.vocab_size)
        torch.manual_seed(cfg.seed)
        self.model = GPT(self.model_cfg).to(self.device)
        self.opt = build_delayed_optimizer(self.model, cfg)
        for g in self.opt.param_groups:
            g.setdefault("initial_lr", g["lr"])  # the peak lr (the key torch's schedulers use)
        self._set_lrs()
        self.block = self.model_cfg.block_size
        self.tokens_per_call = cfg.batch_size * self.block * cfg.grad_accum
        self.calls = 0
        self.val = [(x.to(self.device), y.to(self.device))
                    for x, y in self.data.val_batches(cfg.eval_batches, cfg.batch_size, self.block)]

    @property
    def updates(self) -> int:
        return self.opt.num_updates

    def step(self) -> float:
        """Forward/backward on batch ``calls`` at the current weights, then one ``opt.step()``.

        Returns the batch's loss; raises :class:`Diverged` (before stepping) if it is not finite.
        """
        cfg, total = self.cfg, 0.0
        for j in range(cfg.grad_accum):
            x, y = self.data.batch(self.calls * cfg.grad_accum + j, cfg.batch_size, self.block, cfg.seed)
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with autocast(self.device):
                _, loss = self.model(x, y)
            loss = loss / cfg.grad_accum
            loss.backward()
            total = total + loss.detach()
        total = float(total)  # one device sync per call, for the NaN check and the log
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

    @torch.no_grad()
    def evaluate(self) -> float:
        self.model.eval()
        losses = []
        for x, y in self.val:
            with autocast(self.device):
                losses.append(self.model(x, y)[1].item())
        self.model.train()
        return sum(losses) / len(losses)

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
            raise ValueError(f"checkpoint does not fit this model/optimizer: {str(err).splitlines()[0]}") from None
        self.calls = sd["calls"]
        self._set_lrs()
        torch.set_rng_state(sd["rng"]["torch"])
        if "cuda" in sd["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(sd["rng"]["cuda"])


def config_differences(a: dict, b: dict) -> list[str]:
    """Fields of two configs that would change a run (a field one lacks counts as its default)."""
    default = TrainConfig().to_dict()
    a, b = {**default, **a}, {**default, **b}
    keys = [k for k in a if k not in RESUMABLE_CHANGES and a[k] != b.get(k)]
    return [f"{k}={a[k]!r} vs {b.get(k)!r}" for k in keys]


def check_resumable(cfg: TrainConfig, out: Path) -> dict:
    """The checkpoint in ``out``, after checking it was made by this config."""
    path = out / CHECKPOINT
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint to resume: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a truncated or foreign file
        raise ValueError(f"{path}: not a delaylab checkpoint ({type(err).__name__})") from None
    if not isinstance(ckpt, dict) or "config" not in ckpt:
        raise ValueError(f"{path}: not a delaylab checkpoint")
    diff = config_differences(cfg.to_dict(), ckpt["config"])
    if diff:
        raise ValueError(f"the checkpoint in {out} is from another config: {'; '.join(diff)}")
    return ckpt


def train(cfg: TrainConfig, out: str | os.PathLike | None = None, *, resume: bool = False,
          stop_at: int | None = None, dataset=None) -> dict:
    """Run ``cfg`` and return the summary (also written to ``out/summary.json``).

    ``out=None`` keeps everything in memory. ``resume=True`` continues the checkpoint in
    ``out`` (which must come from the same config). ``stop_at=K`` ends after update ``K`` with a
    checkpoint, as an interrupted run would. Raises :class:`Diverged` on a NaN/inf loss.
    """
    from tqdm.auto import tqdm

    cfg.validate()
    out = Path(out) if out is not None else None
    ckpt = None
    if out is not None:
        if resume:
            ckpt = check_resumable(cfg, out)
        elif any((out / name).exists() for name in ("config.json", CHECKPOINT, "summary.json")):
            raise ValueError(f"{out} already holds a run: resume it or choose another output folder")
    trainer = Trainer(cfg, dataset)  # loads the data: bad data fails before anything is written
    state = {"window": [0.0, 0], "train_time": 0.0, "val_loss": None, "train_loss": None, "metrics_bytes": 0}
    if ckpt is not None:
        trainer.load_state_dict(ckpt)
        state.update(ckpt["loop"])
        if trainer.updates >= cfg.steps and (out / "summary.json").is_file():
            return json.loads((out / "summary.json").read_text())
    metrics = None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "config.json", cfg.to_dict())
        append = ckpt is not None and (out / "metrics.jsonl").is_file()
        metrics = open(out / "metrics.jsonl", "r+b" if append else "wb")
        metrics.truncate(state["metrics_bytes"])  # drop lines logged after the checkpoint
        metrics.seek(state["metrics_bytes"])
    pending = out / (CHECKPOINT + ".pending") if out is not None else None

    def log(record: dict) -> None:
        if metrics is not None:
            metrics.write((json.dumps(record) + "\n").encode())
            metrics.flush()
            state["metrics_bytes"] = metrics.tell()

    # A checkpoint is "good" once a finite loss has been computed at its weights: it waits as
    # ckpt.pt.pending until the next call (or the final evaluation) says so, then replaces ckpt.pt.
    def save_pending() -> None:
        if out is not None:
            save_torch({**trainer.state_dict(), "loop": json.loads(json.dumps(state))}, pending)

    def promote() -> None:
        if pending is not None and pending.exists():
            os.replace(pending, out / CHECKPOINT)

    def diverged(err: Exception):
        if pending is not None:
            pending.unlink(missing_ok=True)
        kept = out is not None and (out / CHECKPOINT).exists()
        msg = f"{cfg.optimizer} {cfg.mode}: {err}" + (f"; kept the last good checkpoint {out / CHECKPOINT}" if kept else "")
        if out is not None:
            write_json(out / "summary.json", {"status": "diverged", "message": msg, "val_loss": None,
                                              "steps": trainer.updates, "optimizer": cfg.optimizer,
                                              "mode": cfg.mode, "correction": cfg.correction})
        return Diverged(msg)

    bar = tqdm(total=cfg.steps, initial=trainer.updates, disable=None if cfg.progress is None else not cfg.progress,
               desc=f"{cfg.optimizer} {cfg.mode}", unit="step", dynamic_ncols=True)
    end = min(cfg.steps, stop_at) if stop_at is not None else cfg.steps
    loop_start, eval_time = time.perf_counter(), 0.0
    try:
        while trainer.updates < end:
            t0 = time.perf_counter()
            try:
                loss = trainer.step()
            except Diverged as err:
                raise diverged(err) from None
            state["train_time"] += time.perf_counter() - t0
            promote()
            state["window"][0] += loss
            state["window"][1] += 1
            k = trainer.updates
            if not trainer.opt.updated:
                continue
            bar.update(1)
            final = k == cfg.steps
            if k % cfg.log_every == 0 or final or k % cfg.eval_every == 0:
                rec = {"step": k, "calls": trainer.calls, "tokens": trainer.calls * trainer.tokens_per_call,
                       "lr": trainer.opt.param_groups[0]["lr"],
                       "train_loss": state["window"][0] / state["window"][1], "time": state["train_time"]}
                state["train_loss"] = rec["train_loss"]
                state["window"] = [0.0, 0]
                if k % cfg.eval_every == 0 or final:
                    t_eval = time.perf_counter()
                    state["val_loss"] = rec["val_loss"] = trainer.evaluate()
                    eval_time += time.perf_counter() - t_eval
                    if not math.isfinite(rec["val_loss"]):
                        raise diverged(f"validation loss is {rec['val_loss']} at update {k}")
                log(rec)
                bar.set_postfix(loss=f"{rec['train_loss']:.3f}",
                                tok_s=f"{rec['tokens'] / max(state['train_time'], 1e-9):.0f}")
            if final or k == end or (cfg.ckpt_every and k % cfg.ckpt_every == 0):
                save_pending()
        # The last checkpoint's weights were checked by the final evaluation or, at a stop, are finite.
        if all(torch.isfinite(p).all() for p in trainer.model.parameters()):
            promote()
    finally:
        bar.close()
        if metrics is not None:
            metrics.close()
    # Wall time of this session's loop minus validation: every bit of the trainer's own work
    # (logging, checkpoints, the progress bar) counts, unlike in train_time_s.
    loop_time = time.perf_counter() - loop_start - eval_time
    tokens = trainer.calls * trainer.tokens_per_call
    summary = {
        "status": "finished" if trainer.updates >= cfg.steps else "stopped",
        "val_loss": state["val_loss"], "train_loss": state["train_loss"], "steps": trainer.updates,
        "calls": trainer.calls, "tokens": tokens, "tokens_per_s": tokens / max(state["train_time"], 1e-9),
        "train_time_s": state["train_time"], "loop_time_s": loop_time, "optimizer": cfg.optimizer, "mode": cfg.mode,
        "correction": cfg.correction, "delay": cfg.delay if cfg.mode == "delayed" else 0,
        "lr": cfg.resolved_lr(), "momentum": cfg.momentum, "seed": cfg.seed, "preset": cfg.preset,
        "params": trainer.model.num_params(), "device": str(trainer.device),
    }
    if out is not None and summary["status"] == "finished":
        write_json(out / "summary.json", summary)
    return summary
