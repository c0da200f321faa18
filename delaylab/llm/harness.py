"""The run folder, shared by the simulator loop and the pipeline rank loop.

One :class:`RunFolder` per run owns everything around the training itself: the guard (a new
run never overwrites another), the compatibility check on resume (a checkpoint continues only
the config that made it), ``config.json``, ``metrics.jsonl`` (truncated on resume to what the
checkpoint had logged, so a resumed run's file equals an uninterrupted one's), the optional
TensorBoard / W&B mirror of the metrics, the progress bar, the training-loss window, the
summary (with the regime diagnostics of :mod:`delaylab.llm.metrics`) and the divergence stop (a
``diverged`` summary, the last good checkpoint kept).

Where the checkpoints live is the engine's business (one file for the simulator, one per
stage and step for the pipeline); the engine tells the folder which names mark a run.
"""

from __future__ import annotations

import json
from pathlib import Path

from delaylab._io import write_json
from delaylab.errors import ConfigError, Diverged, MissingExtra, MissingFile
from delaylab.llm.config import Config

CONFIG, METRICS, SUMMARY = "config.json", "metrics.jsonl", "summary.json"


class RunFolder:
    """``out`` for ``cfg`` (a resolved :class:`Config`); ``writer``: this process writes the
    files (rank 0 / the last stage); the others only read. ``marks``: names whose presence
    means the folder holds a run (the engine's checkpoint names)."""

    def __init__(self, cfg: Config, out: str | Path | None, *, writer: bool = True, marks: tuple[str, ...] = ()):
        self.cfg, self.writer = cfg, writer and out is not None
        self.out = Path(out) if out is not None else None
        self.marks = (CONFIG, SUMMARY, *marks)
        # What the loop carries across a resume (saved inside the checkpoint).
        self.state = {"window": [0.0, 0], "train_time": 0.0, "val_loss": None, "train_loss": None,
                      "metrics_bytes": 0}
        self._metrics = None
        self._sinks: list = []
        self._bar = None

    # -- guard and resume -------------------------------------------------------------------
    def check_new(self) -> None:
        if self.out is not None and any((self.out / n).exists() for n in self.marks):
            raise ConfigError(f"{self.out} already holds a run: resume it or choose another output folder")

    def check_same_run(self, saved: dict, where: Path | None = None) -> None:
        """``saved`` (a checkpoint's config) must describe this run, resumable fields aside."""
        diff = self.cfg.differences(saved)
        if diff:
            raise ConfigError(f"the checkpoint in {where or self.out} is from another config: {'; '.join(diff)}")

    def finished_summary(self) -> dict | None:
        """The summary of a run that already finished, if this folder holds one."""
        path = self.out / SUMMARY if self.out is not None else None
        if path is not None and path.is_file():
            summary = json.loads(path.read_text())
            if summary.get("status") == "finished":
                return summary
        return None

    # -- opening --------------------------------------------------------------------------------
    def open(self, loop_state: dict | None = None, *, initial: int = 0, desc: str = "") -> None:
        """Start (or, with the checkpoint's ``loop_state``, continue) the metrics and the bar."""
        from tqdm.auto import tqdm

        if loop_state is not None:
            self.state.update(loop_state)
        if self.writer:
            self.out.mkdir(parents=True, exist_ok=True)
            write_json(self.out / CONFIG, self.cfg.to_dict())
            path = self.out / METRICS
            self._metrics = open(path, "r+b" if loop_state is not None and path.is_file() else "wb")
            self._metrics.truncate(self.state["metrics_bytes"])  # lines logged after the checkpoint
            self._metrics.seek(self.state["metrics_bytes"])
            self._sinks = _open_sinks(self.cfg, self.out)
        progress = self.cfg.run.progress
        self._bar = tqdm(total=self.cfg.run.steps, initial=initial, unit="step", dynamic_ncols=True, desc=desc,
                         disable=(None if progress is None else not progress) if self.writer else True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        for sink in self._sinks:
            sink.close()
        self._sinks = []

    # -- during the run ---------------------------------------------------------------------------
    def add_loss(self, loss: float) -> None:
        self.state["window"][0] += loss
        self.state["window"][1] += 1

    def record(self, step: int, **values) -> dict:
        """A metrics line for ``step``: the mean training loss since the last line, then ``values``."""
        window = self.state["window"]
        rec = {"step": step, **values, "train_loss": window[0] / max(window[1], 1)}
        self.state["train_loss"], self.state["window"] = rec["train_loss"], [0.0, 0]
        if rec.get("val_loss") is not None:
            self.state["val_loss"] = rec["val_loss"]
        self.log(rec)
        return rec

    def log(self, rec: dict) -> None:
        if self._metrics is not None:
            self._metrics.write((json.dumps(rec) + "\n").encode())
            self._metrics.flush()
            self.state["metrics_bytes"] = self._metrics.tell()
            for sink in self._sinks:
                sink.log(rec)
        if self._bar is not None and not self._bar.disable:
            tokens_s = rec["tokens"] / max(rec.get("time", 0.0), 1e-9) if "tokens" in rec else None
            self._bar.set_postfix(loss=f"{rec['train_loss']:.3f}", **({"tok_s": f"{tokens_s:.0f}"} if tokens_s else {}))

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def loop_state(self, extra_time: float = 0.0) -> dict:
        """A copy of the loop state for a checkpoint (``extra_time``: this session's time so far)."""
        state = json.loads(json.dumps(self.state))
        state["train_time"] += extra_time
        return state

    # -- the end ------------------------------------------------------------------------------------
    def finish(self, summary: dict) -> dict:
        if self.writer and summary["status"] == "finished":
            summary = {**summary, "diagnostics": self.diagnostics()}
            write_json(self.out / SUMMARY, summary)
        return summary

    def diagnostics(self) -> dict | None:
        """The loss spike and the plateau exit after warmup (:func:`delaylab.llm.metrics.diagnostics`)
        of the metrics written so far; None where the lines carry no lr to place the warmup."""
        from delaylab.llm import metrics

        path = self.out / METRICS
        recs = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
        return metrics.diagnostics(recs) if any("lr" in r for r in recs) else None

    def diverged(self, err: Exception | str, steps: int, checkpoint: Path | None) -> Diverged:
        """The error to raise for a NaN/inf loss; writes the ``diverged`` summary."""
        cfg = self.cfg
        kept = checkpoint is not None and checkpoint.exists()
        msg = (f"{cfg.optim.optimizer} delay {cfg.delay.delay}: {err}"
               + (f"; kept the last good checkpoint {checkpoint}" if kept else ""))
        if self.writer:
            write_json(self.out / SUMMARY, {"status": "diverged", "message": msg, "val_loss": None, "steps": steps,
                                            "optimizer": cfg.optim.optimizer, "delay": cfg.delay.delay,
                                            "mode": cfg.mode, "correction": cfg.delay.correction})
        return Diverged(msg)


def summary_base(cfg: Config) -> dict:
    """The summary fields that describe the run (the same keys for every engine)."""
    return {"optimizer": cfg.optim.optimizer, "mode": cfg.mode, "correction": cfg.delay.correction,
            "delay": cfg.delay.delay, "schedule": cfg.parallel.schedule, "stages": cfg.parallel.stages,
            "dp": cfg.parallel.dp, "dp_shard": cfg.parallel.dp_shard,
            "microbatches": cfg.data.grad_accum, "lr": cfg.resolved_lr(), "momentum": cfg.optim.momentum,
            "seed": cfg.run.seed, "preset": cfg.model.preset,
            "dtype": cfg.model.dtype}


def require_folder(folder: Path) -> dict:
    """The saved config of the run in ``folder`` (for ``--resume``)."""
    saved = Path(folder) / CONFIG
    if not saved.is_file():
        raise MissingFile(f"no run to resume in {folder} ({CONFIG} missing)")
    try:
        config = json.loads(saved.read_text())
    except ValueError as err:
        raise ConfigError(f"{saved}: not a JSON config ({err})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{saved}: not a delaylab config")
    return config


# -- metric mirrors ---------------------------------------------------------------------------------
class _TensorBoard:
    def __init__(self, out: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise MissingExtra("--log tensorboard needs the tensorboard package: pip install 'delaylab[log]'") from None
        self.writer = SummaryWriter(log_dir=str(out / "tensorboard"))

    def log(self, rec: dict) -> None:
        for key, value in rec.items():
            if key != "step" and isinstance(value, (int, float)) and value is not None:
                self.writer.add_scalar(key, value, rec["step"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _WandB:
    def __init__(self, out: Path, cfg: Config):
        import os

        try:
            import wandb
        except ImportError:
            raise MissingExtra("--log wandb needs the wandb package: pip install 'delaylab[wandb]'") from None
        os.environ.setdefault("WANDB_MODE", "offline")  # no network unless the user says so
        self.run = wandb.init(project="delaylab", dir=str(out), config=cfg.to_dict(), reinit=True)

    def log(self, rec: dict) -> None:
        self.run.log({k: v for k, v in rec.items() if k != "step"}, step=rec["step"])

    def close(self) -> None:
        self.run.finish()


def _open_sinks(cfg: Config, out: Path) -> list:
    if cfg.run.log == "tensorboard":
        return [_TensorBoard(out)]
    if cfg.run.log == "wandb":
        return [_WandB(out, cfg)]
    return []
