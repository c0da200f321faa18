"""The run folder of an llm training run, shared by the simulator loop and the pipeline rank loop.

:class:`TrainFolder` is a :class:`delaylab.run_folder.RunFolder` (a subclass, not a wrapper:
it has the same files, guard and life cycle, and the engines call the base's methods on it
directly) that knows its :class:`~delaylab.llm.config.Config`. It adds the compatibility check
on resume (a checkpoint continues only the config that made it), the training-loss window
carried across a resume, the summary's regime diagnostics (:mod:`delaylab.llm.metrics`) and
the divergence stop (a ``diverged`` summary, the last good checkpoint kept); config.json, the
bar, the logger and the resume fields come from the config.

Where the checkpoints live is the engine's business; the engine tells the folder which names
mark a run.
"""

from __future__ import annotations

import json
from pathlib import Path

from delaylab._io import write_json
from delaylab.errors import ConfigError, Diverged, MissingFile
from delaylab.llm.config import Config
from delaylab.run_folder import CONFIG, METRICS, SUMMARY, RunFolder


class TrainFolder(RunFolder):
    """``out`` for ``cfg`` (a resolved :class:`Config`); ``writer`` and ``marks`` as in
    :class:`~delaylab.run_folder.RunFolder`."""

    def __init__(self, cfg: Config, out: str | Path | None, *, writer: bool = True, marks: tuple[str, ...] = ()):
        super().__init__(out, writer=writer, marks=marks)
        self.cfg = cfg
        # What the loop carries across a resume (saved inside the checkpoint).
        self.state.update({"window": [0.0, 0], "train_time": 0.0, "val_loss": None, "train_loss": None})

    def check_new(self) -> None:
        """Refuse a folder that holds a run. A config.json alone that describes this run is a run that
        never started (its launcher writes it before any process begins, :func:`~delaylab.llm.run.setup.
        claim_folder`): new, so the command that made it can run again."""
        if self.out is not None and (self.out / CONFIG).is_file() and \
                not any((self.out / n).exists() for n in self.marks if n != CONFIG):
            try:
                if not self.cfg.differences(json.loads((self.out / CONFIG).read_text())):
                    return
            except (ValueError, ConfigError):  # not a config of this run: the guard below refuses
                pass
        super().check_new()

    def finished_run(self) -> dict | None:
        """The summary of this config's run if the folder holds it finished: nothing to resume. A
        folder whose config.json is another config's is refused (one line), finished or not."""
        if self.out is not None and (self.out / CONFIG).is_file():
            self.check_same_run(require_folder(self.out))
        done = self.finished_summary()
        return done if done is not None and done.get("steps") == self.cfg.run.steps else None

    def check_same_run(self, saved: dict, where: Path | None = None) -> None:
        """``saved`` (a checkpoint's config) must describe this run, resumable fields aside."""
        diff = self.cfg.differences(saved)
        if diff:
            raise ConfigError(f"the checkpoint in {where or self.out} is from another config: {'; '.join(diff)}")

    def open(self, loop_state: dict | None = None, *, initial: int = 0, desc: str = "") -> None:
        """Start (or, with the checkpoint's ``loop_state``, continue) the metrics and the bar."""
        run, self.config = self.cfg.run, self.cfg.to_dict()
        super().open(loop_state, total=run.steps, initial=initial, desc=desc, log=run.log, unit="update",
                     progress=run.progress if self.writer else False)

    # -- during the run -------------------------------------------------------------------------
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

    def postfix(self, rec: dict) -> dict:
        tokens_s = rec["tokens"] / max(rec.get("time", 0.0), 1e-9) if "tokens" in rec else None
        return {"loss": f"{rec['train_loss']:.3f}", **({"tokens/s": f"{tokens_s:.0f}"} if tokens_s else {})}

    def loop_state(self, extra_time: float = 0.0) -> dict:
        """A copy of the loop state for a checkpoint (``extra_time``: this session's time so far)."""
        state = super().loop_state()
        state["train_time"] += extra_time
        return state

    # -- the end ----------------------------------------------------------------------------------
    def finish(self, summary: dict) -> dict:
        """A finished run's summary gets the diagnostics and is written; a stopped one is not
        (a diverged one wrote its own, :meth:`diverged`)."""
        if self.writer and summary["status"] == "finished":
            return super().finish({**summary, "diagnostics": self.diagnostics()})
        self.close()
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
            "delay": cfg.delay.delay, "delay_dist": cfg.delay.delay_dist, "schedule": cfg.parallel.schedule, "stages": cfg.parallel.stages,
            "dp": cfg.parallel.dp, "dp_shard": cfg.parallel.dp_shard,
            "microbatches": cfg.data.grad_accum, "lr": cfg.resolved_lr(), "momentum": cfg.optim.momentum,
            "seed": cfg.run.seed, "preset": cfg.model.preset,
            "dtype": cfg.model.dtype, "ns_dtype": cfg.ns_dtype()}


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
    try:
        Config.from_dict(config)
    except ConfigError as err:  # unknown fields, values of the wrong type
        raise ConfigError(f"{saved}: not a config of this delaylab version ({err})") from None
    return config
